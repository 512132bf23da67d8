"""Tensor-expression compute of `resample` (see `te_ops` for the contract, `ops_resample` for the op).

Each output element is an unrolled sum of its T taps: weights[o, t] * x[..., indices[o, t], ...],
the index read from its (constant) table and clamped into the axis, so a bad table cannot read
out of bounds. The sum accumulates in the data dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

from compiler.graph.ir import TensorType
from compiler.graph.ops_util import norm_axis
from compiler.graph.te_util import Attrs, ComputeFn, Index, as_index, compute_of
from compiler.ir import expr as E
from compiler.te.math import clamp
from compiler.te.tensor import Tensor

RESAMPLE_COMPUTES: dict[str, ComputeFn] = {}


def _resample(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x, indices, weights = inputs
    axis = norm_axis("resample", int(attrs.get("axis", 0)), len(x.shape))
    size = x.shape[axis]

    def body(i: Index) -> E.Expr:
        o = i[axis]
        total: E.Expr | None = None
        for t in range(indices.shape[1]):
            at = as_index(indices[(o, E.IntImm(t))])
            term = weights[(o, E.IntImm(t))] * x[(*i[:axis], clamp(at, size), *i[axis + 1 :])]
            total = term if total is None else total + term
        assert total is not None  # the type rule asks for at least one tap
        return total

    return [compute_of(out_types[0], body, name or "resample")]


RESAMPLE_COMPUTES["resample"] = _resample

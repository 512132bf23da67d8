"""Helpers the tensor-expression computes of graph ops share (`te_ops`, `te_reductions`).

A compute function takes the node's input tensors, attributes and output types (and a name
prefix) and returns its output tensors; see `compiler.graph.te_ops` for the contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from compiler import te
from compiler.graph.ir import TensorType
from compiler.ir import expr as E
from compiler.te.tensor import IterVar, Tensor

Attrs = Mapping[str, Any]
Index = tuple[E.Expr, ...]


class ComputeFn(Protocol):
    def __call__(
        self,
        inputs: Sequence[Tensor],
        attrs: Attrs,
        out_types: Sequence[TensorType],
        name: str = ...,
    ) -> list[Tensor]: ...


def const(value: float, dtype: str) -> E.Expr:
    """`value` as a constant of `dtype` (ints for integer dtypes)."""
    if dtype in E.FLOAT_DTYPES:
        return E.FloatImm(float(value), dtype)
    return E.IntImm(int(value), dtype)


def as_index(e: E.Expr) -> E.Expr:
    """An integer value read from a tensor (gather indices, tables), as a loop index."""
    return e if e.dtype == E.INDEX_DTYPE else E.Cast(E.INDEX_DTYPE, e)


def compute_of(out: TensorType, body: Callable[[Index], E.Expr], name: str) -> Tensor:
    """A tensor of type `out` whose element at index i is `body(i)`."""
    return te.compute(out.shape, lambda *i: body(tuple(i)), name=name)


def broadcast_load(t: Tensor, index: Sequence[E.Expr]) -> E.Expr:
    """`t` read at `index` of a broadcast result: `t`'s axes align right, size-1 axes read 0."""
    skip = len(index) - len(t.shape)
    return t[tuple(E.IntImm(0) if d == 1 else index[skip + a] for a, d in enumerate(t.shape))]


def reduce_axes(op: str, axes: Sequence[int], shape: tuple[int, ...]) -> list[IterVar]:
    """One reduction axis per axis of `axes`, over that axis of `shape`."""
    return [te.reduce_axis((0, shape[a]), name=f"{op}_k{a}") for a in axes]


def float_attr(attrs: Attrs, key: str, default: float) -> float:
    """Attribute `key` as a float; `default` when absent or None."""
    value = attrs.get(key, default)
    return default if value is None else float(value)

"""The graph op `resample`: a weighted sum of static taps along one axis (ONNX Resize's steps).

`resample(x, indices, weights; axis)` with indices [out, T] (integers in [0, x.shape[axis])) and
weights [out, T] (x's float dtype):

    y[..., o, ...] = sum_t weights[o, t] * x[..., indices[o, t], ...]

so y has x's shape with `out` on `axis`. The front end computes the taps of each output
position at import (linear: 2, cubic: 4, antialiased: a wider filter) and resizes one axis
per node; a nearest resize is a `gather` instead. INJECTIVE: each output reads T inputs, so it
fuses and inlines like a gather.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compiler.graph.ir import TensorType
from compiler.graph.ops_util import expect_float, expect_inputs, expect_rank, fail, norm_axis
from compiler.graph.registry import Category, OpDef, register

Attrs = Mapping[str, Any]
OP = "resample"


def _resample_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs(OP, inputs, 3)
    x, indices, weights = inputs
    expect_float(OP, "data", x)
    if not x.shape:
        raise fail(OP, "data must have rank >= 1")
    expect_rank(OP, "indices", indices, 2)
    expect_rank(OP, "weights", weights, 2)
    if not np.issubdtype(np.dtype(indices.dtype), np.integer):
        raise fail(OP, f"indices must be integers, got {indices.dtype}")
    if weights.shape != indices.shape:
        raise fail(
            OP, f"weights {list(weights.shape)} and indices {list(indices.shape)} must match"
        )
    if weights.dtype != x.dtype:
        raise fail(OP, f"weights dtype {weights.dtype} must be the data's ({x.dtype})")
    if indices.shape[1] < 1:
        raise fail(OP, "needs at least one tap per output position")
    axis = norm_axis(OP, int(attrs.get("axis", 0)), len(x.shape))
    shape = list(x.shape)
    shape[axis] = indices.shape[0]
    return [TensorType(tuple(shape), x.dtype)]


def _resample_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, indices, weights = inputs
    axis = norm_axis(OP, int(attrs.get("axis", 0)), x.ndim)
    if indices.size and (indices.min() < 0 or indices.max() >= x.shape[axis]):
        raise fail(OP, f"an index is outside [0, {x.shape[axis]}) on axis {axis}")
    taps = np.take(x.astype(np.float64), indices, axis=axis)  # [..., out, T, ...]
    shape = [1] * x.ndim
    shape[axis] = indices.shape[0]
    shape.insert(axis + 1, indices.shape[1])
    y = np.sum(taps * weights.astype(np.float64).reshape(shape), axis=axis + 1)
    return [y.astype(x.dtype)]


register(
    OpDef(
        OP,
        Category.INJECTIVE,
        _resample_infer,
        _resample_reference,
        doc="Weighted sum of static taps along one axis: y[.., o, ..] = sum_t w[o,t] x[.., i[o,t], ..].",
    )
)

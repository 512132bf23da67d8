"""The reductions over axes (REDUCTION): `reduce_sum`, `reduce_mean`, `reduce_max`, `reduce_min`
and `reduce_prod`, each with attributes `axes` (empty: every axis) and `keepdims`.

Over an empty set (a reduced axis of size 0) each gives what ONNX defines: the sum 0, the product
1, the max the lowest value of the dtype (-inf for floats, False for bool), the min the highest
(inf, True); the mean of nothing is NaN (floats only). `reduce_max` and `reduce_min` take bool
data (any / all); the others take numbers only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from compiler.graph.ir import TensorType
from compiler.graph.ops_util import expect_inputs, fail, norm_axis
from compiler.graph.registry import Category, InferFn, OpDef, ReferenceFn, register

Attrs = Mapping[str, Any]
REDUCTIONS = ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod")
_TAKE_BOOL = ("reduce_max", "reduce_min")


def reduce_axes_of(op: str, attrs: Attrs, rank: int) -> tuple[int, ...]:
    """The sorted axes a reduction reduces (every axis when `axes` is empty or absent)."""
    value = attrs.get("axes") or ()
    try:
        axes = tuple(int(a) for a in value)
    except (TypeError, ValueError):
        raise fail(op, f"attribute axes={value!r} must be a tuple of ints") from None
    norm = tuple(sorted({norm_axis(op, a, rank) for a in axes}))
    if len(norm) != len(axes):
        raise fail(op, f"axes {list(axes)} repeat an axis")
    return norm or tuple(range(rank))


def reduction_identity(op: str, dtype: str) -> Any:
    """The value `op` gives over an empty set of `dtype` data (ONNX's definition)."""
    dt = np.dtype(dtype)
    if op == "reduce_sum":
        return dt.type(0)
    if op == "reduce_prod":
        return dt.type(1)
    if op == "reduce_mean":
        if dt.kind != "f":
            raise fail(op, f"the mean of an empty set of {dtype} data is undefined")
        return dt.type(np.nan)
    high = op == "reduce_min"
    if dt.kind == "b":
        return np.bool_(high)
    if dt.kind == "f":
        return dt.type(np.inf if high else -np.inf)
    info = np.iinfo(dt)
    return dt.type(info.max if high else info.min)


def _infer(op: str) -> InferFn:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        expect_inputs(op, inputs, 1)
        x = inputs[0]
        if x.dtype == "bool" and op not in _TAKE_BOOL:
            raise fail(op, "bool data is not supported (only reduce_max and reduce_min take it)")
        axes = reduce_axes_of(op, attrs, len(x.shape))
        keep = bool(attrs.get("keepdims", True))
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
        return [TensorType(shape, x.dtype)]

    return infer


_NUMPY: dict[str, Callable[..., Any]] = {
    "reduce_sum": np.sum,
    "reduce_mean": np.mean,
    "reduce_prod": np.prod,
    "reduce_max": np.max,
    "reduce_min": np.min,
}


def _reference(op: str) -> ReferenceFn:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x = inputs[0]
        axes = reduce_axes_of(op, attrs, x.ndim)
        keep = bool(attrs.get("keepdims", True))
        if any(x.shape[a] == 0 for a in axes):
            (t,) = _infer(op)([TensorType(x.shape, str(x.dtype))], attrs)
            return [np.full(t.shape, reduction_identity(op, str(x.dtype)), x.dtype)]
        if op in _TAKE_BOOL:
            y = _NUMPY[op](x, axis=axes, keepdims=keep)
        else:  # floats accumulate in float64; ints wrap as the cast back makes them
            acc = np.float64 if np.issubdtype(x.dtype, np.floating) else None
            y = _NUMPY[op](x, axis=axes, keepdims=keep, dtype=acc)
        return [np.asarray(y).astype(x.dtype)]

    return reference


for _op in REDUCTIONS:
    register(
        OpDef(
            _op,
            Category.REDUCTION,
            _infer(_op),
            _reference(_op),
            template="reduce_sum" if _op == "reduce_sum" else None,
            doc=f"{_op.removeprefix('reduce_')} over axes",
        )
    )

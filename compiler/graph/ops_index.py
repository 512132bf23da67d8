"""Graph ops that pick, rank or place elements by their index along an axis.

REDUCTION (each output element looks along a whole axis of its input):
- `argmax` / `argmin(axis, keepdims, select_last_index)`: int64 position of the largest /
  smallest element along `axis`, the first one (or the last with `select_last_index`); a NaN
  counts as the extreme, as numpy's argmax finds it.
- `topk(k, axis, largest, sorted)`: two outputs, the `k` largest (or smallest) values along
  `axis` in order and their int64 positions; equal values keep their order (the lower index
  first) and NaN sorts above every number. `sorted=0` leaves the order open in ONNX, so the
  sorted order is a conformant answer for it too.
- `hardmax(axis)`: 1 at the first largest element along `axis`, 0 elsewhere (float data).
- `cumsum(axis, exclusive, reverse)`: running sums along `axis` (ONNX CumSum).

INJECTIVE (each output element reads one element, found by its own index):
- `trilu(upper, k)`: the upper (j - i >= k) or lower (j - i <= k) triangle of the last two
  axes, zeros elsewhere (ONNX Trilu).
- `one_hot(depth, axis)` of (indices, values): `values[1]` where the index (negative ones
  counted from `depth`) equals the position along the new axis `axis`, `values[0]` elsewhere;
  an index outside [-depth, depth) gives a row of `values[0]` (ONNX OneHot).
- `gather_elements(axis)` of (data, indices): out[i] = data[i with i[axis] := indices[i]]; the
  indices have data's rank and may be negative (ONNX GatherElements).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compiler.graph.ir import TensorType
from compiler.graph.ops_util import expect_float, expect_inputs, fail, int_attr, norm_axis
from compiler.graph.registry import Category, InferFn, OpDef, ReferenceFn, register

Attrs = Mapping[str, Any]


def is_number(dtype: str) -> bool:
    """Whether `dtype` is an integer or float dtype kernels compute with (not bool, bfloat16)."""
    return np.dtype(dtype).kind in "iuf"


def _expect_number(op: str, what: str, t: TensorType, allow_bool: bool = False) -> None:
    if not (is_number(t.dtype) or (allow_bool and t.dtype == "bool")):
        kinds = "a number or bool" if allow_bool else "a number"
        raise fail(op, f"{what} must be {kinds} tensor, got {t.dtype}")


def _flag(op: str, attrs: Attrs, name: str, default: int) -> bool:
    value = int_attr(op, attrs, name, default)
    if value not in (0, 1):
        raise fail(op, f"attribute {name}={value} must be 0 or 1")
    return bool(value)


def _data_axis(op: str, x: TensorType, attrs: Attrs, default: int) -> int:
    if not x.shape:
        raise fail(op, "data must have rank >= 1")
    return norm_axis(op, int_attr(op, attrs, "axis", default), len(x.shape))


# -- argmax / argmin ------------------------------------------------------------------------------


def _arg_infer(op: str) -> InferFn:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        expect_inputs(op, inputs, 1)
        x = inputs[0]
        _expect_number(op, "data", x)
        axis = _data_axis(op, x, attrs, 0)
        _flag(op, attrs, "select_last_index", 0)
        keep = _flag(op, attrs, "keepdims", 1)
        shape = tuple(1 if a == axis else d for a, d in enumerate(x.shape) if keep or a != axis)
        return [TensorType(shape, "int64")]

    return infer


def _arg_reference(op: str) -> ReferenceFn:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x = inputs[0]
        axis = norm_axis(op, int(attrs.get("axis", 0)), x.ndim)
        find = np.argmax if op == "argmax" else np.argmin
        if attrs.get("select_last_index", 0):
            pos = x.shape[axis] - 1 - find(np.flip(x, axis), axis=axis)
        else:
            pos = find(x, axis=axis)
        if attrs.get("keepdims", 1):
            pos = np.expand_dims(pos, axis)
        return [np.asarray(pos, np.int64)]

    return reference


# -- topk -----------------------------------------------------------------------------------------


def _topk_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "topk"
    expect_inputs(op, inputs, 1)
    x = inputs[0]
    _expect_number(op, "data", x)
    axis = _data_axis(op, x, attrs, -1)
    k = int_attr(op, attrs, "k")
    if not 0 <= k <= x.shape[axis]:
        raise fail(op, f"k={k} must be in [0, {x.shape[axis]}] (the size of axis {axis})")
    _flag(op, attrs, "largest", 1)
    _flag(op, attrs, "sorted", 1)
    shape = (*x.shape[:axis], k, *x.shape[axis + 1 :])
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


def topk_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Positions along `axis` from the first to the last element of TopK's order: largest (or
    smallest) first, NaN above every number, equal values by position."""
    if not largest:
        return np.argsort(x, axis=axis, kind="stable")
    # A stable ascending sort of the reversed axis, read backwards: descending, and equal values
    # (reversed twice) in their original order.
    n = x.shape[axis]
    return n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)


def _topk_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    axis = norm_axis("topk", int(attrs.get("axis", -1)), x.ndim)
    order = topk_order(x, axis, bool(attrs.get("largest", 1)))
    first = np.take(order, np.arange(int(attrs["k"])), axis=axis)
    return [np.take_along_axis(x, first, axis=axis), first.astype(np.int64)]


# -- hardmax --------------------------------------------------------------------------------------


def _hardmax_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("hardmax", inputs, 1)
    x = inputs[0]
    expect_float("hardmax", "data", x)
    _data_axis("hardmax", x, attrs, -1)
    return [x]


def _hardmax_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    axis = norm_axis("hardmax", int(attrs.get("axis", -1)), x.ndim)
    y = np.zeros_like(x)
    np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=axis), axis), 1, axis=axis)
    return [y]


# -- cumsum ---------------------------------------------------------------------------------------


def _cumsum_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("cumsum", inputs, 1)
    x = inputs[0]
    _expect_number("cumsum", "data", x)
    _data_axis("cumsum", x, attrs, 0)
    _flag("cumsum", attrs, "exclusive", 0)
    _flag("cumsum", attrs, "reverse", 0)
    return [x]


def _cumsum_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    axis = norm_axis("cumsum", int(attrs.get("axis", 0)), x.ndim)
    reverse = bool(attrs.get("reverse", 0))
    y = np.flip(x, axis) if reverse else x
    sums = np.cumsum(y, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive", 0):  # each sum moves one place on; the first is 0
        before = np.zeros_like(sums)
        inner = [slice(None)] * x.ndim
        inner[axis] = slice(1, None)
        outer = [slice(None)] * x.ndim
        outer[axis] = slice(0, -1)
        before[tuple(inner)] = sums[tuple(outer)]
        sums = before
    return [np.ascontiguousarray(np.flip(sums, axis) if reverse else sums)]


# -- trilu ----------------------------------------------------------------------------------------


def _trilu_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("trilu", inputs, 1)
    x = inputs[0]
    _expect_number("trilu", "data", x, allow_bool=True)
    if len(x.shape) < 2:
        raise fail("trilu", f"data must have rank >= 2, got shape {list(x.shape)}")
    int_attr("trilu", attrs, "k", 0)
    _flag("trilu", attrs, "upper", 1)
    return [x]


def _trilu_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    k = int(attrs.get("k", 0))
    keep = np.triu if attrs.get("upper", 1) else np.tril
    return [keep(x, k).astype(x.dtype)]


# -- one_hot --------------------------------------------------------------------------------------


def _one_hot_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "one_hot"
    expect_inputs(op, inputs, 2)
    indices, values = inputs
    _expect_number(op, "indices", indices)
    _expect_number(op, "values", values, allow_bool=True)
    if values.shape != (2,):
        raise fail(op, f"values must have shape [2] (off, on), got {list(values.shape)}")
    depth = int_attr(op, attrs, "depth")
    if depth < 0:
        raise fail(op, f"depth {depth} must be >= 0")
    rank = len(indices.shape) + 1
    axis = norm_axis(op, int_attr(op, attrs, "axis", -1), rank)
    shape = (*indices.shape[:axis], depth, *indices.shape[axis:])
    return [TensorType(shape, values.dtype)]


def one_hot_index_dtype(dtype: str) -> str:
    """The dtype OneHot compares indices of `dtype` in: wide enough that adding depth to a
    negative index cannot wrap (int64, uint64, float64)."""
    return {"i": "int64", "u": "uint64", "f": "float64"}[np.dtype(dtype).kind]


def _one_hot_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    indices, values = inputs
    depth = int(attrs["depth"])
    axis = norm_axis("one_hot", int(attrs.get("axis", -1)), indices.ndim + 1)
    wide = indices.astype(one_hot_index_dtype(str(indices.dtype)))
    if wide.dtype.kind != "u":
        wide = np.where(wide < 0, wide + depth, wide)
    positions = np.arange(depth).reshape((-1,) + (1,) * (indices.ndim - axis))
    hit = np.expand_dims(wide, axis) == positions
    return [np.where(hit, values[1], values[0]).astype(values.dtype)]


# -- gather_elements ------------------------------------------------------------------------------


def _gather_elements_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "gather_elements"
    expect_inputs(op, inputs, 2)
    data, indices = inputs
    _expect_number(op, "data", data, allow_bool=True)
    if indices.dtype not in ("int32", "int64"):
        raise fail(op, f"indices must be int32 or int64, got {indices.dtype}")
    axis = _data_axis(op, data, attrs, 0)
    if len(indices.shape) != len(data.shape):
        raise fail(op, f"indices {list(indices.shape)} must have data's rank {len(data.shape)}")
    wider = [a for a in range(len(data.shape)) if a != axis and indices.shape[a] > data.shape[a]]
    if wider:
        raise fail(
            op,
            f"indices {list(indices.shape)} are larger than data {list(data.shape)} on axes "
            f"{wider} (only axis {axis} may differ freely)",
        )
    return [TensorType(indices.shape, data.dtype)]


def _gather_elements_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    data, indices = inputs
    axis = norm_axis("gather_elements", int(attrs.get("axis", 0)), data.ndim)
    dim = data.shape[axis]
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise fail("gather_elements", f"an index is outside [-{dim}, {dim}) on axis {axis}")
    where: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
    where[axis] = np.where(indices < 0, indices + dim, indices)
    return [data[tuple(where)]]


for _op in (
    OpDef("argmax", Category.REDUCTION, _arg_infer("argmax"), _arg_reference("argmax"),
          doc="ONNX ArgMax"),
    OpDef("argmin", Category.REDUCTION, _arg_infer("argmin"), _arg_reference("argmin"),
          doc="ONNX ArgMin"),
    OpDef("topk", Category.REDUCTION, _topk_infer, _topk_reference, doc="ONNX TopK"),
    OpDef("hardmax", Category.REDUCTION, _hardmax_infer, _hardmax_reference, doc="ONNX Hardmax"),
    OpDef("cumsum", Category.REDUCTION, _cumsum_infer, _cumsum_reference, doc="ONNX CumSum"),
    OpDef("trilu", Category.INJECTIVE, _trilu_infer, _trilu_reference, doc="ONNX Trilu"),
    OpDef("one_hot", Category.INJECTIVE, _one_hot_infer, _one_hot_reference, doc="ONNX OneHot"),
    OpDef("gather_elements", Category.INJECTIVE, _gather_elements_infer,
          _gather_elements_reference, doc="ONNX GatherElements"),
):  # fmt: skip
    register(_op)

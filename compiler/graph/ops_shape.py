"""Graph ops that move data around (INJECTIVE); the reductions are in `ops_reduce`.

- `reshape(shape)`: a static target shape of the same size (no 0 / -1: the front end resolves
  them); `transpose(perm)`; `concat(axis)` of several inputs; `split(axis, sizes)` with one output
  per size.
- `slice(starts, ends, axes, steps)`: ONNX semantics: negative starts/ends count from the end,
  bounds are clamped, negative steps walk backwards; `axes` defaults to the first len(starts) axes,
  `steps` to ones.
- `pad(pads, mode, value)`: `pads` in ONNX order (all begins, then all ends, one per axis;
  negative values crop); mode "constant" | "reflect" | "edge" | "wrap".
- `gather(axis)` of (data, indices): indices may be negative (counted from the end). INJECTIVE
  in the registry; the fusion pass should treat a gather whose indices are not a constant as
  OPAQUE (`compiler.graph.ops.node_category` does).

Beyond the shared contract (for ONNX Expand): `expand(shape)` (numpy broadcasting of the input
against `shape`, INJECTIVE).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compiler.graph.ir import TensorType
from compiler.graph.ops_util import broadcast_shapes, expect_inputs, fail, int_attr, norm_axis
from compiler.graph.registry import Category, OpDef, register

Attrs = Mapping[str, Any]


def _ints(op: str, attrs: Attrs, name: str, default: Any = None) -> tuple[int, ...]:
    value = attrs.get(name, default)
    if value is None:
        raise fail(op, f"attribute {name!r} is required")
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise fail(op, f"attribute {name}={value!r} must be a tuple of ints") from None


# -- reshape / transpose --------------------------------------------------------------------------


def _reshape_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("reshape", inputs, 1)
    shape = _ints("reshape", attrs, "shape")
    if any(d < 0 for d in shape):
        raise fail("reshape", f"shape {list(shape)} must be static and non-negative")
    if int(np.prod(shape, dtype=np.int64)) != inputs[0].size:
        raise fail("reshape", f"cannot reshape {list(inputs[0].shape)} to {list(shape)}")
    return [TensorType(shape, inputs[0].dtype)]


def _reshape_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return [inputs[0].reshape(tuple(attrs["shape"]))]


def _transpose_perm(op: str, attrs: Attrs, rank: int) -> tuple[int, ...]:
    perm = _ints(op, attrs, "perm", tuple(reversed(range(rank))))
    if sorted(perm) != list(range(rank)):
        raise fail(op, f"perm {list(perm)} is not a permutation of {rank} axes")
    return perm


def _transpose_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("transpose", inputs, 1)
    x = inputs[0]
    perm = _transpose_perm("transpose", attrs, len(x.shape))
    return [TensorType(tuple(x.shape[p] for p in perm), x.dtype)]


def _transpose_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    return [np.transpose(x, _transpose_perm("transpose", attrs, x.ndim))]


# -- concat / split -------------------------------------------------------------------------------


def _concat_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "concat"
    if not inputs:
        raise fail(op, "needs at least one input")
    first = inputs[0]
    rank = len(first.shape)
    axis = norm_axis(op, int_attr(op, attrs, "axis"), rank)
    total = 0
    for t in inputs:
        if t.dtype != first.dtype:
            raise fail(op, f"inputs have different dtypes {first.dtype} and {t.dtype}")
        if len(t.shape) != rank or any(
            a != b for i, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if i != axis
        ):
            raise fail(op, f"shapes {list(first.shape)} and {list(t.shape)} differ off axis {axis}")
        total += t.shape[axis]
    shape = list(first.shape)
    shape[axis] = total
    return [TensorType(tuple(shape), first.dtype)]


def _concat_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return [np.concatenate(list(inputs), axis=int(attrs["axis"]))]


def _split_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "split"
    expect_inputs(op, inputs, 1)
    x = inputs[0]
    axis = norm_axis(op, int_attr(op, attrs, "axis", 0), len(x.shape))
    sizes = _ints(op, attrs, "sizes")
    if not sizes or any(s < 0 for s in sizes) or sum(sizes) != x.shape[axis]:
        raise fail(op, f"sizes {list(sizes)} must be >= 0 and add up to {x.shape[axis]}")
    out = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        out.append(TensorType(tuple(shape), x.dtype))
    return out


def _split_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    cuts = np.cumsum(attrs["sizes"])[:-1]
    return list(np.split(x, cuts, axis=int(attrs.get("axis", 0))))


# -- slice ----------------------------------------------------------------------------------------


def slice_bounds(op: str, shape: tuple[int, ...], attrs: Attrs) -> list[slice]:
    """One Python slice per axis of `shape` for ONNX Slice attributes; unsliced axes are full."""
    starts = _ints(op, attrs, "starts")
    ends = _ints(op, attrs, "ends")
    rank = len(shape)
    axes = _ints(op, attrs, "axes", range(len(starts)))
    steps = _ints(op, attrs, "steps", (1,) * len(starts))
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise fail(op, f"starts {starts}, ends {ends}, axes {axes}, steps {steps} differ in length")
    out = [slice(None)] * rank
    seen: set[int] = set()
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        a = norm_axis(op, axis, rank)
        if a in seen:
            raise fail(op, f"axis {axis} is sliced twice")
        seen.add(a)
        if step == 0:
            raise fail(op, f"step 0 on axis {axis}")
        dim = shape[a]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        out[a] = slice(start, end if end >= 0 else None, step)
    return out


def _slice_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("slice", inputs, 1)
    x = inputs[0]
    bounds = slice_bounds("slice", x.shape, attrs)
    shape = tuple(len(range(*b.indices(d))) for b, d in zip(bounds, x.shape, strict=True))
    return [TensorType(shape, x.dtype)]


def _slice_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    return [np.ascontiguousarray(x[tuple(slice_bounds("slice", x.shape, attrs))])]


# -- pad ------------------------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_params(op: str, attrs: Attrs, shape: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    pads = _ints(op, attrs, "pads")
    rank = len(shape)
    if len(pads) != 2 * rank:
        raise fail(op, f"pads {list(pads)} must have 2 x rank = {2 * rank} values")
    mode = str(attrs.get("mode", "constant"))
    if mode not in _PAD_MODES:
        raise fail(op, f"mode {mode!r} is not one of {_PAD_MODES}")
    for i, d in enumerate(shape):
        if d + pads[i] + pads[i + rank] < 0:
            raise fail(op, f"pads {list(pads)} crop axis {i} (size {d}) below zero")
        if mode == "reflect" and max(pads[i], pads[i + rank]) >= d:
            raise fail(op, f"reflect pads {list(pads)} must be smaller than axis {i} (size {d})")
        if mode in ("edge", "wrap") and d == 0 and max(pads[i], pads[i + rank]) > 0:
            raise fail(op, f"{mode} padding of empty axis {i}")
    return pads, mode


def _pad_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("pad", inputs, 1)
    x = inputs[0]
    pads, _ = _pad_params("pad", attrs, x.shape)
    rank = len(x.shape)
    shape = tuple(d + pads[i] + pads[i + rank] for i, d in enumerate(x.shape))
    return [TensorType(shape, x.dtype)]


def _pad_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    pads, mode = _pad_params("pad", attrs, x.shape)
    rank = x.ndim
    grow = [(max(pads[i], 0), max(pads[i + rank], 0)) for i in range(rank)]
    if mode == "constant":
        value = np.asarray(attrs.get("value", 0) or 0).astype(x.dtype)
        y = np.pad(x, grow, mode="constant", constant_values=value)
    elif mode == "reflect":
        y = np.pad(x, grow, mode="reflect")
    elif mode == "edge":
        y = np.pad(x, grow, mode="edge")
    else:
        y = np.pad(x, grow, mode="wrap")
    crop = tuple(slice(-min(pads[i], 0), y.shape[i] + min(pads[i + rank], 0)) for i in range(rank))
    return [np.ascontiguousarray(y[crop])]


# -- gather ---------------------------------------------------------------------------------------


def _gather_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "gather"
    expect_inputs(op, inputs, 2)
    data, indices = inputs
    if indices.dtype not in ("int32", "int64"):
        raise fail(op, f"indices must be int32 or int64, got {indices.dtype}")
    axis = norm_axis(op, int_attr(op, attrs, "axis", 0), len(data.shape))
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1 :]
    return [TensorType(shape, data.dtype)]


def _gather_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    data, indices = inputs
    axis = int(attrs.get("axis", 0)) % data.ndim
    dim = data.shape[axis]
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise fail("gather", f"an index is outside [-{dim}, {dim}) on axis {axis}")
    idx = np.where(indices < 0, indices + dim, indices)
    return [np.take(data, idx, axis=axis)]


for _op in (
    OpDef("reshape", Category.INJECTIVE, _reshape_infer, _reshape_reference, doc="static reshape"),
    OpDef("transpose", Category.INJECTIVE, _transpose_infer, _transpose_reference, doc="permute"),
    OpDef("concat", Category.INJECTIVE, _concat_infer, _concat_reference, doc="join on axis"),
    OpDef("split", Category.INJECTIVE, _split_infer, _split_reference, doc="cut on axis"),
    OpDef("slice", Category.INJECTIVE, _slice_infer, _slice_reference, doc="ONNX Slice"),
    OpDef("pad", Category.INJECTIVE, _pad_infer, _pad_reference, doc="ONNX Pad"),
    OpDef("gather", Category.INJECTIVE, _gather_infer, _gather_reference, doc="ONNX Gather"),
):
    register(_op)

# -- beyond the shared contract -------------------------------------------------------------------


def _expand_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("expand", inputs, 1)
    shape = _ints("expand", attrs, "shape")
    return [TensorType(broadcast_shapes("expand", inputs[0].shape, shape), inputs[0].dtype)]


def _expand_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    (t,) = _expand_infer([TensorType(inputs[0].shape, str(inputs[0].dtype))], attrs)
    return [np.array(np.broadcast_to(inputs[0], t.shape), order="C")]  # 0-d stays 0-d


register(
    OpDef(
        "expand",
        Category.INJECTIVE,
        _expand_infer,
        _expand_reference,
        doc="broadcast to (numpy broadcasting of the input with attribute shape)",
    )
)

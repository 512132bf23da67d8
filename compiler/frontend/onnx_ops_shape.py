"""ONNX converters for shape ops and for the nodes evaluated at import (Shape, Constant,
ConstantOfShape) or aliased (Identity, Dropout); they register into `onnx_ops.CONVERTERS`."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import numpy_helper

from compiler.frontend.onnx_context import ImportContext
from compiler.frontend.onnx_ops import converter, onnx_axis, to_ints
from compiler.graph.ir import GraphError
from compiler.graph.registry import get_op

# -- shapes ---------------------------------------------------------------------------------------


def _reshape_to(ctx: ImportContext, shape: tuple[int, ...]) -> None:
    ctx.emit("reshape", [ctx.input(0)], {"shape": tuple(int(d) for d in shape)}, bind=True)


@converter("Reshape")
def _reshape(ctx: ImportContext) -> None:
    src = ctx.input_type(0).shape
    target = ctx.const_input(1, "shape")
    if target is None:
        raise GraphError("the shape input is required")
    allow_zero = bool(int(ctx.attr("allowzero", 0)))
    dims = list(to_ints(target))
    for i, d in enumerate(dims):
        if d == 0 and not allow_zero:
            if i >= len(src):
                raise GraphError(f"shape {list(to_ints(target))} copies dim {i} of {list(src)}")
            dims[i] = src[i]
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise GraphError(f"shape {list(to_ints(target))} is not a valid Reshape shape")
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
        total = int(np.prod(src, dtype=np.int64))
        if known == 0 or total % known:
            raise GraphError(f"cannot reshape {list(src)} to {list(to_ints(target))}")
        dims[dims.index(-1)] = total // known
    _reshape_to(ctx, tuple(dims))


@converter("Flatten")
def _flatten(ctx: ImportContext) -> None:
    src = ctx.input_type(0).shape
    axis = int(ctx.attr("axis", 1))
    if not -len(src) <= axis <= len(src):
        raise GraphError(f"axis {axis} is out of range for rank {len(src)}")
    axis = axis + len(src) if axis < 0 else axis
    outer = int(np.prod(src[:axis], dtype=np.int64))
    _reshape_to(ctx, (outer, int(np.prod(src[axis:], dtype=np.int64))))


@converter("Squeeze")
def _squeeze(ctx: ImportContext) -> None:
    src = ctx.input_type(0).shape
    axes_in = ctx.const_input(1, "axes")
    if axes_in is None:
        axes = {i for i, d in enumerate(src) if d == 1}
    else:
        axes = {onnx_axis(a, len(src)) for a in to_ints(axes_in)}
    for a in sorted(axes):
        if src[a] != 1:
            raise GraphError(f"cannot squeeze axis {a} of size {src[a]} (shape {list(src)})")
    _reshape_to(ctx, tuple(d for i, d in enumerate(src) if i not in axes))


@converter("Unsqueeze")
def _unsqueeze(ctx: ImportContext) -> None:
    src = ctx.input_type(0).shape
    axes_in = ctx.const_input(1, "axes")
    if axes_in is None:
        raise GraphError("the axes input is required")
    rank = len(src) + axes_in.size
    axes = {onnx_axis(a, rank) for a in to_ints(axes_in)}
    if len(axes) != axes_in.size:
        raise GraphError(f"axes {list(to_ints(axes_in))} repeat an axis")
    rest = iter(src)
    _reshape_to(ctx, tuple(1 if i in axes else next(rest) for i in range(rank)))


@converter("Transpose")
def _transpose(ctx: ImportContext) -> None:
    rank = len(ctx.input_type(0).shape)
    perm = tuple(ctx.attr("perm", tuple(reversed(range(rank)))))
    ctx.emit("transpose", [ctx.input(0)], {"perm": perm}, bind=True)


@converter("Concat")
def _concat(ctx: ImportContext) -> None:
    inputs = [ctx.input(i) for i in range(len(ctx.node.input))]
    rank = len(ctx.type_of(inputs[0]).shape)
    axis = ctx.attr("axis")
    if axis is None:
        raise GraphError("attribute 'axis' is required")
    attrs = {"axis": onnx_axis(int(axis), rank)}
    kept = [v for v in inputs if ctx.type_of(v).size]
    if kept and len(kept) < len(inputs):  # an empty piece adds nothing (and needs no kernel)
        get_op("concat").infer([ctx.type_of(v) for v in inputs], attrs)  # still checked
        inputs = kept
    ctx.emit("concat", inputs, attrs, bind=True)


@converter("Split")
def _split(ctx: ImportContext) -> None:
    src = ctx.input_type(0).shape
    axis = onnx_axis(int(ctx.attr("axis", 0)), len(src))
    count = len(ctx.node.output)
    split = ctx.const_input(1, "split")
    if split is not None:
        sizes = to_ints(split)
    elif ctx.attr("num_outputs") is not None:
        count = int(ctx.attr("num_outputs"))
        chunk = -(-src[axis] // count)
        sizes = tuple(min(chunk, max(0, src[axis] - k * chunk)) for k in range(count))
    else:
        if src[axis] % count:
            raise GraphError(f"axis {axis} of size {src[axis]} does not split into {count}")
        sizes = (src[axis] // count,) * count
    if len(sizes) != len(ctx.node.output):
        raise GraphError(f"{len(sizes)} split sizes for {len(ctx.node.output)} outputs")
    if all(sizes) or not any(sizes):
        ctx.emit("split", [ctx.input(0)], {"axis": axis, "sizes": sizes}, bind=True)
        return
    # Empty pieces are constants; the node cuts only the others (kernels write no empty tensor).
    cut = [k for k, s in enumerate(sizes) if s]
    pieces = ctx.emit("split", [ctx.input(0)], {"axis": axis, "sizes": [sizes[k] for k in cut]})
    empty = np.zeros((*src[:axis], 0, *src[axis + 1 :]), ctx.input_type(0).dtype)
    for k, s in enumerate(sizes):
        ctx.bind(k, pieces[cut.index(k)] if s else ctx.constant(empty, "empty"))


@converter("Slice")
def _slice(ctx: ImportContext) -> None:
    rank = len(ctx.input_type(0).shape)
    starts = ctx.const_input(1, "starts")
    ends = ctx.const_input(2, "ends")
    if starts is None or ends is None:
        raise GraphError("the starts and ends inputs are required")
    axes = ctx.const_input(3, "axes")
    steps = ctx.const_input(4, "steps")
    attrs = {
        "starts": to_ints(starts),
        "ends": to_ints(ends),
        "axes": tuple(range(starts.size)) if axes is None else to_ints(axes),
        "steps": (1,) * starts.size if steps is None else to_ints(steps),
    }
    attrs["axes"] = tuple(onnx_axis(a, rank) for a in attrs["axes"])
    ctx.emit("slice", [ctx.input(0)], attrs, bind=True)


@converter("Gather")
def _gather(ctx: ImportContext) -> None:
    rank = len(ctx.input_type(0).shape)
    axis = onnx_axis(int(ctx.attr("axis", 0)), rank)
    ctx.emit("gather", [ctx.input(0), ctx.input(1)], {"axis": axis}, bind=True)


@converter("Pad")
def _pad(ctx: ImportContext) -> None:
    rank = len(ctx.input_type(0).shape)
    pads_in = ctx.const_input(1, "pads")
    if pads_in is None:
        raise GraphError("the pads input is required")
    pads = to_ints(pads_in)
    value = ctx.const_input(2, "constant_value")
    axes_in = ctx.const_input(3, "axes")
    if axes_in is not None:
        axes = [onnx_axis(a, rank) for a in to_ints(axes_in)]
        if len(pads) != 2 * len(axes):
            raise GraphError(f"pads {list(pads)} must have 2 values per axis of {axes}")
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[a + rank] = pads[k], pads[k + len(axes)]
        pads = tuple(full)
    attrs = {
        "pads": pads,
        "mode": str(ctx.attr("mode", "constant")),
        "value": 0.0 if value is None or value.size == 0 else value.reshape(-1)[0].item(),
    }
    ctx.emit("pad", [ctx.input(0)], attrs, bind=True)


_REDUCE = {
    "ReduceMean": "reduce_mean",
    "ReduceSum": "reduce_sum",
    "ReduceMax": "reduce_max",
    "ReduceMin": "reduce_min",
    "ReduceProd": "reduce_prod",
}


def reduce_attrs(ctx: ImportContext) -> dict[str, Any] | None:
    """The graph reduction's attributes of an ONNX Reduce* node (axes from the input or the
    attribute, keepdims), or None when it reduces nothing (empty axes, noop_with_empty_axes)."""
    rank = len(ctx.input_type(0).shape)
    axes_attr = ctx.attr("axes")
    axes_in = ctx.const_input(1, "axes")
    axes = to_ints(axes_in) if axes_in is not None else tuple(axes_attr or ())
    if not axes and int(ctx.attr("noop_with_empty_axes", 0)):
        return None
    return {
        "axes": tuple(sorted({onnx_axis(a, rank) for a in axes})) or tuple(range(rank)),
        "keepdims": bool(int(ctx.attr("keepdims", 1))),
    }


@converter(*_REDUCE)
def _reduce(ctx: ImportContext) -> None:
    attrs = reduce_attrs(ctx)
    if attrs is None:
        ctx.bind(0, ctx.input(0))
        return
    ctx.emit(_REDUCE[ctx.node.op_type], [ctx.input(0)], attrs, bind=True)


# -- evaluated at import --------------------------------------------------------------------------


@converter("Shape")
def _shape(ctx: ImportContext) -> None:
    shape = ctx.input_type(0).shape
    start = int(ctx.attr("start", 0))
    end = ctx.attr("end")
    dims = shape[start:] if end is None else shape[start : int(end)]
    ctx.bind(0, ctx.constant(np.asarray(dims, np.int64), "shape"))


@converter("Constant")
def _constant(ctx: ImportContext) -> None:
    attrs = {a.name for a in ctx.node.attribute}
    if "value" in attrs:
        value = numpy_helper.to_array(ctx.attr("value"))
    elif "value_float" in attrs:
        value = np.asarray(ctx.attr("value_float"), np.float32)
    elif "value_floats" in attrs:
        value = np.asarray(ctx.attr("value_floats"), np.float32)
    elif "value_int" in attrs:
        value = np.asarray(ctx.attr("value_int"), np.int64)
    elif "value_ints" in attrs:
        value = np.asarray(ctx.attr("value_ints"), np.int64)
    else:
        raise GraphError(f"constant attribute {sorted(attrs)} is not supported")
    if value.dtype.kind not in "biuf":
        raise GraphError(f"constant of dtype {value.dtype} is not supported")
    ctx.bind(0, ctx.constant(np.array(value, order="C"), "constant"))  # 0-d stays 0-d


@converter("ConstantOfShape")
def _constant_of_shape(ctx: ImportContext) -> None:
    shape = ctx.const_input(0, "shape")
    if shape is None:
        raise GraphError("the shape input is required")
    fill = ctx.attr("value")
    value = np.zeros(1, np.float32) if fill is None else numpy_helper.to_array(fill)
    dims = to_ints(shape)
    if any(d < 0 for d in dims):
        raise GraphError(f"shape {list(dims)} has a negative dim")
    ctx.bind(0, ctx.constant(np.full(dims, value.reshape(-1)[0], value.dtype), "filled"))


@converter("Identity")
def _identity(ctx: ImportContext) -> None:
    ctx.bind(0, ctx.input(0))


@converter("Dropout")
def _dropout(ctx: ImportContext) -> None:
    training = ctx.const_input(2, "training_mode")
    if training is not None and bool(training.reshape(-1)[0]):
        raise GraphError("training_mode=True is not supported (inference only)")
    x = ctx.input(0)
    ctx.bind(0, x)
    if 1 in ctx.used_outputs():
        ctx.bind(1, ctx.constant(np.ones(ctx.type_of(x).shape, np.bool_), "mask"))

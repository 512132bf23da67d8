"""ONNX converters for the ops that pick, rank or place elements by index: ArgMax, ArgMin, TopK,
Hardmax, CumSum, Trilu, OneHot and GatherElements become the graph ops of
`compiler.graph.ops_index`; EyeLike, whose value only its input's static shape decides, is
evaluated here; MeanVarianceNormalization is written as ONNX's own function body (reductions and
elementwise ops). Inputs ONNX gives as tensors but Kiln needs at build time (TopK's K, CumSum's
axis, Trilu's k, OneHot's depth) must be constants. An attribute a converter does not know is
refused, naming it, rather than ignored."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from compiler.frontend.onnx_context import ImportContext
from compiler.frontend.onnx_ops import converter, onnx_axis, to_ints
from compiler.graph.ir import GraphError


def _scalar(ctx: ImportContext, i: int, what: str) -> int | None:
    """Input `i` as one int when given (it must be a constant of one element), None otherwise."""
    value = ctx.const_input(i, what)
    if value is None:
        return None
    if value.size != 1:
        raise GraphError(f"{what} must hold one value, got shape {list(value.shape)}")
    number = value.reshape(()).item()
    if number != int(number):
        raise GraphError(f"{what} {number} must be an integer")
    return int(number)


@converter("ArgMax", "ArgMin")
def _arg(ctx: ImportContext) -> None:
    ctx.refuse_other_attrs(("axis", "keepdims", "select_last_index"))
    attrs = {
        "axis": int(ctx.attr("axis", 0)),
        "keepdims": int(ctx.attr("keepdims", 1)),
        "select_last_index": int(ctx.attr("select_last_index", 0)),
    }
    op = "argmax" if ctx.node.op_type == "ArgMax" else "argmin"
    ctx.emit(op, [ctx.input(0)], attrs, bind=True)


@converter("TopK")
def _topk(ctx: ImportContext) -> None:
    ctx.refuse_other_attrs(("axis", "largest", "sorted"))
    k = _scalar(ctx, 1, "K")
    if k is None:
        raise GraphError("input 1 (K) is required")
    attrs = {
        "k": k,
        "axis": int(ctx.attr("axis", -1)),
        "largest": int(ctx.attr("largest", 1)),
        "sorted": int(ctx.attr("sorted", 1)),
    }
    ctx.emit("topk", [ctx.input(0)], attrs, bind=True)


@converter("Hardmax")
def _hardmax(ctx: ImportContext) -> None:
    ctx.refuse_other_attrs(("axis",))
    ctx.emit("hardmax", [ctx.input(0)], {"axis": int(ctx.attr("axis", -1))}, bind=True)


@converter("CumSum")
def _cumsum(ctx: ImportContext) -> None:
    ctx.refuse_other_attrs(("exclusive", "reverse"))
    axis = _scalar(ctx, 1, "axis")
    if axis is None:
        raise GraphError("input 1 (axis) is required")
    attrs = {
        "axis": axis,
        "exclusive": int(ctx.attr("exclusive", 0)),
        "reverse": int(ctx.attr("reverse", 0)),
    }
    ctx.emit("cumsum", [ctx.input(0)], attrs, bind=True)


@converter("Trilu")
def _trilu(ctx: ImportContext) -> None:
    ctx.refuse_other_attrs(("upper",))
    k = _scalar(ctx, 1, "k")
    attrs = {"upper": int(ctx.attr("upper", 1)), "k": 0 if k is None else k}
    ctx.emit("trilu", [ctx.input(0)], attrs, bind=True)


@converter("EyeLike")
def _eye_like(ctx: ImportContext) -> None:
    """Evaluated at import: the identity-like matrix depends on the input's shape alone."""
    ctx.refuse_other_attrs(("dtype", "k"))
    shape = ctx.input_type(0).shape
    if len(shape) != 2:
        raise GraphError(f"input must be 2-D, got shape {list(shape)}")
    to = ctx.attr("dtype")
    dtype = np.dtype(ctx.input_type(0).dtype)
    if to is not None:
        if to in (TensorProto.STRING, TensorProto.BFLOAT16):
            raise GraphError(f"attribute dtype={TensorProto.DataType.Name(to)} is not supported")
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))
        except (KeyError, TypeError, ValueError):
            raise GraphError(f"attribute dtype={to} is not a supported ONNX type") from None
    if dtype.kind not in "biuf":
        raise GraphError(f"EyeLike of {dtype} is not supported")
    eye = np.eye(shape[0], shape[1], k=int(ctx.attr("k", 0)), dtype=dtype)
    ctx.bind(0, ctx.constant(eye, "eye"))


@converter("OneHot")
def _one_hot(ctx: ImportContext) -> None:
    ctx.refuse_other_attrs(("axis",))
    depth = _scalar(ctx, 1, "depth")
    if depth is None:
        raise GraphError("input 1 (depth) is required")
    attrs = {"depth": depth, "axis": int(ctx.attr("axis", -1))}
    ctx.emit("one_hot", [ctx.input(0), ctx.input(2)], attrs, bind=True)


@converter("GatherElements")
def _gather_elements(ctx: ImportContext) -> None:
    ctx.refuse_other_attrs(("axis",))
    attrs = {"axis": int(ctx.attr("axis", 0))}
    ctx.emit("gather_elements", [ctx.input(0), ctx.input(1)], attrs, bind=True)


@converter("MeanVarianceNormalization")
def _mean_variance_normalization(ctx: ImportContext) -> None:
    """(X - mean) / (sqrt(mean(X^2) - mean^2) + 1e-9) over `axes`, as ONNX's function body."""
    ctx.refuse_other_attrs(("axes",))
    x = ctx.input(0)
    xt = ctx.type_of(x)
    if xt.dtype not in ("float16", "float32", "float64"):
        raise GraphError(f"data must be a float tensor, got {xt.dtype}")
    axes = tuple(onnx_axis(a, len(xt.shape)) for a in to_ints(ctx.attr("axes", (0, 2, 3))))
    over = {"axes": axes, "keepdims": True}
    mean = ctx.emit("reduce_mean", [x], over)[0]
    mean_of_squares = ctx.emit("reduce_mean", [ctx.emit("mul", [x, x])[0]], over)[0]
    variance = ctx.emit("sub", [mean_of_squares, ctx.emit("mul", [mean, mean])[0]])[0]
    epsilon = ctx.constant(np.asarray(1e-9, xt.dtype), "epsilon")
    std = ctx.emit("add", [ctx.emit("sqrt", [variance])[0], epsilon])[0]
    ctx.emit("div", [ctx.emit("sub", [x, mean])[0], std], bind=True)

"""Converters from ONNX nodes (default domain, opset 13 and later) to graph ops.

Each converter reads `ctx.node` through `ImportContext` and emits graph ops; `CONVERTERS` maps
an ONNX op type to its converter. This module holds the registry, the layers and the
elementwise ops; `onnx_ops_shape` adds the shape ops and the nodes evaluated at import. What is
normalised, so graph ops stay simple:
- auto_pad becomes explicit (top, left, bottom, right) pads;
- Gemm with a constant B becomes `dense` (transB and alpha folded into the weight, beta * C into
  the bias); otherwise `matmul` + `mul` + `add`;
- Flatten / Squeeze / Unsqueeze / Reshape become `reshape` with a static shape;
- Shape, Constant, ConstantOfShape and any node whose inputs are all constants are evaluated
  here; Identity and Dropout (inference) become aliases;
- axes / pads / split sizes / clip bounds given as inputs (opset 13+) must be constants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from compiler.frontend.onnx_context import ImportContext
from compiler.graph.ir import GraphError
from compiler.graph.ops_nn import is_grouped_1x1

Converter = Callable[[ImportContext], None]
CONVERTERS: dict[str, Converter] = {}


def converter(*op_types: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of `op_types`."""

    def add(fn: Converter) -> Converter:
        for t in op_types:
            CONVERTERS[t] = fn
        return fn

    return add


def to_ints(value: object) -> tuple[int, ...]:
    """A constant (array or sequence) as a flat tuple of ints."""
    return tuple(int(v) for v in np.asarray(value).reshape(-1))


def onnx_axis(axis: int, rank: int) -> int:
    """`axis` in [0, rank), accepting negative axes as ONNX does."""
    if not -rank <= axis < rank:
        raise GraphError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _only_first_output(ctx: ImportContext, what: str) -> None:
    extra = [ctx.node.output[i] for i in ctx.used_outputs() if i > 0]
    if extra:
        raise GraphError(f"only the first output is supported ({what}); {extra} are used")


def _spatial_input(ctx: ImportContext) -> tuple[int, ...]:
    shape = ctx.input_type(0).shape
    if len(shape) != 4:
        raise GraphError(f"only 2-D (NCHW) data is supported, got input shape {list(shape)}")
    return shape


def _resolve_pads(
    ctx: ImportContext,
    size: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
) -> tuple[int, ...]:
    """Explicit (top, left, bottom, right) pads for the node's auto_pad / pads attributes."""
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = tuple(ctx.attr("pads", (0, 0, 0, 0)))
        if len(pads) != 4:
            raise GraphError(f"pads {list(pads)} must have 4 values for 2-D data")
        return pads
    if auto_pad == "VALID":
        return (0, 0, 0, 0)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise GraphError(f"auto_pad {auto_pad!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    begin, end = [], []
    for i in range(2):
        out = -(-size[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - size[i])
        small = total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return (begin[0], begin[1], end[0], end[1])


# -- convolutions and dense -----------------------------------------------------------------------


@converter("Conv")
def _conv(ctx: ImportContext) -> None:
    size = _spatial_input(ctx)[2:]
    ctx.const_input(1, "W")  # weights are laid out at build time: they must be known then
    w_shape = ctx.input_type(1).shape
    kernel = tuple(ctx.attr("kernel_shape", w_shape[2:]))
    if len(w_shape) != 4 or kernel != tuple(w_shape[2:]):
        raise GraphError(f"kernel_shape {list(kernel)} disagrees with weight {list(w_shape)}")
    strides = tuple(ctx.attr("strides", (1, 1)))
    dilations = tuple(ctx.attr("dilations", (1, 1)))
    attrs = {
        "strides": strides,
        "pads": _resolve_pads(ctx, size, kernel, strides, dilations),
        "dilations": dilations,
        "groups": int(ctx.attr("group", 1)),
    }
    inputs = [ctx.input(i) for i in range(3) if ctx.has_input(i)]
    groups, channels = int(ctx.attr("group", 1)), ctx.input_type(0).shape[1]
    depthwise = w_shape[1] == 1 and groups == channels == w_shape[0]
    if groups > 1 and not depthwise and not is_grouped_1x1(w_shape, attrs):
        _grouped_conv(ctx, inputs, attrs)
        return
    ctx.emit("conv2d", inputs, attrs, bind=True)


def _grouped_conv(ctx: ImportContext, inputs: list[str], attrs: dict[str, Any]) -> None:
    """A grouped convolution that is neither depthwise nor 1x1 at stride 1 (the templates'
    grouped cases), as one convolution per group over its slice of the channels, joined by
    Concat."""
    groups = int(attrs["groups"])
    weight = ctx.const_input(1, "W")
    bias = ctx.const_input(2, "B")
    assert weight is not None
    per_in = ctx.input_type(0).shape[1] // groups
    per_out = weight.shape[0] // groups
    outputs = []
    for g in range(groups):
        lo, hi = g * per_in, (g + 1) * per_in
        part = ctx.emit("slice", [inputs[0]], {"starts": (lo,), "ends": (hi,), "axes": (1,)})[0]
        rows = slice(g * per_out, (g + 1) * per_out)
        args = [part, ctx.constant(weight[rows], "w")]
        if bias is not None:
            args.append(ctx.constant(bias[rows], "b"))
        outputs.append(ctx.emit("conv2d", args, {**attrs, "groups": 1})[0])
    ctx.emit("concat", outputs, {"axis": 1}, bind=True)


@converter("ConvTranspose")
def _conv_transpose(ctx: ImportContext) -> None:
    """conv_transpose{1,2,3}d with explicit (begin..., end...) pads: from output_shape (where
    given, which may ask for more than the full output: negative end pads), auto_pad or pads."""
    x_shape, w_shape = ctx.input_type(0).shape, ctx.input_type(1).shape
    rank = len(x_shape) - 2
    if rank not in (1, 2, 3) or len(w_shape) != rank + 2:
        raise GraphError(
            f"only 1-D, 2-D and 3-D data are supported, got input shape {list(x_shape)} and "
            f"weight shape {list(w_shape)}"
        )

    def spatial(name: str, default: int) -> tuple[int, ...]:
        values = tuple(int(v) for v in ctx.attr(name, (default,) * rank))
        if len(values) != rank:
            raise GraphError(f"{name} {list(values)} must have {rank} values for {rank}-D data")
        return values

    kernel = spatial("kernel_shape", 0) if ctx.attr("kernel_shape") else tuple(w_shape[2:])
    if kernel != tuple(w_shape[2:]):
        raise GraphError(f"kernel_shape {list(kernel)} disagrees with weight {list(w_shape)}")
    strides, dilations = spatial("strides", 1), spatial("dilations", 1)
    out_pad = spatial("output_padding", 0)
    size = x_shape[2:]
    full = [
        strides[i] * (size[i] - 1) + out_pad[i] + dilations[i] * (kernel[i] - 1) + 1
        for i in range(rank)
    ]
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise GraphError(f"auto_pad {auto_pad!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    output_shape = ctx.attr("output_shape")
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = tuple(size[i] * strides[i] for i in range(rank))
    if output_shape is not None:
        output_shape = tuple(int(v) for v in output_shape)[-rank:]
        if len(output_shape) != rank:
            raise GraphError(f"output_shape {list(output_shape)} must have {rank} values")
        begin, end = [], []
        for i in range(rank):
            total = full[i] - output_shape[i]  # negative: zeros past the full output
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        pads = (*begin, *end)
    elif auto_pad == "VALID":
        pads = (0,) * (2 * rank)
    else:
        pads = tuple(int(p) for p in ctx.attr("pads", (0,) * (2 * rank)))
        if len(pads) != 2 * rank or min(pads) < 0:
            raise GraphError(f"pads {list(pads)} must be {2 * rank} values >= 0 for {rank}-D data")
    attrs = {
        "strides": strides,
        "pads": pads,
        "dilations": dilations,
        "groups": int(ctx.attr("group", 1)),
        "output_padding": out_pad,
    }
    inputs = [ctx.input(i) for i in range(3) if ctx.has_input(i)]
    if rank == 2 and attrs["groups"] == 1 and dilations == (1, 1) and inputs[1] in ctx.consts:
        _conv_transpose_as_conv(ctx, inputs, kernel, strides, pads, out_pad)
        return
    ctx.emit(f"conv_transpose{rank}d", inputs, attrs, bind=True)


def _conv_transpose_as_conv(
    ctx: ImportContext,
    inputs: list[str],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[int, ...],
    out_pad: tuple[int, ...],
) -> None:
    """A 2-D transposed convolution (groups 1, no dilation, constant weights) as an ordinary one:
    zeros inserted between the input's pixels (stride - 1 per gap: a reshape, a pad at the end of
    each new unit axis, a reshape back), padded by kernel - 1 - pad on each side (output_padding
    and an output_shape past the full output add zeros at the end; a negative pad crops), then a
    stride-1 convolution with the weight's in/out channels swapped and its taps flipped. The
    convolution is then a conv template's task, vectorized and tunable: a 64 -> 32 channel 4x4
    stride-2 layer at 32x32 took 42 ms as the direct scalar compute of conv_transpose2d."""
    x = inputs[0]
    n, c, h, w = ctx.type_of(x).shape
    sh, sw = strides
    if (sh, sw) != (1, 1):
        x = ctx.emit("reshape", [x], {"shape": (n, c, h, 1, w, 1)})[0]
        x = ctx.emit("pad", [x], {"pads": (0, 0, 0, 0, 0, 0, 0, 0, 0, sh - 1, 0, sw - 1)})[0]
        x = ctx.emit("reshape", [x], {"shape": (n, c, h * sh, w * sw)})[0]
    kh, kw = kernel
    begin = (kh - 1 - pads[0], kw - 1 - pads[1])
    # the zero-inserted input is s*(i-1)+1 long; the reshape left s-1 zeros past its end
    end = (kh - 1 - pads[2] + out_pad[0] - (sh - 1), kw - 1 - pads[3] + out_pad[1] - (sw - 1))
    x = ctx.emit("pad", [x], {"pads": (0, 0, *begin, 0, 0, *end)})[0]
    weight = ctx.consts[inputs[1]]
    flipped = np.ascontiguousarray(weight.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    args = [x, ctx.constant(flipped, "w"), *inputs[2:]]
    attrs = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "groups": 1}
    ctx.emit("conv2d", args, attrs, bind=True)


@converter("Gemm")
def _gemm(ctx: ImportContext) -> None:
    alpha = float(ctx.attr("alpha", 1.0))
    beta = float(ctx.attr("beta", 1.0))
    a = ctx.input(0)
    if int(ctx.attr("transA", 0)):
        (a,) = ctx.emit("transpose", [a], {"perm": (1, 0)})
    b = ctx.input(1)
    dtype = ctx.type_of(b).dtype
    trans_b = bool(int(ctx.attr("transB", 0)))
    c = ctx.input(2) if ctx.has_input(2) else None
    if b in ctx.consts:
        w = ctx.consts[b].T if trans_b else ctx.consts[b]
        weight = ctx.constant(np.ascontiguousarray((w * alpha).astype(dtype)), "weight")
        n = ctx.consts[weight].shape[1]
        if c is not None and c in ctx.consts:
            bias = ctx.consts[c] * beta
            if bias.size == 1 or bias.shape in ((n,), (1, n)):
                bias_name = ctx.constant(np.broadcast_to(bias.reshape(-1), (n,)).astype(dtype))
                (y,) = ctx.emit("dense", [a, weight, bias_name])
                ctx.bind(0, y)
                return
        (y,) = ctx.emit("dense", [a, weight])
    else:
        if trans_b:
            (b,) = ctx.emit("transpose", [b], {"perm": (1, 0)})
        (y,) = ctx.emit("matmul", [a, b])
        if alpha != 1.0:
            (y,) = ctx.emit("mul", [y, ctx.constant(np.asarray(alpha, dtype))])
    if c is not None:
        if beta != 1.0:
            (c,) = ctx.emit("mul", [c, ctx.constant(np.asarray(beta, dtype))])
        (y,) = ctx.emit("add", [y, c])
    ctx.bind(0, y)


@converter("MatMul")
def _matmul(ctx: ImportContext) -> None:
    """numpy's matmul: a 1-D operand is a row (first) or a column (second) vector whose added
    dimension is dropped from the result."""
    a, b = ctx.input(0), ctx.input(1)
    sa, sb = ctx.type_of(a).shape, ctx.type_of(b).shape
    if len(sa) >= 2 and len(sb) >= 2:
        ctx.emit("matmul", [a, b], bind=True)
        return
    if len(sa) == 1:
        a = ctx.emit("reshape", [a], {"shape": (1, sa[0])})[0]
    if len(sb) == 1:
        b = ctx.emit("reshape", [b], {"shape": (sb[0], 1)})[0]
    y = ctx.emit("matmul", [a, b])[0]
    shape = list(ctx.type_of(y).shape)
    if len(sb) == 1:
        shape.pop(-1)
    if len(sa) == 1:
        shape.pop(-1 if len(sb) == 1 else -2)
    ctx.emit("reshape", [y], {"shape": tuple(shape)}, bind=True)


# -- normalization, pooling, softmax --------------------------------------------------------------


@converter("BatchNormalization")
def _batch_norm(ctx: ImportContext) -> None:
    if int(ctx.attr("training_mode", 0)):
        raise GraphError("training_mode=1 is not supported (inference only)")
    _only_first_output(ctx, "inference batch norm")
    inputs = [ctx.input(i) for i in range(5)]
    ctx.emit("batch_norm", inputs, {"epsilon": float(ctx.attr("epsilon", 1e-5))}, bind=True)


@converter("LayerNormalization")
def _layer_norm(ctx: ImportContext) -> None:
    x, scale = ctx.input(0), ctx.input(1)
    if ctx.has_input(2):
        bias = ctx.input(2)
    else:
        t = ctx.type_of(scale)
        bias = ctx.constant(np.zeros(t.shape, t.dtype), "bias")
    rank = len(ctx.type_of(x).shape)
    attrs = {
        "axis": onnx_axis(int(ctx.attr("axis", -1)), rank),
        "epsilon": float(ctx.attr("epsilon", 1e-5)),
    }
    extra = [i for i in ctx.used_outputs() if i > 0]
    if extra and ctx.type_of(x).dtype != "float32":
        raise GraphError("Mean and InvStdDev outputs are supported for float32 data only")
    ctx.emit("layer_norm", [x, scale, bias], attrs, bind=True)
    if extra:
        _layer_norm_statistics(ctx, x, int(attrs["axis"]), float(attrs["epsilon"]))


def _layer_norm_statistics(ctx: ImportContext, x: str, axis: int, epsilon: float) -> None:
    """LayerNormalization's optional outputs, Mean and InvStdDev (1 / sqrt(variance + epsilon)),
    over the axes from `axis` on, kept as size-1 dimensions, from reductions and elementwise ops."""
    rank = len(ctx.type_of(x).shape)
    over = {"axes": tuple(range(axis, rank)), "keepdims": True}
    mean = ctx.emit("reduce_mean", [x], over)[0]
    centered = ctx.emit("sub", [x, mean])[0]
    variance = ctx.emit("reduce_mean", [ctx.emit("mul", [centered, centered])[0]], over)[0]
    shifted = ctx.emit("add", [variance, ctx.constant(np.asarray(epsilon, np.float32), "eps")])[0]
    inv_std = ctx.emit("reciprocal", [ctx.emit("sqrt", [shifted])[0]])[0]
    ctx.bind(1, mean)
    ctx.bind(2, inv_std)


def _pool(ctx: ImportContext, op: str) -> None:
    _only_first_output(ctx, "pool values; Indices are not")
    if len(ctx.input_type(0).shape) == 3:
        _pool_1d(ctx, op)
        return
    size = _spatial_input(ctx)[2:]
    kernel = tuple(ctx.attr("kernel_shape", ()))
    if len(kernel) != 2:
        raise GraphError(f"kernel_shape {list(kernel)} must have 2 values")
    strides = tuple(ctx.attr("strides", (1, 1)))
    dilations = tuple(ctx.attr("dilations", (1, 1)))
    attrs = {
        "kernel": kernel,
        "strides": strides,
        "pads": _resolve_pads(ctx, size, kernel, strides, dilations),
        "dilations": dilations,
        "ceil_mode": bool(int(ctx.attr("ceil_mode", 0))),
    }
    if op == "avg_pool2d":
        attrs["count_include_pad"] = bool(int(ctx.attr("count_include_pad", 0)))
    ctx.emit(op, [ctx.input(0)], attrs, bind=True)


def _pool_1d(ctx: ImportContext, op: str) -> None:
    """A pool over N x C x W data, as the 2-D pool over N x C x 1 x W."""
    n, c, w = ctx.input_type(0).shape

    def one(name: str, default: int) -> int:
        values = tuple(ctx.attr(name, (default,)))
        if len(values) != 1:
            raise GraphError(f"{name} {list(values)} must have 1 value for 1-D data")
        return int(values[0])

    kernel, stride, dilation = one("kernel_shape", 0), one("strides", 1), one("dilations", 1)
    if ctx.attr("auto_pad", "NOTSET") == "NOTSET":
        pads = tuple(ctx.attr("pads", (0, 0)))
        if len(pads) != 2:
            raise GraphError(f"pads {list(pads)} must have 2 values for 1-D data")
        pads4: tuple[int, ...] = (0, int(pads[0]), 0, int(pads[1]))
    else:
        pads4 = _resolve_pads(ctx, (1, w), (1, kernel), (1, stride), (1, dilation))
    attrs: dict[str, Any] = {
        "kernel": (1, kernel),
        "strides": (1, stride),
        "pads": pads4,
        "dilations": (1, dilation),
        "ceil_mode": bool(int(ctx.attr("ceil_mode", 0))),
    }
    if op == "avg_pool2d":
        attrs["count_include_pad"] = bool(int(ctx.attr("count_include_pad", 0)))
    x4 = ctx.emit("reshape", [ctx.input(0)], {"shape": (n, c, 1, w)})[0]
    y4 = ctx.emit(op, [x4], attrs)[0]
    out_w = ctx.type_of(y4).shape[3]
    ctx.emit("reshape", [y4], {"shape": (n, c, out_w)}, bind=True)


@converter("MaxPool")
def _max_pool(ctx: ImportContext) -> None:
    if int(ctx.attr("storage_order", 0)):
        raise GraphError("storage_order=1 is not supported")
    _pool(ctx, "max_pool2d")


@converter("AveragePool")
def _avg_pool(ctx: ImportContext) -> None:
    _pool(ctx, "avg_pool2d")


@converter("GlobalAveragePool")
def _global_avg_pool(ctx: ImportContext) -> None:
    _spatial_input(ctx)
    ctx.emit("global_avg_pool2d", [ctx.input(0)], bind=True)


@converter("Softmax")
def _softmax(ctx: ImportContext) -> None:
    rank = len(ctx.input_type(0).shape)
    axis = onnx_axis(int(ctx.attr("axis", -1)), rank)
    ctx.emit("softmax", [ctx.input(0)], {"axis": axis}, bind=True)


# -- elementwise ----------------------------------------------------------------------------------

_UNARY = {
    "Relu": "relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Erf": "erf",
    "Sqrt": "sqrt",
    "Exp": "exp",
    "Log": "log",
    "Neg": "neg",
    "HardSwish": "hard_swish",
}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}


@converter(*_UNARY)
def _unary(ctx: ImportContext) -> None:
    ctx.emit(_UNARY[ctx.node.op_type], [ctx.input(0)], bind=True)


@converter(*_BINARY)
def _binary(ctx: ImportContext) -> None:
    ctx.emit(_BINARY[ctx.node.op_type], [ctx.input(0), ctx.input(1)], bind=True)


@converter("Clip")
def _clip(ctx: ImportContext) -> None:
    bounds: dict[str, float | int | None] = {}
    for i, key in ((1, "min"), (2, "max")):
        value = ctx.const_input(i, key)
        if value is not None and value.size != 1:
            raise GraphError(f"{key} must be a scalar, got shape {list(value.shape)}")
        bounds[key] = None if value is None else value.reshape(()).item()
    ctx.emit("clip", [ctx.input(0)], bounds, bind=True)


@converter("Cast")
def _cast(ctx: ImportContext) -> None:
    to = int(ctx.attr("to"))
    try:
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(to)))
    except (KeyError, TypeError, ValueError):
        raise GraphError(f"cast to ONNX type {to} is not supported") from None
    if to in (TensorProto.STRING, TensorProto.BFLOAT16) or dtype.startswith(("|", "<U", "object")):
        raise GraphError(f"cast to {TensorProto.DataType.Name(to)} is not supported")
    ctx.emit("cast", [ctx.input(0)], {"dtype": dtype}, bind=True)


# -- beyond the list ----------------------------------------------------------------------

_PARAM_UNARY: dict[str, tuple[str, dict[str, object]]] = {
    "Abs": ("abs", {}),
    "Reciprocal": ("reciprocal", {}),
    "LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
    "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
    "Gelu": ("gelu", {"approximate": "none"}),
}
_COMPARE = {"Equal": "equal", "Less": "less", "Greater": "greater"}
_MATH_UNARY = {
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Sin": "sin",
    "Cos": "cos",
    "Tan": "tan",
    "Asin": "asin",
    "Acos": "acos",
    "Atan": "atan",
    "Sinh": "sinh",
    "Cosh": "cosh",
    "Asinh": "asinh",
    "Acosh": "acosh",
    "Atanh": "atanh",
    "IsNaN": "isnan",
    "BitwiseNot": "bitwise_not",
}
_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}
_SHIFTS = {"LEFT": "shift_left", "RIGHT": "shift_right"}


@converter(*_PARAM_UNARY)
def _param_unary(ctx: ImportContext) -> None:
    op, defaults = _PARAM_UNARY[ctx.node.op_type]
    attrs = {k: ctx.attr(k, v) for k, v in defaults.items()}
    ctx.emit(op, [ctx.input(0)], attrs, bind=True)


@converter(*_COMPARE)
def _compare(ctx: ImportContext) -> None:
    ctx.emit(_COMPARE[ctx.node.op_type], [ctx.input(0), ctx.input(1)], bind=True)


@converter("Max", "Min")
def _variadic_min_max(ctx: ImportContext) -> None:
    op = "maximum" if ctx.node.op_type == "Max" else "minimum"
    value = ctx.input(0)
    for i in range(1, len(ctx.node.input)):
        (value,) = ctx.emit(op, [value, ctx.input(i)])
    ctx.bind(0, value)


@converter("Where")
def _where(ctx: ImportContext) -> None:
    ctx.emit("where", [ctx.input(i) for i in range(3)], bind=True)


@converter("Expand")
def _expand(ctx: ImportContext) -> None:
    shape = ctx.const_input(1, "shape")
    if shape is None:
        raise GraphError("the shape input is required")
    ctx.emit("expand", [ctx.input(0)], {"shape": to_ints(shape)}, bind=True)


@converter("GlobalMaxPool")
def _global_max_pool(ctx: ImportContext) -> None:
    _spatial_input(ctx)
    ctx.emit("reduce_max", [ctx.input(0)], {"axes": (2, 3), "keepdims": True}, bind=True)


@converter("Range")
def _range(ctx: ImportContext) -> None:
    start, limit, delta = (
        ctx.const_input(i, what) for i, what in enumerate(("start", "limit", "delta"))
    )
    if start is None or limit is None or delta is None:
        raise GraphError("start, limit and delta are required")
    if delta.reshape(()).item() == 0:
        raise GraphError("delta must not be 0")
    first, stop, step = (float(v.reshape(())) for v in (start, limit, delta))
    value = np.arange(first, stop, step).astype(start.dtype)
    ctx.bind(0, ctx.constant(value, "range"))


@converter(*_MATH_UNARY)
def _math_unary(ctx: ImportContext) -> None:
    ctx.emit(_MATH_UNARY[ctx.node.op_type], [ctx.input(0)], bind=True)


@converter(*_BITWISE)
def _bitwise(ctx: ImportContext) -> None:
    ctx.emit(_BITWISE[ctx.node.op_type], [ctx.input(0), ctx.input(1)], bind=True)


@converter("IsInf")
def _isinf(ctx: ImportContext) -> None:
    attrs = {k: int(ctx.attr(k, 1)) for k in ("detect_negative", "detect_positive")}
    ctx.emit("isinf", [ctx.input(0)], attrs, bind=True)


@converter("Mod")
def _mod(ctx: ImportContext) -> None:
    ctx.emit("mod", [ctx.input(0), ctx.input(1)], {"fmod": int(ctx.attr("fmod", 0))}, bind=True)


@converter("BitShift")
def _bit_shift(ctx: ImportContext) -> None:
    direction = ctx.attr("direction")
    if direction not in _SHIFTS:
        raise GraphError(f"attribute direction={direction!r} must be 'LEFT' or 'RIGHT'")
    ctx.emit(_SHIFTS[direction], [ctx.input(0), ctx.input(1)], bind=True)

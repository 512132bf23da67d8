"""ONNX converters for ops written as a few graph ops: variadic Sum and Mean; the activations
PRelu, Elu, Selu, Celu, ThresholdedRelu, Softsign, Sign, Shrink, Softplus and Mish; LogSoftmax;
ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum and ReduceLogSumExp; the logic ops
Not, And, Or, Xor, GreaterOrEqual and LessOrEqual; InstanceNormalization and LRN; Tile,
DepthToSpace and SpaceToDepth; Size. They register into `onnx_ops.CONVERTERS`; fusion then puts
the pieces back into as few kernels as the graph allows (elementwise chains fuse)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.frontend.onnx_context import ImportContext
from compiler.frontend.onnx_ops import converter, onnx_axis, to_ints
from compiler.frontend.onnx_ops_shape import reduce_attrs
from compiler.graph.ir import GraphError


def _const(ctx: ImportContext, value: float, like: str) -> str:
    """A scalar constant of the dtype of value `like`."""
    return ctx.constant(np.asarray(value, ctx.type_of(like).dtype), "c")


def _float_input(ctx: ImportContext) -> str:
    x = ctx.input(0)
    if ctx.type_of(x).dtype not in ("float32", "float64", "float16"):
        raise GraphError(f"data must be a float tensor, got {ctx.type_of(x).dtype}")
    return x


def _one(ctx: ImportContext, op: str, inputs: Sequence[str], attrs: dict | None = None) -> str:
    return ctx.emit(op, list(inputs), attrs)[0]


def _finish(ctx: ImportContext, value: str) -> None:
    """Bind the node's output to `value`, through an identity node so that it is checked and
    named like any other output."""
    ctx.emit("identity", [value], bind=True)


# -- variadic --------------------------------------------------------------------------------------


def _inputs(ctx: ImportContext) -> list[str]:
    inputs = [ctx.input(i) for i in range(len(ctx.node.input)) if ctx.has_input(i)]
    if not inputs:
        raise GraphError("at least one input is required")
    return inputs


def _add_all(ctx: ImportContext, values: Sequence[str]) -> str:
    """values[0] + values[1] + ... (broadcasting as each add does)."""
    total = values[0]
    for x in values[1:]:
        total = _one(ctx, "add", [total, x])
    return total


@converter("Sum")
def _sum(ctx: ImportContext) -> None:
    _finish(ctx, _add_all(ctx, _inputs(ctx)))


@converter("Mean")
def _mean(ctx: ImportContext) -> None:
    inputs = _inputs(ctx)
    total = _add_all(ctx, inputs)
    _finish(ctx, _one(ctx, "div", [total, _const(ctx, len(inputs), total)]))


# -- activations -----------------------------------------------------------------------------------


def _negative_branch(ctx: ImportContext, x: str, negative: str) -> str:
    """where(x < 0, negative, x)."""
    below = _one(ctx, "less", [x, _const(ctx, 0.0, x)])
    return _one(ctx, "where", [below, negative, x])


@converter("PRelu")
def _prelu(ctx: ImportContext) -> None:
    x = _float_input(ctx)
    slope = ctx.input(1)
    _finish(ctx, _negative_branch(ctx, x, _one(ctx, "mul", [x, slope])))


def _exp_minus_one(ctx: ImportContext, x: str, alpha: float) -> str:
    """alpha * (exp(x) - 1)."""
    e = _one(ctx, "sub", [_one(ctx, "exp", [x]), _const(ctx, 1.0, x)])
    return _one(ctx, "mul", [e, _const(ctx, alpha, x)])


@converter("Elu")
def _elu(ctx: ImportContext) -> None:
    x = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.0))
    _finish(ctx, _negative_branch(ctx, x, _exp_minus_one(ctx, x, alpha)))


@converter("Selu")
def _selu(ctx: ImportContext) -> None:
    x = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    inner = _negative_branch(ctx, x, _exp_minus_one(ctx, x, alpha))
    _finish(ctx, _one(ctx, "mul", [inner, _const(ctx, gamma, x)]))


@converter("Celu")
def _celu(ctx: ImportContext) -> None:
    x = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.0))
    scaled = _one(ctx, "div", [x, _const(ctx, alpha, x)])
    _finish(ctx, _negative_branch(ctx, x, _exp_minus_one(ctx, scaled, alpha)))


@converter("ThresholdedRelu")
def _thresholded_relu(ctx: ImportContext) -> None:
    x = _float_input(ctx)
    above = _one(ctx, "greater", [x, _const(ctx, float(ctx.attr("alpha", 1.0)), x)])
    _finish(ctx, _one(ctx, "where", [above, x, _const(ctx, 0.0, x)]))


@converter("Softsign")
def _softsign(ctx: ImportContext) -> None:
    x = _float_input(ctx)
    denominator = _one(ctx, "add", [_one(ctx, "abs", [x]), _const(ctx, 1.0, x)])
    _finish(ctx, _one(ctx, "div", [x, denominator]))


@converter("Sign")
def _sign(ctx: ImportContext) -> None:
    x = ctx.input(0)
    zero, one, minus = (_const(ctx, v, x) for v in (0, 1, -1))
    negative = _one(ctx, "where", [_one(ctx, "less", [x, zero]), minus, zero])
    _finish(ctx, _one(ctx, "where", [_one(ctx, "greater", [x, zero]), one, negative]))


def _or_equal(ctx: ImportContext, strict: str) -> None:
    a, b = ctx.input(0), ctx.input(1)
    true = ctx.constant(np.asarray(True), "true")
    _finish(ctx, _one(ctx, "where", [_one(ctx, strict, [a, b]), true, _one(ctx, "equal", [a, b])]))


@converter("GreaterOrEqual")
def _greater_or_equal(ctx: ImportContext) -> None:
    _or_equal(ctx, "greater")


@converter("LessOrEqual")
def _less_or_equal(ctx: ImportContext) -> None:
    _or_equal(ctx, "less")


# -- normalization ---------------------------------------------------------------------------------


@converter("InstanceNormalization")
def _instance_norm(ctx: ImportContext) -> None:
    """(x - mean) / sqrt(var + epsilon) * scale[c] + bias[c], mean and var over the spatial axes."""
    x = _float_input(ctx)
    shape = ctx.type_of(x).shape
    if len(shape) < 3:
        raise GraphError(f"data must be N x C x D1 ..., got shape {list(shape)}")
    over = {"axes": tuple(range(2, len(shape))), "keepdims": True}
    mean = _one(ctx, "reduce_mean", [x], over)
    centered = _one(ctx, "sub", [x, mean])
    variance = _one(ctx, "reduce_mean", [_one(ctx, "mul", [centered, centered])], over)
    epsilon = float(ctx.attr("epsilon", 1e-5))
    inv = _one(
        ctx,
        "reciprocal",
        [_one(ctx, "sqrt", [_one(ctx, "add", [variance, _const(ctx, epsilon, x)])])],
    )
    per_channel = (shape[1],) + (1,) * (len(shape) - 2)
    scale = _one(ctx, "reshape", [ctx.input(1)], {"shape": per_channel})
    bias = _one(ctx, "reshape", [ctx.input(2)], {"shape": per_channel})
    normalized = _one(ctx, "mul", [centered, _one(ctx, "mul", [inv, scale])])
    _finish(ctx, _one(ctx, "add", [normalized, bias]))


@converter("LRN")
def _lrn(ctx: ImportContext) -> None:
    """x / (bias + alpha / size * sum of x^2 over `size` neighbouring channels) ^ beta."""
    x = _float_input(ctx)
    shape = ctx.type_of(x).shape
    if len(shape) < 3:
        raise GraphError(f"data must be N x C x D1 ..., got shape {list(shape)}")
    size = int(ctx.attr("size", 0))
    if size < 1:
        raise GraphError(f"size must be a positive integer, got {size}")
    alpha = float(ctx.attr("alpha", 1e-4))
    beta = float(ctx.attr("beta", 0.75))
    bias = float(ctx.attr("bias", 1.0))
    rank, channels = len(shape), shape[1]
    squared = _one(ctx, "mul", [x, x])
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    pads = [0] * (2 * rank)
    pads[1], pads[1 + rank] = before, after
    padded = _one(ctx, "pad", [squared], {"pads": tuple(pads), "mode": "constant", "value": 0.0})
    windows = [
        _one(ctx, "slice", [padded], {"starts": (i,), "ends": (i + channels,), "axes": (1,)})
        for i in range(size)
    ]
    total = _add_all(ctx, windows)
    scaled = _one(ctx, "mul", [total, _const(ctx, alpha / size, x)])
    base = _one(ctx, "add", [scaled, _const(ctx, bias, x)])
    _finish(ctx, _one(ctx, "div", [x, _one(ctx, "pow", [base, _const(ctx, beta, x)])]))


# -- data movement ---------------------------------------------------------------------------------


@converter("Tile")
def _tile(ctx: ImportContext) -> None:
    x = ctx.input(0)
    repeats_in = ctx.const_input(1, "repeats")
    if repeats_in is None:
        raise GraphError("the repeats input is required")
    repeats = to_ints(repeats_in)
    rank = len(ctx.type_of(x).shape)
    if len(repeats) != rank or any(r < 1 for r in repeats):
        raise GraphError(f"repeats {list(repeats)} must be {rank} positive integers")
    value = x
    for axis, r in enumerate(repeats):
        if r > 1:
            value = _one(ctx, "concat", [value] * r, {"axis": axis})
    _finish(ctx, value)


# -- with log ----------------------------------------------------------------------------------------


def _softplus_of(ctx: ImportContext, x: str) -> str:
    return _one(ctx, "log", [_one(ctx, "add", [_one(ctx, "exp", [x]), _const(ctx, 1.0, x)])])


@converter("Softplus")
def _softplus(ctx: ImportContext) -> None:
    _finish(ctx, _softplus_of(ctx, _float_input(ctx)))


@converter("Mish")
def _mish(ctx: ImportContext) -> None:
    x = _float_input(ctx)
    _finish(ctx, _one(ctx, "mul", [x, _one(ctx, "tanh", [_softplus_of(ctx, x)])]))


@converter("LogSoftmax")
def _log_softmax(ctx: ImportContext) -> None:
    """x - max - log(sum(exp(x - max))) over `axis`."""
    x = _float_input(ctx)
    rank = len(ctx.type_of(x).shape)
    over = {"axes": (onnx_axis(int(ctx.attr("axis", -1)), rank),), "keepdims": True}
    shifted = _one(ctx, "sub", [x, _one(ctx, "reduce_max", [x], over)])
    total = _one(ctx, "reduce_sum", [_one(ctx, "exp", [shifted])], over)
    _finish(ctx, _one(ctx, "sub", [shifted, _one(ctx, "log", [total])]))


def _reduction(ctx: ImportContext, before: str | None, op: str, after: str | None) -> None:
    """after(op(before(x))) over the node's axes; the identity when it reduces nothing."""
    attrs = reduce_attrs(ctx)
    x = ctx.input(0)
    if attrs is None:
        _finish(ctx, x)
        return
    if before == "square":
        x = _one(ctx, "mul", [x, x])
    elif before is not None:
        x = _one(ctx, before, [x])
    y = _one(ctx, op, [x], attrs)
    _finish(ctx, _one(ctx, after, [y]) if after is not None else y)


@converter("ReduceL1")
def _reduce_l1(ctx: ImportContext) -> None:
    _reduction(ctx, "abs", "reduce_sum", None)


@converter("ReduceL2")
def _reduce_l2(ctx: ImportContext) -> None:
    _reduction(ctx, "square", "reduce_sum", "sqrt")


@converter("ReduceSumSquare")
def _reduce_sum_square(ctx: ImportContext) -> None:
    _reduction(ctx, "square", "reduce_sum", None)


@converter("ReduceLogSum")
def _reduce_log_sum(ctx: ImportContext) -> None:
    _reduction(ctx, None, "reduce_sum", "log")


@converter("ReduceLogSumExp")
def _reduce_log_sum_exp(ctx: ImportContext) -> None:
    _reduction(ctx, "exp", "reduce_sum", "log")


# -- logic ---------------------------------------------------------------------------------------------


def _bools(ctx: ImportContext, n: int) -> list[str]:
    values = [ctx.input(i) for i in range(n)]
    for v in values:
        if ctx.type_of(v).dtype != "bool":
            raise GraphError(f"inputs must be bool tensors, got {ctx.type_of(v).dtype}")
    return values


def _bool_const(ctx: ImportContext, value: bool) -> str:
    return ctx.constant(np.asarray(value), "true" if value else "false")


@converter("Not")
def _not(ctx: ImportContext) -> None:
    (a,) = _bools(ctx, 1)
    _finish(ctx, _one(ctx, "equal", [a, _bool_const(ctx, False)]))


@converter("And")
def _and(ctx: ImportContext) -> None:
    a, b = _bools(ctx, 2)
    _finish(ctx, _one(ctx, "where", [a, b, _bool_const(ctx, False)]))


@converter("Or")
def _or(ctx: ImportContext) -> None:
    a, b = _bools(ctx, 2)
    _finish(ctx, _one(ctx, "where", [a, _bool_const(ctx, True), b]))


@converter("Xor")
def _xor(ctx: ImportContext) -> None:
    a, b = _bools(ctx, 2)
    same = _one(ctx, "equal", [a, b])
    _finish(ctx, _one(ctx, "equal", [same, _bool_const(ctx, False)]))


@converter("Shrink")
def _shrink(ctx: ImportContext) -> None:
    x = ctx.input(0)
    lambd, bias = float(ctx.attr("lambd", 0.5)), float(ctx.attr("bias", 0.0))
    low = _one(ctx, "less", [x, _const(ctx, -lambd, x)])
    high = _one(ctx, "greater", [x, _const(ctx, lambd, x)])
    up = _one(ctx, "add", [x, _const(ctx, bias, x)])
    down = _one(ctx, "sub", [x, _const(ctx, bias, x)])
    inner = _one(ctx, "where", [high, down, _const(ctx, 0, x)])
    _finish(ctx, _one(ctx, "where", [low, up, inner]))


# -- rearrangement -------------------------------------------------------------------------------------


def _blocks_input(ctx: ImportContext) -> tuple[str, tuple[int, ...], int]:
    """DepthToSpace's and SpaceToDepth's data (N x C x H x W), its shape, and the blocksize."""
    x = ctx.input(0)
    shape = ctx.type_of(x).shape
    if len(shape) != 4:
        raise GraphError(f"data must be N x C x H x W, got shape {list(shape)}")
    return x, shape, int(ctx.attr("blocksize", 0))


@converter("DepthToSpace")
def _depth_to_space(ctx: ImportContext) -> None:
    x, (n, c, h, w), b = _blocks_input(ctx)
    if b < 1 or c % (b * b):
        raise GraphError(f"blocksize {b} must divide the {c} channels twice")
    if str(ctx.attr("mode", "DCR")) == "DCR":
        split, perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
    else:  # CRD
        split, perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
    blocks = _one(ctx, "reshape", [x], {"shape": split})
    moved = _one(ctx, "transpose", [blocks], {"perm": perm})
    _finish(ctx, _one(ctx, "reshape", [moved], {"shape": (n, c // (b * b), h * b, w * b)}))


@converter("SpaceToDepth")
def _space_to_depth(ctx: ImportContext) -> None:
    x, (n, c, h, w), b = _blocks_input(ctx)
    if b < 1 or h % b or w % b:
        raise GraphError(f"blocksize {b} must divide height {h} and width {w}")
    mode = str(ctx.attr("mode", "DCR"))
    if mode not in ("DCR", "CRD"):
        raise GraphError(f"mode {mode!r} is not DCR or CRD")
    blocks = _one(ctx, "reshape", [x], {"shape": (n, c, h // b, b, w // b, b)})
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    moved = _one(ctx, "transpose", [blocks], {"perm": perm})
    _finish(ctx, _one(ctx, "reshape", [moved], {"shape": (n, c * b * b, h // b, w // b)}))


@converter("Size")
def _size(ctx: ImportContext) -> None:
    count = int(np.prod(ctx.type_of(ctx.input(0)).shape, dtype=np.int64))
    ctx.bind(0, ctx.constant(np.asarray(count, np.int64), "size"))

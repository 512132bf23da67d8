"""Graph ops of neural-network layers: convolutions, dense / matmul, pooling and normalization.

Data is NCHW, convolution weights OIHW, `pads` are (top, left, bottom, right) with ONNX's
auto_pad already resolved by the front end. The transposed convolutions are `ops_conv_transpose`.

- `conv2d(x, w[, b]; strides, pads, dilations, groups)`: COMPLEX_OUT_FUSABLE; the template is
  "conv2d_nchwc", and `conv2d_template` picks the specialised one (1x1, stem, depthwise).
- `dense(x[M,K], w[K,N][, b[N]])`, `matmul(a, b)` (numpy semantics): COMPLEX_OUT_FUSABLE.
- `batch_norm(x, scale, bias, mean, var; epsilon)`: INJECTIVE (inference form).
- `max_pool2d(kernel, strides, pads, dilations, ceil_mode)`,
  `avg_pool2d(kernel, strides, pads, dilations, ceil_mode, count_include_pad)`,
  `global_avg_pool2d`, `softmax(axis)`, `layer_norm(x, scale, bias; axis, epsilon)`: REDUCTION.
  `dilations` of the pools is an addition to the shared contract (ONNX MaxPool has it);
  absent means (1, 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compiler.graph.ir import TensorType
from compiler.graph.ops_util import (
    broadcast_shapes,
    expect_float,
    expect_inputs,
    expect_rank,
    fail,
    int_attr,
    int_tuple,
    norm_axis,
    window_out,
)
from compiler.graph.registry import Category, OpDef, register

Attrs = Mapping[str, Any]

# Input channels at or below which a convolution uses the stem template (ResNet's 3-channel 7x7).
STEM_MAX_IN_CHANNELS = 4
# The smallest output side a 3x3 stride-1 convolution is run by Winograd's algorithm. Below it
# the tiles compute mostly discarded outputs and the transformed weights, 16/9 (F(2)) to 4x
# (F(4)) the size of the kernel's, are read for few tiles: in a model they come from memory
# (ResNet-18's 46 MB of weights do not stay cached between its calls). At 7x7 (ResNet's last
# stage at 224, 512 channels) Winograd was 1.8-2.2x faster than the direct template on Zen 3
# timed alone, but on an Intel Xeon in the model, F(2)'s 16.8 MB a layer sat at the memory floor
# (2.6-2.9 ms against 1.3-1.7 alone), while the direct conv's 9.4 MB, prefetched a block ahead
# (its `prefetch` knob), ran 2.3-2.6 ms cold after 8 trials: the same demo records with layer 4
# direct ran the whole model 1.03x, 1.15x and 1.18x faster (15, 11 and 21 interleaved rounds).
# So 14x14 and up (each 512-channel 1x1 layer of ResNet-18 at 32x32 took 2.1 ms by Winograd, most
# of the model, before this bound existed).
WINOGRAD_MIN_OUT = 8


def _conv_params(op: str, attrs: Attrs) -> tuple[tuple, tuple, tuple, int]:
    strides = int_tuple(op, attrs, "strides", 2, 1)
    pads = int_tuple(op, attrs, "pads", 4, 0)
    dilations = int_tuple(op, attrs, "dilations", 2, 1)
    groups = int_attr(op, attrs, "groups", 1)
    if groups < 1 or min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
        raise fail(op, f"bad strides {strides} / pads {pads} / dilations {dilations} / groups")
    return strides, pads, dilations, groups


def _check_bias(op: str, inputs: Sequence[TensorType], index: int, channels: int) -> None:
    if len(inputs) > index and inputs[index].shape != (channels,):
        raise fail(op, f"bias shape {list(inputs[index].shape)} must be [{channels}]")


def _same_dtype(op: str, inputs: Sequence[TensorType]) -> str:
    dtypes = {t.dtype for t in inputs}
    if len(dtypes) != 1:
        raise fail(op, f"inputs must share one dtype, got {sorted(dtypes)}")
    return inputs[0].dtype


# -- conv2d ---------------------------------------------------------------------------------------


def _conv2d_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "conv2d"
    expect_inputs(op, inputs, 2, 3)
    x, w = inputs[0], inputs[1]
    expect_rank(op, "data", x, 4)
    expect_rank(op, "weight", w, 4)
    expect_float(op, "data", x)
    dtype = _same_dtype(op, inputs)
    strides, pads, dilations, groups = _conv_params(op, attrs)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c != cg * groups:
        raise fail(op, f"input channels {c} != weight channels {cg} x groups {groups}")
    if o % groups:
        raise fail(op, f"output channels {o} are not a multiple of groups {groups}")
    _check_bias(op, inputs, 2, o)
    oh = window_out(op, h, kh, strides[0], dilations[0], pads[0], pads[2])
    ow = window_out(op, wd, kw, strides[1], dilations[1], pads[1], pads[3])
    return [TensorType((n, o, oh, ow), dtype)]


def _windows(
    xp: np.ndarray, kernel: tuple[int, int], strides: tuple, dilations: tuple, out: tuple[int, int]
) -> list[np.ndarray]:
    """The strided views xp[..., i*s + k*d, j*s + l*d] for each kernel offset (k, l), row-major."""
    views = []
    for k in range(kernel[0]):
        for ll in range(kernel[1]):
            r0, c0 = k * dilations[0], ll * dilations[1]
            views.append(
                xp[
                    ...,
                    r0 : r0 + strides[0] * (out[0] - 1) + 1 : strides[0],
                    c0 : c0 + strides[1] * (out[1] - 1) + 1 : strides[1],
                ]
            )
    return views


def _conv2d_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, w = inputs[0], inputs[1]
    strides, pads, dilations, groups = _conv_params("conv2d", attrs)
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = window_out("conv2d", h, kh, strides[0], dilations[0], pads[0], pads[2])
    ow = window_out("conv2d", wd, kw, strides[1], dilations[1], pads[1], pads[3])
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    # im2col: [N, C, KH*KW, OH, OW] -> [N, G, Cg*KH*KW, OH*OW], against w as [G, Og, Cg*KH*KW]
    cols = np.stack(_windows(xp, (kh, kw), strides, dilations, (oh, ow)), axis=2)
    cols = cols.reshape(n, groups, cg * kh * kw, oh * ow)
    wg = w.reshape(groups, o // groups, cg * kh * kw)
    y = np.matmul(wg[None], cols).reshape(n, o, oh, ow)
    if len(inputs) > 2:
        y = y + inputs[2].reshape(1, o, 1, 1)
    return [y.astype(x.dtype, copy=False)]


def is_grouped_1x1(w: TensorType | tuple[int, ...], attrs: Attrs) -> bool:
    """Whether a grouped (groups > 1) conv2d with weight `w` (or its shape) is 1x1 at stride 1
    without padding or dilation: what `grouped_conv2d_1x1_nchwc` takes."""
    shape = w.shape if isinstance(w, TensorType) else tuple(w)
    return (
        tuple(shape[2:]) == (1, 1)
        and tuple(attrs.get("strides", (1, 1))) == (1, 1)
        and tuple(attrs.get("dilations", (1, 1))) == (1, 1)
        and tuple(attrs.get("pads", (0, 0, 0, 0))) == (0, 0, 0, 0)
    )


def conv2d_template(x: TensorType, w: TensorType, attrs: Attrs) -> str:
    """The `compiler.ops` template a conv2d with these types compiles with."""
    groups = int(attrs.get("groups", 1))
    o, cg, kh, kw = w.shape
    if groups > 1 and cg == 1 and groups == x.shape[1] == o:
        return "depthwise_conv2d_nchwc"
    pads = tuple(attrs.get("pads", (0, 0, 0, 0)))
    if groups != 1:
        if is_grouped_1x1(w, attrs):
            return "grouped_conv2d_1x1_nchwc"
        return "conv2d_nchwc"  # grouped otherwise: no template; imported as one conv per group
    if (kh, kw) == (1, 1) and pads == (0, 0, 0, 0):
        return "conv2d_1x1_nchwc"
    if x.shape[1] <= STEM_MAX_IN_CHANNELS:
        return "conv2d_stem_nchwc"
    if (
        (kh, kw) == (3, 3)
        and tuple(attrs.get("strides", (1, 1))) == (1, 1)
        and tuple(attrs.get("dilations", (1, 1))) == (1, 1)
        and window_out("conv2d", x.shape[2], 3, 1, 1, pads[0], pads[2]) >= WINOGRAD_MIN_OUT
        and window_out("conv2d", x.shape[3], 3, 1, 1, pads[1], pads[3]) >= WINOGRAD_MIN_OUT
    ):
        return "conv2d_winograd_nchwc"
    return "conv2d_nchwc"


def _nchw_only(inputs: Sequence[TensorType], attrs: Attrs) -> bool:
    """Convolutions and pools have NCHW[x]c forms (their `compiler.ops` templates)."""
    return len(inputs[0].shape) == 4


register(
    OpDef(
        "conv2d",
        Category.COMPLEX_OUT_FUSABLE,
        _conv2d_infer,
        _conv2d_reference,
        layout=_nchw_only,
        template="conv2d_nchwc",
        doc="2-D convolution, NCHW data, OIHW weights, optional bias [O].",
    )
)

# -- dense / matmul -------------------------------------------------------------------------------


def _dense_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "dense"
    expect_inputs(op, inputs, 2, 3)
    x, w = inputs[0], inputs[1]
    expect_rank(op, "data", x, 2)
    expect_rank(op, "weight", w, 2)
    dtype = _same_dtype(op, inputs)
    if x.shape[1] != w.shape[0]:
        raise fail(op, f"data {list(x.shape)} and weight {list(w.shape)} disagree on K")
    _check_bias(op, inputs, 2, w.shape[1])
    return [TensorType((x.shape[0], w.shape[1]), dtype)]


def _dense_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    y = inputs[0] @ inputs[1]
    if len(inputs) > 2:
        y = y + inputs[2]
    return [y.astype(inputs[0].dtype, copy=False)]


register(
    OpDef(
        "dense",
        Category.COMPLEX_OUT_FUSABLE,
        _dense_infer,
        _dense_reference,
        template="dense",
        doc="x[M,K] @ w[K,N] (+ b[N]): ONNX Gemm with alpha/beta/trans folded at import.",
    )
)


def _matmul_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "matmul"
    expect_inputs(op, inputs, 2)
    a, b = inputs
    dtype = _same_dtype(op, inputs)
    if not a.shape or not b.shape:
        raise fail(op, "operands must have rank >= 1")
    sa = (1, *a.shape) if len(a.shape) == 1 else a.shape
    sb = (*b.shape, 1) if len(b.shape) == 1 else b.shape
    if sa[-1] != sb[-2]:
        raise fail(op, f"shapes {list(a.shape)} and {list(b.shape)} disagree on K")
    batch = broadcast_shapes(op, sa[:-2], sb[:-2])
    out = (*batch, sa[-2], sb[-1])
    if len(a.shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b.shape) == 1:
        out = out[:-1]
    return [TensorType(tuple(out), dtype)]


def _matmul_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return [np.matmul(inputs[0], inputs[1])]


register(
    OpDef(
        "matmul",
        Category.COMPLEX_OUT_FUSABLE,
        _matmul_infer,
        _matmul_reference,
        template="matmul",
        doc="numpy matmul (batched, broadcasting batch dims, 1-D operands promoted).",
    )
)

# -- batch_norm -----------------------------------------------------------------------------------


def _batch_norm_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "batch_norm"
    expect_inputs(op, inputs, 5)
    x = inputs[0]
    if len(x.shape) < 2:
        raise fail(op, f"data must have rank >= 2, got shape {list(x.shape)}")
    expect_float(op, "data", x)
    _same_dtype(op, inputs)
    c = x.shape[1]
    for what, t in zip(("scale", "bias", "mean", "var"), inputs[1:], strict=True):
        if t.shape != (c,):
            raise fail(op, f"{what} shape {list(t.shape)} must be [{c}] (channels)")
    return [x]


def _batch_norm_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, scale, bias, mean, var = inputs
    eps = float(attrs.get("epsilon", 1e-5))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + np.asarray(eps, var.dtype))
    y = (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)
    return [y.astype(x.dtype, copy=False)]


register(
    OpDef(
        "batch_norm",
        Category.INJECTIVE,
        _batch_norm_infer,
        _batch_norm_reference,
        doc="Inference batch normalization over axis 1: (x - mean) / sqrt(var + eps) * s + b.",
    )
)

# -- pools ----------------------------------------------------------------------------------------


def _pool_params(op: str, attrs: Attrs) -> tuple[tuple, tuple, tuple, tuple, bool]:
    kernel = int_tuple(op, attrs, "kernel", 2, 0)
    if min(kernel) < 1:
        raise fail(op, f"attribute kernel={attrs.get('kernel')!r} must be 2 positive ints")
    strides = int_tuple(op, attrs, "strides", 2, 1)
    pads = int_tuple(op, attrs, "pads", 4, 0)
    dilations = int_tuple(op, attrs, "dilations", 2, 1)
    if min(pads) < 0:
        raise fail(op, f"pads {pads} must be >= 0")
    for i in range(2):
        span = dilations[i] * (kernel[i] - 1) + 1
        if pads[i] >= span or pads[i + 2] >= span:
            raise fail(op, f"pads {pads} must be smaller than the window {kernel} (dilated)")
    return kernel, strides, pads, dilations, bool(attrs.get("ceil_mode", False))


def _pool_out(op: str, shape: tuple[int, ...], attrs: Attrs) -> tuple[int, int]:
    kernel, strides, pads, dilations, ceil_mode = _pool_params(op, attrs)
    return (
        window_out(op, shape[2], kernel[0], strides[0], dilations[0], pads[0], pads[2], ceil_mode),
        window_out(op, shape[3], kernel[1], strides[1], dilations[1], pads[1], pads[3], ceil_mode),
    )


def _pool_infer(op: str) -> Any:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        expect_inputs(op, inputs, 1)
        x = inputs[0]
        expect_rank(op, "data", x, 4)
        expect_float(op, "data", x)
        oh, ow = _pool_out(op, x.shape, attrs)
        return [TensorType((x.shape[0], x.shape[1], oh, ow), x.dtype)]

    return infer


def _pool_reference(op: str) -> Any:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x = inputs[0]
        kernel, strides, pads, dilations, _ = _pool_params(op, attrs)
        out = _pool_out(op, x.shape, attrs)
        size = x.shape[2:]
        # pad the end far enough for the last (ceil_mode) window, which may pass pads[2:]
        ends = [
            max(
                0,
                strides[i] * (out[i] - 1) + dilations[i] * (kernel[i] - 1) + 1 - size[i] - pads[i],
            )
            for i in range(2)
        ]
        widths = ((0, 0), (0, 0), (pads[0], ends[0]), (pads[1], ends[1]))
        if op == "max_pool2d":
            xp = np.pad(x, widths, constant_values=-np.inf)
            y = np.max(np.stack(_windows(xp, kernel, strides, dilations, out)), axis=0)
            return [y.astype(x.dtype, copy=False)]
        xp = np.pad(x.astype(np.float64), widths)
        total = np.sum(np.stack(_windows(xp, kernel, strides, dilations, out)), axis=0)
        counts = []
        for i in range(2):
            pos = (
                np.arange(out[i])[:, None] * strides[i]
                + np.arange(kernel[i])[None, :] * dilations[i]
                - pads[i]
            )
            if attrs.get("count_include_pad", False):
                valid = (pos >= -pads[i]) & (pos < size[i] + pads[i + 2])
            else:
                valid = (pos >= 0) & (pos < size[i])
            counts.append(valid.sum(axis=1))
        y = total / np.outer(counts[0], counts[1])
        return [y.astype(x.dtype)]

    return reference


for _name, _doc in (
    ("max_pool2d", "2-D max pooling; padding never wins the max."),
    ("avg_pool2d", "2-D average pooling; count_include_pad counts the explicit pads."),
):
    register(
        OpDef(
            _name,
            Category.REDUCTION,
            _pool_infer(_name),
            _pool_reference(_name),
            layout=_nchw_only,
            template=f"{_name}_nchwc",
            doc=_doc,
        )
    )


def _global_avg_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "global_avg_pool2d"
    expect_inputs(op, inputs, 1)
    x = inputs[0]
    expect_rank(op, "data", x, 4)
    expect_float(op, "data", x)
    return [TensorType((x.shape[0], x.shape[1], 1, 1), x.dtype)]


def _global_avg_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    return [np.mean(x, axis=(2, 3), keepdims=True, dtype=np.float64).astype(x.dtype)]


register(
    OpDef(
        "global_avg_pool2d",
        Category.REDUCTION,
        _global_avg_infer,
        _global_avg_reference,
        layout=_nchw_only,
        template="global_avg_pool2d_nchwc",
        doc="Mean over H and W of NCHW data, keeping them as 1.",
    )
)

# -- softmax / layer_norm -------------------------------------------------------------------------


def _softmax_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "softmax"
    expect_inputs(op, inputs, 1)
    x = inputs[0]
    expect_float(op, "data", x)
    if not x.shape:
        raise fail(op, "data must have rank >= 1")
    norm_axis(op, int_attr(op, attrs, "axis", -1), len(x.shape))
    return [x]


def _softmax_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    axis = int(attrs.get("axis", -1))
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return [(e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype, copy=False)]


register(
    OpDef(
        "softmax",
        Category.REDUCTION,
        _softmax_infer,
        _softmax_reference,
        template="softmax",
        doc="exp(x) / sum(exp(x)) along one axis (ONNX opset 13 semantics).",
    )
)


def _layer_norm_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "layer_norm"
    expect_inputs(op, inputs, 3)
    x, scale, bias = inputs
    expect_float(op, "data", x)
    _same_dtype(op, inputs)
    if not x.shape:
        raise fail(op, "data must have rank >= 1")
    axis = norm_axis(op, int_attr(op, attrs, "axis", -1), len(x.shape))
    inner = x.shape[axis:]
    for what, t in (("scale", scale), ("bias", bias)):
        fits = len(t.shape) <= len(inner) and all(
            d in (1, want) for d, want in zip(reversed(t.shape), reversed(inner), strict=False)
        )
        if not fits:
            raise fail(op, f"{what} shape {list(t.shape)} must broadcast to {list(inner)}")
    return [x]


def _layer_norm_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, scale, bias = inputs
    axis = int(attrs.get("axis", -1)) % x.ndim
    eps = float(attrs.get("epsilon", 1e-5))
    axes = tuple(range(axis, x.ndim))
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes, keepdims=True)
    var = ((xd - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (xd - mean) / np.sqrt(var + eps) * scale + bias
    return [y.astype(x.dtype)]


register(
    OpDef(
        "layer_norm",
        Category.REDUCTION,
        _layer_norm_infer,
        _layer_norm_reference,
        template="layer_norm",
        doc="Normalize over axes [axis, rank): (x - mean) / sqrt(var + eps) * scale + bias.",
    )
)

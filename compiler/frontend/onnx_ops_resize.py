"""ONNX Resize (opset 13 and later) and Upsample, as static per-axis steps of graph ops.

Shapes are static, so every output position's source taps and weights along each resized axis
are known at import. Resize is separable: each axis whose size, scale or crop changes becomes
one node,
- `gather` with static indices for mode "nearest" (exact, any dtype);
- `resample` (a weighted sum of static taps, `compiler.graph.ops_resample`) for "linear",
  "cubic" and their antialiased filters (float data); a filter wider than MAX_UNROLLED_TAPS is
  a `matmul` by the axis's weight matrix instead;
followed, where positions fall outside the input (tf_crop_and_resize), by a `where` that puts
`extrapolation_value` there. The taps follow onnx's reference: the source coordinate of each
coordinate_transformation_mode, the n taps nearest to it (ties to the lower one) read with edge
clamping, exclude_outside zeroing and renormalizing the taps outside the input. roi, scales and
sizes must be constants. Upsample is Resize with asymmetric coordinates and floor rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import helper, version_converter

from compiler.frontend.onnx_context import ImportContext
from compiler.frontend.onnx_ops import converter, onnx_axis
from compiler.graph.ir import GraphError

# (ratio in (0, 1], scale) -> the weights of n consecutive taps
Coefficients = Callable[[float, float], np.ndarray]

COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
    "tf_half_pixel_for_nn",
)
# Filters wider than this (antialiasing by a small scale) are a matmul by the axis's [in, out]
# weight matrix, not an unrolled sum: two fused unrolled steps inline taps^2 terms per output
# (40 taps took 2.5 s to build).
MAX_UNROLLED_TAPS = 16
# The attribute `pin_legacy_resize` gives the Upsample and Resize-10 nodes of an old model
LEGACY_NEAREST = "kiln_legacy_nearest"
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
KEEP_ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


@dataclass(frozen=True)
class ResizeOptions:
    """A Resize node's attributes, checked."""

    mode: str = "nearest"
    coordinates: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False
    legacy_nearest: bool = False  # Upsample / Resize-10: floor up, ceil down (onnxruntime's)


@dataclass(frozen=True)
class AxisTaps:
    """One axis's resize: output position o reads `indices[o]` (in range) with `weights[o]`;
    where `outside[o]` (tf_crop_and_resize), the output is the extrapolation value instead."""

    indices: np.ndarray  # int64 [out, n]
    weights: np.ndarray  # float64 [out, n]
    outside: np.ndarray | None  # bool [out]


# -- coordinates and taps -------------------------------------------------------------------------


def source_coordinates(
    mode: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The input coordinate of each output position, and which fall outside the input (for
    tf_crop_and_resize only). `out_len` is the integer output length, scale * in_len the real
    one the modes divide by (they differ when a scale does not give a whole length)."""
    y = np.arange(out_len, dtype=np.float64)
    width = scale * in_len
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / width)
        return offset + (y + 0.5) / scale - 0.5, None
    if mode == "pytorch_half_pixel":
        return (np.full(out_len, -0.5) if width == 1 else (y + 0.5) / scale - 0.5), None
    if mode == "align_corners":
        return (np.zeros(out_len) if width == 1 else y * (in_len - 1) / (width - 1)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale, None
    if mode == "tf_crop_and_resize":
        if roi is None:
            raise GraphError("coordinate_transformation_mode tf_crop_and_resize needs roi")
        start, end = roi
        if width == 1:
            x = np.full(out_len, (end - start) * (in_len - 1) / 2, dtype=np.float64)
        else:
            x = y * (end - start) * (in_len - 1) / (width - 1)
        x = x + start * (in_len - 1)
        return x, (x < 0) | (x > in_len - 1)
    raise GraphError(
        f"coordinate_transformation_mode {mode!r} is not one of {', '.join(COORDINATE_MODES)}"
    )


def _nearest(nearest_mode: str) -> Coefficients:
    """A one-hot pick of the lower or upper of two taps (the upper at a whole coordinate)."""

    def pick(ratio: float, scale: float) -> np.ndarray:
        if ratio == 1:
            upper = True
        elif nearest_mode == "round_prefer_floor":
            upper = ratio > 0.5
        elif nearest_mode == "round_prefer_ceil":
            upper = ratio >= 0.5
        else:
            upper = nearest_mode == "ceil"
        return np.array([0.0, 1.0]) if upper else np.array([1.0, 0.0])

    return pick


def _keys(x: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with parameter `a` at distances `x`."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _linear(ratio: float, scale: float) -> np.ndarray:
    return np.array([1 - ratio, ratio])


def _cubic(a: float) -> Coefficients:
    return lambda ratio, scale: _keys(np.array([ratio + 1, ratio, 1 - ratio, 2 - ratio]), a)


def _linear_antialias(ratio: float, scale: float) -> np.ndarray:
    """The triangle filter stretched by 1 / scale when downsampling, normalized."""
    s = min(scale, 1.0)
    first = int(np.floor(-1 / s) + 1)
    distances = (np.arange(first, 2 - first) - ratio) * s
    weights = np.clip(1 - np.abs(distances), 0, 1)
    return weights / weights.sum()


def _cubic_antialias(a: float) -> Coefficients:
    """Keys' kernel stretched by 1 / scale when downsampling, normalized."""

    def weights(ratio: float, scale: float) -> np.ndarray:
        s = min(scale, 1.0)
        first = int(np.floor(-2 / s) + 1)
        w = _keys(s * (np.arange(first, 2 - first) - ratio), a)
        return w / w.sum()

    return weights


def coefficients(options: ResizeOptions) -> Coefficients:
    if options.mode == "nearest":
        if options.antialias:
            raise GraphError("antialias=1 is not supported for mode 'nearest' (onnx defines none)")
        if options.nearest_mode not in NEAREST_MODES:
            raise GraphError(
                f"nearest_mode {options.nearest_mode!r} is not one of {', '.join(NEAREST_MODES)}"
            )
        return _nearest(options.nearest_mode)
    if options.mode == "linear":
        return _linear_antialias if options.antialias else _linear
    if options.mode == "cubic":
        a = options.cubic_coeff_a
        return _cubic_antialias(a) if options.antialias else _cubic(a)
    raise GraphError(f"mode {options.mode!r} is not nearest, linear or cubic")


def _window_starts(x: np.ndarray, n: int) -> np.ndarray:
    """The first of the n integer positions nearest to each coordinate (ties to the lower),
    found as onnx's reference does: on the axis edge-padded by ceil(n / 2)."""
    pad = -(-n // 2)
    padded = x + pad
    whole = np.floor(padded)
    frac = padded - whole
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), 1 - n // 2)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), 1 - (n - 1) // 2)
    return whole.astype(np.int64) + offset - pad


def axis_taps(
    options: ResizeOptions,
    weights_of: Coefficients,
    in_len: int,
    out_len: int,
    scale: float,
    roi: tuple[float, float] | None,
) -> AxisTaps:
    """The taps of one axis resized from `in_len` to `out_len` by `scale`."""
    x, outside = source_coordinates(options.coordinates, out_len, in_len, scale, roi)
    if options.legacy_nearest:  # onnxruntime computes the old ops' coordinates in float32:
        x = x.astype(np.float32).astype(np.float64)  # 11 / 2.2f is 5 there, 4.99999 in float64
    whole = np.floor(x)
    ratios = np.where(x == whole, 1.0, x - whole)  # a whole coordinate is the upper tap
    weights = np.stack([np.asarray(weights_of(float(r), scale), np.float64) for r in ratios])
    n = weights.shape[1]
    indices = _window_starts(x, n)[:, None] + np.arange(n)[None, :]
    if options.exclude_outside:
        weights = np.where((indices < 0) | (indices >= in_len), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    indices = np.clip(indices, 0, in_len - 1)
    return AxisTaps(indices, weights, outside if outside is not None and outside.any() else None)


def output_sizes(
    shape: tuple[int, ...],
    axes: tuple[int, ...],
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    policy: str,
) -> tuple[list[float], list[int]]:
    """The scale and output length of each of `axes`, from scales or sizes (and the
    keep_aspect_ratio_policy), as onnx's reference computes them."""
    ins = [shape[a] for a in axes]
    if scales is not None:
        if scales.size != len(axes) or np.any(scales <= 0):
            raise GraphError(f"scales {scales.tolist()} must be {len(axes)} values > 0")
        factors = [float(s) for s in scales]
        return factors, [int(f * d) for f, d in zip(factors, ins, strict=True)]
    assert sizes is not None
    if sizes.size != len(axes) or np.any(sizes <= 0):
        raise GraphError(f"sizes {sizes.tolist()} must be {len(axes)} values > 0")
    outs = [int(s) for s in sizes]
    factors = [o / d for o, d in zip(outs, ins, strict=True)]
    if policy == "stretch":
        return factors, outs
    if policy not in KEEP_ASPECT_POLICIES:
        raise GraphError(
            f"keep_aspect_ratio_policy {policy!r} is not one of {', '.join(KEEP_ASPECT_POLICIES)}"
        )
    scale = min(factors) if policy == "not_larger" else max(factors)
    return [scale] * len(axes), [int(scale * d + 0.5) for d in ins]


# -- converters -----------------------------------------------------------------------------------


def _options(ctx: ImportContext) -> ResizeOptions:
    known = {
        "mode",
        "coordinate_transformation_mode",
        "nearest_mode",
        "cubic_coeff_a",
        "exclude_outside",
        "extrapolation_value",
        "antialias",
        "axes",
        "keep_aspect_ratio_policy",
        LEGACY_NEAREST,
    }
    ctx.refuse_other_attrs(known)
    return ResizeOptions(
        mode=str(ctx.attr("mode", "nearest")),
        coordinates=str(ctx.attr("coordinate_transformation_mode", "half_pixel")),
        nearest_mode=str(ctx.attr("nearest_mode", "round_prefer_floor")),
        cubic_coeff_a=float(ctx.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(int(ctx.attr("exclude_outside", 0))),
        extrapolation_value=float(ctx.attr("extrapolation_value", 0.0)),
        antialias=bool(int(ctx.attr("antialias", 0))),
        legacy_nearest=bool(int(ctx.attr(LEGACY_NEAREST, 0))),
    )


def _constant_or_none(ctx: ImportContext, i: int, what: str) -> np.ndarray | None:
    """Input `i` (which must be a constant) or None when absent or empty."""
    value = ctx.const_input(i, what)
    return None if value is None or value.size == 0 else np.asarray(value).reshape(-1)


def _resize(
    ctx: ImportContext,
    options: ResizeOptions,
    axes: tuple[int, ...],
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    roi: np.ndarray | None,
    policy: str = "stretch",
) -> None:
    """Emit the per-axis steps resizing input 0 along `axes` and bind the result."""
    x = ctx.input(0)
    xt = ctx.type_of(x)
    if (scales is None) == (sizes is None):
        raise GraphError("exactly one of scales and sizes must be given (as a non-empty constant)")
    if len(set(axes)) != len(axes):
        raise GraphError(f"axes {list(axes)} repeat an axis")
    floating = np.issubdtype(np.dtype(xt.dtype), np.floating)
    if options.mode != "nearest" and not floating:
        raise GraphError(f"mode {options.mode!r} of {xt.dtype} data is not supported (float only)")
    weights_of = coefficients(options)
    factors, outs = output_sizes(xt.shape, axes, scales, sizes, policy)
    crop = options.coordinates == "tf_crop_and_resize"
    if crop and (roi is None or roi.size != 2 * len(axes)):
        raise GraphError(
            f"tf_crop_and_resize needs roi with {2 * len(axes)} values (starts, then ends)"
        )
    if options.legacy_nearest and all(outs[k] == xt.shape[a] for k, a in enumerate(axes)):
        ctx.bind(0, x)  # onnxruntime copies an old op's input whose shape stays, whatever scales
        return
    for k, axis in enumerate(axes):
        in_len = ctx.type_of(x).shape[axis]
        pair = (roi[k], roi[len(axes) + k]) if crop and roi is not None else None
        unchanged = pair is None or (math.isclose(pair[0], 0.0) and math.isclose(pair[1], 1.0))
        if math.isclose(factors[k], 1.0) and outs[k] == in_len and unchanged:
            continue
        if outs[k] < 1:
            raise GraphError(f"axis {axis} would resize {in_len} to {outs[k]} (zero-size output)")
        if options.legacy_nearest and options.mode == "nearest":
            rounding = "floor" if factors[k] >= 1 else "ceil"
            weights_of = coefficients(replace(options, nearest_mode=rounding))
        taps = axis_taps(options, weights_of, in_len, outs[k], factors[k], pair)
        x = _emit_axis(ctx, x, axis, taps, options)
    ctx.bind(0, x)


def _emit_axis(
    ctx: ImportContext, x: str, axis: int, taps: AxisTaps, options: ResizeOptions
) -> str:
    xt = ctx.type_of(x)
    if options.mode == "nearest":
        picked = taps.indices[np.arange(len(taps.indices)), np.argmax(taps.weights, axis=1)]
        (y,) = ctx.emit("gather", [x, ctx.constant(picked.astype(np.int64), "idx")], {"axis": axis})
        # exclude_outside zeroes a nearest tap outside the input (onnx's reference does)
        zeroed = taps.weights.max(axis=1) == 0
        if zeroed.any():
            y = _fill(ctx, y, axis, zeroed, 0.0)
    elif taps.indices.shape[1] > MAX_UNROLLED_TAPS:
        y = _dense_axis(ctx, x, axis, taps)
    else:
        indices = ctx.constant(taps.indices.astype(np.int64), "taps")
        weights = ctx.constant(taps.weights.astype(xt.dtype), "weights")
        (y,) = ctx.emit("resample", [x, indices, weights], {"axis": axis})
    if taps.outside is not None:
        y = _fill(ctx, y, axis, taps.outside, options.extrapolation_value)
    return y


def _dense_axis(ctx: ImportContext, x: str, axis: int, taps: AxisTaps) -> str:
    """The step as a matmul by the [in, out] weight matrix along the last axis (transposed
    there and back), for filters too wide to unroll."""
    xt = ctx.type_of(x)
    rank, in_len = len(xt.shape), xt.shape[axis]
    matrix = np.zeros((in_len, len(taps.indices)), np.float64)
    rows = np.broadcast_to(np.arange(len(taps.indices))[:, None], taps.indices.shape)
    np.add.at(matrix, (taps.indices, rows), taps.weights)
    perm = (*(a for a in range(rank) if a != axis), axis)
    if axis != rank - 1:
        (x,) = ctx.emit("transpose", [x], {"perm": perm})
    (y,) = ctx.emit("matmul", [x, ctx.constant(matrix.astype(xt.dtype), "resize_matrix")])
    if axis == rank - 1:
        return y
    back = tuple(int(p) for p in np.argsort(perm))
    return ctx.emit("transpose", [y], {"perm": back})[0]


def _fill(ctx: ImportContext, y: str, axis: int, rows: np.ndarray, value: float) -> str:
    """`y` with `value` at the positions `rows` (bool [out]) of `axis`."""
    yt = ctx.type_of(y)
    mask = rows.reshape((-1,) + (1,) * (len(yt.shape) - axis - 1))
    fill = ctx.constant(np.asarray(value, dtype=yt.dtype), "fill")
    return ctx.emit("where", [ctx.constant(mask, "outside"), fill, y])[0]


@converter("Resize")
def _resize_node(ctx: ImportContext) -> None:
    options = _options(ctx)
    rank = len(ctx.input_type(0).shape)
    axes = tuple(onnx_axis(int(a), rank) for a in ctx.attr("axes", tuple(range(rank))))
    crop = options.coordinates == "tf_crop_and_resize"
    roi = _constant_or_none(ctx, 1, "roi") if crop else None
    scales = _constant_or_none(ctx, 2, "scales")
    sizes = _constant_or_none(ctx, 3, "sizes")
    policy = str(ctx.attr("keep_aspect_ratio_policy", "stretch"))
    _resize(ctx, options, axes, scales, sizes, roi, policy)


@converter("Upsample")
def _upsample(ctx: ImportContext) -> None:
    """Upsample (deprecated at opset 10): output length floor(size * scale), source coordinate
    position / scale, nearest rounding down (up where the axis shrinks), as onnxruntime does.
    Older models reach Resize through onnx's version converter (see `pin_legacy_resize`); this
    takes an Upsample node in a newer model."""
    mode = str(ctx.attr("mode", "nearest"))
    if mode not in ("nearest", "linear"):
        raise GraphError(f"mode {mode!r} is not nearest or linear")
    known = ("mode", "scales", LEGACY_NEAREST)
    ctx.refuse_other_attrs(known)
    scales = ctx.attr("scales")
    values = (
        np.asarray(scales, np.float32)
        if scales is not None
        else _constant_or_none(ctx, 1, "scales")
    )
    options = ResizeOptions(mode=mode, coordinates="asymmetric", legacy_nearest=True)
    rank = len(ctx.input_type(0).shape)
    _resize(ctx, options, tuple(range(rank)), values, None, None)


def pin_legacy_resize(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model` (of default-domain `opset`) with its Upsample and Resize-10 nodes' semantics
    written out as attributes, before onnx's version converter makes them Resize-13 nodes.

    The converter keeps a Resize-10's attributes (an older model is first brought to opset 10,
    where Upsample is Resize) but not their meaning: it leaves Resize-13's defaults
    (half_pixel coordinates, round_prefer_floor), where the old ops map output position y to
    y / scale (asymmetric) and onnxruntime rounds a nearest source down on axes that grow and
    up on axes that shrink. Both are pinned: coordinate_transformation_mode "asymmetric" and the
    `LEGACY_NEAREST` marker this module reads. A model of opset 11 or later is returned as is.
    """
    is_legacy = [
        n.op_type in ("Upsample", "Resize") and n.domain in ("", "ai.onnx")
        for n in model.graph.node
    ]
    if opset >= 11 or not any(is_legacy):
        return model
    if opset < 10:  # the converter rebuilds Upsample as Resize-10 without its attributes
        model = version_converter.convert_version(model, 10)
        return pin_legacy_resize(model, 10)
    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    for node, legacy in zip(pinned.graph.node, is_legacy, strict=True):
        if legacy:
            names = {a.name for a in node.attribute}
            if "coordinate_transformation_mode" not in names:
                node.attribute.append(
                    helper.make_attribute("coordinate_transformation_mode", "asymmetric")
                )
            if LEGACY_NEAREST not in names:
                node.attribute.append(helper.make_attribute(LEGACY_NEAREST, 1))
    return pinned

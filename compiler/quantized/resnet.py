"""A quantised ResNet-18: int8 weights and activations, int32 accumulation, shift-and-clip requant.

The shape is torchvision's ResNet-18 (as `compiler.zoo.resnet18`), with BatchNorm folded into
each convolution's weights and bias as a deployed int8 network has it: a 7x7/2 stem conv + ReLU, a
3x3/2 max pool, four stages of two BasicBlocks (3x3 conv + ReLU, 3x3 conv, a 1x1/2 downsample
conv where the shape changes, a residual add + ReLU), a global average pool and a dense layer
to the classes. `width` scales the channels (64 is the real network) for small test variants.

Weights are drawn from `np.random.default_rng(seed)` with He scales, each layer quantised to int8
with its own power-of-two scale; every activation's scale is then calibrated on a seeded image
(`calibration_image`): each requantisation shift is the smallest that brings the 99.9th
percentile of the layer's accumulators into int8 (`int8_ops.shift_for`). The same arguments give
the same network, bit for bit.

`forward(net, image, conv)` runs the network with the convolutions (and the dense head, a 1x1
conv on a 1x1 image) done by `conv`, and everything else (pooling, residual adds) in integer
numpy; `reference(net, image)` is `forward` with the numpy conv: the network's definition, which
an accelerator's run must match exactly.

    net = int8_resnet18(image=224, seed=0)
    logits = reference(net, calibration_image(224, seed=0))     # int8 [1000]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.quantized.int8_ops import (
    INT8_MAX,
    add_requantise,
    gemm_accumulate,
    gemm_requantise,
    global_avg_pool,
    im2col,
    max_pool,
    out_size,
    requantise,
    shift_for,
)

INPUT_FRAC = 7  # the image's int8 holds values in [-1, 1)
STAGES = 4


@dataclass(frozen=True, eq=False)
class QConv:
    """A quantised convolution (BatchNorm folded in) and its requantisation.

    Attributes:
        name: unique in the network (the accelerator program's entry symbol).
        in_hw: the input's height and width (the network is built for one image size).
        weight: int8 [cout, kernel * kernel * cin], columns in im2col order (kh, kw, cin).
        bias: int32 [cout] at the accumulator's scale (in_frac + w_frac fractional bits).
        shift: the requantisation's right shift; relu: clip at 0 rather than -128.
        in_frac, w_frac: fractional bits of the input's and the weights' int8.
    """

    name: str
    in_hw: tuple[int, int]
    cin: int
    cout: int
    kernel: int
    stride: int
    weight: np.ndarray
    bias: np.ndarray
    shift: int
    relu: bool
    in_frac: int
    w_frac: int

    @property
    def pad(self) -> int:
        return self.kernel // 2

    @property
    def out_hw(self) -> tuple[int, int]:
        h, w = self.in_hw
        k, s, p = self.kernel, self.stride, self.pad
        return out_size(h, k, s, p), out_size(w, k, s, p)

    @property
    def out_frac(self) -> int:
        """Fractional bits of the output's int8."""
        return self.in_frac + self.w_frac - self.shift

    def gemm_shape(self) -> tuple[int, int, int]:
        """(M, N, K) of the im2col GEMM: output pixels, output channels, kernel x kernel x cin."""
        ho, wo = self.out_hw
        return ho * wo, self.cout, self.kernel * self.kernel * self.cin


@dataclass(frozen=True)
class QAdd:
    """A residual add + ReLU: operands shifted left by `a_up` / `b_up` onto one scale, summed in
    int32, requantised by `shift` to `out_frac` fractional bits."""

    a_up: int
    b_up: int
    shift: int
    out_frac: int


@dataclass(frozen=True)
class QBlock:
    """A BasicBlock: relu(add(conv2(conv1(x)), downsample(x) or x))."""

    conv1: QConv
    conv2: QConv
    downsample: QConv | None
    add: QAdd


@dataclass(frozen=True)
class Int8ResNet:
    """The quantised network for one image size (HWC int8 input with INPUT_FRAC bits)."""

    image: int
    stem: QConv
    blocks: tuple[QBlock, ...]
    fc: QConv

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.image, self.image, 3)

    @property
    def classes(self) -> int:
        return self.fc.cout

    def convs(self) -> tuple[QConv, ...]:
        """Every convolution and the dense head, in the order `forward` runs them."""
        out = [self.stem]
        for b in self.blocks:
            out += [b.conv1, b.conv2] + ([b.downsample] if b.downsample else [])
        return (*out, self.fc)


ConvFn = Callable[[QConv, np.ndarray], np.ndarray]


def reference_conv(layer: QConv, x: np.ndarray) -> np.ndarray:
    """`layer` on HWC int8 `x` in numpy: im2col, GEMM, requantise; HWC int8 out."""
    cols = im2col(x, layer.kernel, layer.stride, layer.pad)
    y = gemm_requantise(cols, layer.weight, layer.bias, layer.shift, layer.relu)
    return y.reshape(*layer.out_hw, layer.cout)


def forward(net: Int8ResNet, image: np.ndarray, conv: ConvFn = reference_conv) -> np.ndarray:
    """The int8 logits [classes] of `image` (HWC int8), every conv and the head run by `conv`."""
    if image.shape != net.input_shape or image.dtype != np.int8:
        raise ValueError(f"the network takes int8{list(net.input_shape)}, got "
                         f"{image.dtype}{list(image.shape)}")  # fmt: skip
    x = max_pool(conv(net.stem, image))
    for block in net.blocks:
        y = conv(block.conv2, conv(block.conv1, x))
        shortcut = x if block.downsample is None else conv(block.downsample, x)
        x = add_requantise(y, block.add.a_up, shortcut, block.add.b_up, block.add.shift)
    pooled = global_avg_pool(x).reshape(1, 1, -1)  # a 1x1 image for the head's 1x1 conv
    return conv(net.fc, pooled).reshape(-1)


def reference(net: Int8ResNet, image: np.ndarray) -> np.ndarray:
    """The network's logits in integer numpy: its definition."""
    return forward(net, image, reference_conv)


def calibration_image(image: int, seed: int = 0) -> np.ndarray:
    """A seeded HWC int8 image (values of about N(0, 0.5) at INPUT_FRAC bits)."""
    rng = np.random.default_rng([seed, 1])
    values = rng.standard_normal((image, image, 3)) * 0.5 * (1 << INPUT_FRAC)
    return np.clip(np.rint(values), -INT8_MAX - 1, INT8_MAX).astype(np.int8)


class _Builder:
    """Draws each layer's weights and calibrates its shift on the activation that reaches it."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def conv(
        self,
        name: str,
        x: np.ndarray,
        frac: int,
        cout: int,
        kernel: int,
        stride: int,
        relu: bool,
        after_relu: bool = True,
    ) -> tuple[QConv, np.ndarray]:
        """A calibrated conv of `cout` channels on `x` (at `frac` bits) and its output on `x`."""
        h, w, cin = x.shape
        fan_in = kernel * kernel * cin
        std = math.sqrt((2.0 if after_relu else 1.0) / fan_in)
        real = self.rng.standard_normal((cout, fan_in)) * std
        w_frac = math.floor(math.log2(INT8_MAX / float(np.abs(real).max())))
        weight = np.clip(np.rint(real * 2.0**w_frac), -INT8_MAX, INT8_MAX).astype(np.int8)
        bias_real = self.rng.standard_normal(cout) * 0.05
        bias = np.rint(bias_real * 2.0 ** (frac + w_frac)).astype(np.int32)
        acc = gemm_accumulate(im2col(x, kernel, stride, kernel // 2), weight, bias)
        shift = shift_for(acc, relu)
        layer = QConv(name, (h, w), cin, cout, kernel, stride, weight, bias, shift, relu, frac,
                      w_frac)  # fmt: skip
        return layer, requantise(acc, shift, relu).reshape(*layer.out_hw, cout)


def int8_resnet18(
    image: int = 224, width: int = 64, classes: int = 1000, seed: int = 0
) -> Int8ResNet:
    """The quantised ResNet-18 of the module docstring for `image` x `image` inputs.

    Raises:
        ValueError: an image below 32 (the network downsamples by 32) or a width below 1.
    """
    if image < 32 or width < 1 or classes < 1:
        raise ValueError(f"int8_resnet18 needs image >= 32, width >= 1, classes >= 1; got "
                         f"{image}, {width}, {classes}")  # fmt: skip
    b = _Builder(seed)
    x = calibration_image(image, seed)
    stem, x = b.conv("conv1", x, INPUT_FRAC, width, 7, 2, relu=True, after_relu=False)
    x, frac = max_pool(x), stem.out_frac
    blocks = []
    cin = width
    for stage in range(1, STAGES + 1):
        cout = width << (stage - 1)
        for index in range(2):
            stride = 2 if stage > 1 and index == 0 else 1
            p = f"layer{stage}.{index}"
            conv1, y = b.conv(f"{p}.conv1", x, frac, cout, 3, stride, relu=True)
            conv2, y = b.conv(f"{p}.conv2", y, conv1.out_frac, cout, 3, 1, relu=False)
            downsample, shortcut, s_frac = None, x, frac
            if stride != 1 or cin != cout:
                downsample, shortcut = b.conv(f"{p}.downsample", x, frac, cout, 1, stride, False)
                s_frac = downsample.out_frac
            top = max(conv2.out_frac, s_frac)
            a_up, b_up = top - conv2.out_frac, top - s_frac
            total = (y.astype(np.int32) << a_up) + (shortcut.astype(np.int32) << b_up)
            shift = shift_for(total, relu=True)
            add = QAdd(a_up, b_up, shift, top - shift)
            x = add_requantise(y, a_up, shortcut, b_up, shift)
            blocks.append(QBlock(conv1, conv2, downsample, add))
            frac, cin = add.out_frac, cout
    pooled = global_avg_pool(x).reshape(1, 1, -1)
    fc, _ = b.conv("fc", pooled, frac, classes, 1, 1, relu=False)
    return Int8ResNet(image, stem, tuple(blocks), fc)

"""Zoo-style models at old opsets: import, untuned build time, correctness and latency vs onnxruntime.

    .venv/bin/python benchmarks/zoo.py [--models alexnet,vgg,...] [--image 224] [--rounds 3]

Models written with `onnx.helper` and seeded weights in the style of what the public zoos hold,
each exported at the old opset such models carry (7-11), so they go through onnx's version
converter on import:
  alexnet     (opset 9)  11x11/4 stem, LRN after the first two convs, Dropout, Gemm head, Softmax
  vgg         (opset 8)  3x3 conv stacks and max pools, Gemm head
  inception   (opset 9)  blocks of 1x1 / 3x3 / 5x5 / pool->1x1 branches joined by Concat
  squeezenet  (opset 9)  fire modules (1x1 squeeze, 1x1 + 3x3 expand, Concat), global pool
  shufflenet  (opset 11) grouped 1x1 convs, channel shuffle (Reshape-Transpose-Reshape), depthwise
  densenet    (opset 10) dense blocks (BN-Relu-1x1-BN-Relu-3x3, Concat growing), transitions
  resnet50    (opset 11) bottleneck blocks 3-4-6-3, widths 64-2048
  transformer (opset 11) 4-layer encoder: LayerNorm written out (ReduceMean/Sub/Pow/Sqrt/Div),
                         Gelu in Erf form, MatMul attention, Softmax
  mobilenet   (opset 10) inverted residuals (1x1 expand, 3x3 depthwise, 1x1 project, Add where
                         shapes match), Clip(0, 6) as ReLU6, global pool, Gemm head
  googlenet   (opset 8)  7x7/2 stem, LRN, 1x1 + 3x3 conv, LRN, two inception blocks, AveragePool,
                         Dropout, Gemm, Softmax
  unet        (opset 11) encoder-decoder of 16-64 channels: MaxPool down twice, up by ConvTranspose
                         (stride 2) and by nearest Resize, skips joined by Concat, 1x1 conv, Sigmoid
  efficientnet (opset 11) MBConv blocks with Swish as x*Sigmoid(x) and squeeze-and-excitation,
                         B0's stages and strides, global pool, Gemm head
For each: the import (seconds), the untuned build (seconds: optimize, lower, C, gcc; with an empty
compiler cache unless --warm-cache), then the
build's outputs against onnxruntime's and both timed on one core, interleaved
(`tuner.network.timing.versus_onnxruntime`, as benchmarks/models.py). Ratio = onnxruntime time /
ours (> 1: ours faster). A model Kiln refuses is a row with the reason.

With `--tune-per-task N` each model is also tuned on a local pool (tracker + agent, as `kiln
demo`) for N trials per task (`kiln demo`'s budget is 8: one warm-up round), one confirmation
per task, built from those records, and timed beside the untuned build and onnxruntime in the
same interleaved rounds; the final line then carries `tuned_ratio_geomean` and
`tuned_ratio_min` too.

Then (unless --no-conformance) benchmarks/conformance.py runs as a child process: onnx's node
tests of every op Kiln imports. Ends with one line:
    zoo: models=<n> correct=<n> build_s_max=<s> untuned_ratio_geomean=<x> untuned_ratio_min=<x>
         conformance_pass_pct=<x> ops_claimed=<n> [tuned_ratio_geomean=<x> tuned_ratio_min=<x>]
(pass_pct over the node tests of every op Kiln imports; an op is claimed when all of its pass).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import atexit  # noqa: E402
import contextlib  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, NamedTuple  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import kiln  # noqa: E402
from compiler.zoo import _Builder  # noqa: E402

if TYPE_CHECKING:
    from compiler.graph.build_model import ModelArtifact
    from compiler.graph.ir import Graph


def _model(
    b: _Builder, name: str, image: int, out: str, opset: int, shape: list[int]
) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, image, image])
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)
    graph = helper.make_graph(b.nodes, name, [x], [y], b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 6
    onnx.checker.check_model(model)
    return model


def _conv(b: _Builder, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1,
          pad: int | None = None, group: int = 1, relu: bool = True) -> str:  # fmt: skip
    w = b.normal(f"{name}.w", (cout, cin // group, k, k), math.sqrt(2.0 / (cin // group * k * k)))
    bias = b.uniform(f"{name}.b", (cout,), -0.05, 0.05)
    p = k // 2 if pad is None else pad
    y = b.node("Conv", [x, w, bias], name, kernel_shape=[k, k], strides=[stride, stride],
               pads=[p, p, p, p], group=group)  # fmt: skip
    return b.node("Relu", [y], f"{name}.relu") if relu else y


def _bn(b: _Builder, x: str, name: str, c: int) -> str:
    return b.node(
        "BatchNormalization",
        [x, b.uniform(f"{name}.g", (c,), 0.8, 1.2), b.uniform(f"{name}.b", (c,), -0.1, 0.1),
         b.uniform(f"{name}.m", (c,), -0.1, 0.1), b.uniform(f"{name}.v", (c,), 0.8, 1.2)],
        name, epsilon=1e-5,
    )  # fmt: skip


def _pool(b: _Builder, x: str, name: str, k: int, s: int, op: str = "MaxPool", pad: int = 0) -> str:
    return b.node(op, [x], name, kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4)


def _head(b: _Builder, x: str, c: int, classes: int, hidden: int = 0) -> str:
    x = b.node("Flatten", [x], "flatten", axis=1)
    if hidden:
        w = b.normal("fc1.w", (hidden, c), math.sqrt(2.0 / c))
        x = b.node("Gemm", [x, w, b.uniform("fc1.b", (hidden,), -0.05, 0.05)], "fc1", transB=1)
        x = b.node("Relu", [x], "fc1.relu")
        c = hidden
    w = b.normal("fc.w", (classes, c), math.sqrt(1.0 / c))
    return b.node("Gemm", [x, w, b.uniform("fc.b", (classes,), -0.05, 0.05)], "fc", transB=1)


class Mix(NamedTuple):
    """The output channels of one inception block's branches (`r`: the 1x1 reduce before them)."""

    c1: int
    c3r: int
    c3: int
    c5r: int
    c5: int
    pool_proj: int

    @property
    def out(self) -> int:
        return self.c1 + self.c3 + self.c5 + self.pool_proj


def _mix(b: _Builder, x: str, p: str, c: int, mix: Mix) -> str:
    """An inception block: 1x1, 1x1->3x3, 1x1->5x5 and 3x3 max pool->1x1 branches, Concat."""
    a = _conv(b, x, f"{p}.1x1", c, mix.c1, 1)
    r = _conv(b, _conv(b, x, f"{p}.3x3r", c, mix.c3r, 1), f"{p}.3x3", mix.c3r, mix.c3, 3)
    f = _conv(b, _conv(b, x, f"{p}.5x5r", c, mix.c5r, 1), f"{p}.5x5", mix.c5r, mix.c5, 5)
    pool = b.node("MaxPool", [x], f"{p}.pool", kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4)
    q = _conv(b, pool, f"{p}.poolproj", c, mix.pool_proj, 1)
    return b.node("Concat", [a, r, f, q], f"{p}.cat", axis=1)


def alexnet(image: int) -> onnx.ModelProto:
    b = _Builder(1)
    x = _conv(b, "input", "conv1", 3, 64, 11, 4, 2)
    x = b.node("LRN", [x], "lrn1", size=5, alpha=1e-4, beta=0.75, bias=2.0)
    x = _pool(b, x, "pool1", 3, 2)
    x = _conv(b, x, "conv2", 64, 192, 5)
    x = b.node("LRN", [x], "lrn2", size=5, alpha=1e-4, beta=0.75, bias=2.0)
    x = _pool(b, x, "pool2", 3, 2)
    x = _conv(b, x, "conv3", 192, 384, 3)
    x = _conv(b, x, "conv4", 384, 256, 3)
    x = _conv(b, x, "conv5", 256, 256, 3)
    x = _pool(b, x, "pool5", 3, 2)
    side = ((image - 11 + 4) // 4 + 1 - 3) // 2 + 1
    side = ((side - 3) // 2 + 1 - 3) // 2 + 1
    x = b.node("Dropout", [x], "drop", ratio=0.5)
    logits = _head(b, x, 256 * side * side, 1000, hidden=1024)
    b.node("Softmax", [logits], "prob", axis=1)
    return _model(b, "alexnet", image, "prob", 9, [1, 1000])


def vgg(image: int) -> onnx.ModelProto:
    b = _Builder(2)
    x, c = "input", 3
    for stage, (width, convs) in enumerate(((32, 2), (64, 2), (128, 3), (256, 3), (256, 3))):
        for i in range(convs):
            x = _conv(b, x, f"s{stage}.c{i}", c, width, 3)
            c = width
        x = _pool(b, x, f"s{stage}.pool", 2, 2)
    side = image // 32
    return _model(b, "vgg", image, _head(b, x, c * side * side, 1000, 512), 8, [1, 1000])


def inception(image: int) -> onnx.ModelProto:
    b = _Builder(3)
    x = _conv(b, "input", "stem1", 3, 32, 3, 2)
    x = _conv(b, x, "stem2", 32, 64, 3)
    x = _pool(b, x, "stem.pool", 3, 2, pad=1)
    c = 64
    for i, mix in enumerate(
        (Mix(32, 48, 64, 8, 16, 16), Mix(64, 64, 96, 16, 48, 32), Mix(96, 48, 104, 8, 24, 32))
    ):
        p = f"mix{i}"
        x, c = _mix(b, x, p, c, mix), mix.out
        if i == 1:
            x = _pool(b, x, f"{p}.down", 3, 2, pad=1)
    x = b.node("GlobalAveragePool", [x], "gap")
    return _model(b, "inception", image, _head(b, x, c, 1000), 9, [1, 1000])


def squeezenet(image: int) -> onnx.ModelProto:
    b = _Builder(4)
    x = _conv(b, "input", "conv1", 3, 64, 3, 2, 0)
    x = _pool(b, x, "pool1", 3, 2)
    c = 64
    for i, (s, e) in enumerate(((16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (64, 256))):
        sq = _conv(b, x, f"fire{i}.squeeze", c, s, 1)
        x = b.node("Concat", [_conv(b, sq, f"fire{i}.e1", s, e, 1),
                              _conv(b, sq, f"fire{i}.e3", s, e, 3)], f"fire{i}.cat", axis=1)  # fmt: skip
        c = 2 * e
        if i in (1, 3):
            x = _pool(b, x, f"fire{i}.pool", 3, 2)
    x = _conv(b, x, "conv10", c, 1000, 1)
    x = b.node("GlobalAveragePool", [x], "gap")
    return _model(b, "squeezenet", image, b.node("Flatten", [x], "out", axis=1), 9, [1, 1000])


def shufflenet(image: int) -> onnx.ModelProto:
    b = _Builder(5)
    x = _conv(b, "input", "conv1", 3, 24, 3, 2)
    x = _pool(b, x, "pool1", 3, 2, pad=1)
    c, groups, side = 24, 3, image // 4
    for i, (width, stride) in enumerate(((240, 2), (240, 1), (480, 2), (480, 1), (960, 2))):
        p = f"unit{i}"
        mid = width // 4
        y = _conv(b, x, f"{p}.g1", c, mid, 1, group=groups if c % groups == 0 else 1)
        y = b.node(
            "Reshape", [y, b.const([1, groups, mid // groups, side, side], np.int64)], f"{p}.r1"
        )
        y = b.node("Transpose", [y], f"{p}.t", perm=[0, 2, 1, 3, 4])
        y = b.node("Reshape", [y, b.const([1, mid, side, side], np.int64)], f"{p}.r2")
        y = _conv(b, y, f"{p}.dw", mid, mid, 3, stride, group=mid, relu=False)
        side = (side - 1) // stride + 1
        out = width - c if stride == 2 else width
        y = _conv(b, y, f"{p}.g2", mid, out, 1, group=groups, relu=False)
        if stride == 2:
            short = b.node(
                "AveragePool", [x], f"{p}.avg", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4
            )
            x = b.node("Relu", [b.node("Concat", [short, y], f"{p}.cat", axis=1)], f"{p}.relu")
        else:
            x = b.node("Relu", [b.node("Add", [x, y], f"{p}.add")], f"{p}.relu")
        c = width
    x = b.node("GlobalAveragePool", [x], "gap")
    return _model(b, "shufflenet", image, _head(b, x, c, 1000), 11, [1, 1000])


def densenet(image: int) -> onnx.ModelProto:
    b = _Builder(6)
    x = _conv(b, "input", "conv0", 3, 64, 7, 2, 3)
    x = _pool(b, x, "pool0", 3, 2, pad=1)
    c, growth = 64, 32
    for block, layers in enumerate((6, 12, 16)):
        for i in range(layers):
            p = f"b{block}.l{i}"
            y = b.node("Relu", [_bn(b, x, f"{p}.bn1", c)], f"{p}.r1")
            y = _conv(b, y, f"{p}.c1", c, 4 * growth, 1, relu=False)
            y = b.node("Relu", [_bn(b, y, f"{p}.bn2", 4 * growth)], f"{p}.r2")
            y = _conv(b, y, f"{p}.c2", 4 * growth, growth, 3, relu=False)
            x = b.node("Concat", [x, y], f"{p}.cat", axis=1)
            c += growth
        if block < 2:
            x = b.node("Relu", [_bn(b, x, f"t{block}.bn", c)], f"t{block}.r")
            x = _conv(b, x, f"t{block}.c", c, c // 2, 1, relu=False)
            x = _pool(b, x, f"t{block}.pool", 2, 2, op="AveragePool")
            c //= 2
    x = b.node("GlobalAveragePool", [b.node("Relu", [_bn(b, x, "bn5", c)], "r5")], "gap")
    return _model(b, "densenet", image, _head(b, x, c, 1000), 10, [1, 1000])


def resnet50(image: int) -> onnx.ModelProto:
    b = _Builder(7)
    x = _conv(b, "input", "conv1", 3, 64, 7, 2, 3)
    x = _pool(b, x, "pool1", 3, 2, pad=1)
    c = 64
    for stage, (blocks, mid) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512))):
        for i in range(blocks):
            p, stride = f"l{stage}.{i}", 2 if i == 0 and stage > 0 else 1
            y = _conv(b, x, f"{p}.c1", c, mid, 1)
            y = _conv(b, y, f"{p}.c2", mid, mid, 3, stride)
            y = _conv(b, y, f"{p}.c3", mid, 4 * mid, 1, relu=False)
            short = x if i else _conv(b, x, f"{p}.down", c, 4 * mid, 1, stride, 0, relu=False)
            x = b.node("Relu", [b.node("Add", [short, y], f"{p}.add")], f"{p}.relu")
            c = 4 * mid
    x = b.node("GlobalAveragePool", [x], "gap")
    return _model(b, "resnet50", image, _head(b, x, c, 1000), 11, [1, 1000])


def transformer(image: int) -> onnx.ModelProto:
    """A 4-layer encoder over 128 tokens of 256 (the `image` argument is not used)."""
    b = _Builder(8)
    seq, hidden, heads, ffn = 128, 256, 4, 1024
    head = hidden // heads

    def dense(x: str, name: str, fan_in: int, fan_out: int) -> str:
        w = b.normal(f"{name}.w", (fan_in, fan_out), math.sqrt(1.0 / fan_in))
        return b.node("Add", [b.node("MatMul", [x, w], f"{name}.mm"), b.uniform(f"{name}.b", (fan_out,), -0.02, 0.02)], name)  # fmt: skip

    def layer_norm(x: str, name: str) -> str:
        mean = b.node("ReduceMean", [x], f"{name}.mean", axes=[-1])
        d = b.node("Sub", [x, mean], f"{name}.d")
        var = b.node(
            "ReduceMean", [b.node("Pow", [d, b.const(2.0)], f"{name}.sq")], f"{name}.var", axes=[-1]
        )
        std = b.node("Sqrt", [b.node("Add", [var, b.const(1e-12)], f"{name}.eps")], f"{name}.std")
        y = b.node("Div", [d, std], f"{name}.norm")
        y = b.node("Mul", [y, b.uniform(f"{name}.g", (hidden,), 0.9, 1.1)], f"{name}.scale")
        return b.node("Add", [y, b.uniform(f"{name}.b", (hidden,), -0.1, 0.1)], name)

    x = b.node("Reshape", ["input", b.const([1, seq, hidden], np.int64)], "embed")
    for i in range(4):
        p = f"layer{i}"
        q, k, v = (dense(x, f"{p}.{n}", hidden, hidden) for n in "qkv")
        split = b.const([1, seq, heads, head], np.int64)
        q, k, v = (b.node("Transpose", [b.node("Reshape", [t, split], f"{p}.{n}.r")], f"{p}.{n}.t", perm=[0, 2, 1, 3]) for t, n in ((q, "q"), (k, "k"), (v, "v")))  # fmt: skip
        kt = b.node("Transpose", [k], f"{p}.kt", perm=[0, 1, 3, 2])
        scores = b.node(
            "Mul",
            [b.node("MatMul", [q, kt], f"{p}.qk"), b.const(1.0 / math.sqrt(head))],
            f"{p}.scaled",
        )
        probs = b.node("Softmax", [scores], f"{p}.probs", axis=3)
        ctx = b.node(
            "Transpose", [b.node("MatMul", [probs, v], f"{p}.ctx")], f"{p}.ctx.t", perm=[0, 2, 1, 3]
        )
        ctx = b.node("Reshape", [ctx, b.const([1, seq, hidden], np.int64)], f"{p}.ctx.r")
        x = layer_norm(
            b.node("Add", [x, dense(ctx, f"{p}.o", hidden, hidden)], f"{p}.res1"), f"{p}.ln1"
        )
        h = dense(x, f"{p}.ffn1", hidden, ffn)
        gelu = b.node("Mul", [b.node("Mul", [h, b.node("Add", [b.node("Erf", [b.node("Div", [h, b.const(math.sqrt(2.0))], f"{p}.g.d")], f"{p}.g.erf"), b.const(1.0)], f"{p}.g.a")], f"{p}.g.m"), b.const(0.5)], f"{p}.gelu")  # fmt: skip
        x = layer_norm(
            b.node("Add", [x, dense(gelu, f"{p}.ffn2", ffn, hidden)], f"{p}.res2"), f"{p}.ln2"
        )
    xin = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, seq, hidden])
    y = helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, seq, hidden])
    graph = helper.make_graph(b.nodes, "transformer", [xin], [y], b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    onnx.checker.check_model(model)
    return model


def mobilenet(image: int) -> onnx.ModelProto:
    """MobileNetV2's widths and repeats; its BatchNorms folded into the convs, as exported."""
    b = _Builder(9)

    def conv6(x: str, name: str, cin: int, cout: int, k: int, s: int = 1, group: int = 1) -> str:
        y = _conv(b, x, name, cin, cout, k, s, group=group, relu=False)
        # ReLU6; opset 10's Clip takes its bounds as attributes (inputs from opset 11 on)
        return b.node("Clip", [y], f"{name}.relu6", min=0.0, max=6.0)

    x = conv6("input", "conv0", 3, 32, 3, 2)
    c = 32
    for stage, (expand, width, repeats, stride) in enumerate(
        ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
         (6, 160, 3, 2), (6, 320, 1, 1))
    ):  # fmt: skip
        for i in range(repeats):
            p, s, mid = f"s{stage}.{i}", stride if i == 0 else 1, c * expand
            y = conv6(x, f"{p}.expand", c, mid, 1) if expand != 1 else x
            y = conv6(y, f"{p}.dw", mid, mid, 3, s, group=mid)
            y = _conv(b, y, f"{p}.project", mid, width, 1, relu=False)
            x = b.node("Add", [x, y], f"{p}.add") if s == 1 and c == width else y
            c = width
    x = b.node("GlobalAveragePool", [conv6(x, "conv_last", c, 1280, 1)], "gap")
    return _model(b, "mobilenet", image, _head(b, x, 1280, 1000), 10, [1, 1000])


def googlenet(image: int) -> onnx.ModelProto:
    """GoogLeNet up to inception 3b, then its head: AveragePool over the whole map, Dropout, Gemm."""
    b = _Builder(10)
    x = _conv(b, "input", "conv1", 3, 64, 7, 2)
    x = _pool(b, x, "pool1", 3, 2, pad=1)
    x = b.node("LRN", [x], "lrn1", size=5, alpha=1e-4, beta=0.75, bias=1.0)
    x = _conv(b, x, "conv2.reduce", 64, 64, 1)
    x = _conv(b, x, "conv2", 64, 192, 3)
    x = b.node("LRN", [x], "lrn2", size=5, alpha=1e-4, beta=0.75, bias=1.0)
    x = _pool(b, x, "pool2", 3, 2, pad=1)
    c = 192
    for p, mix in (("3a", Mix(64, 96, 128, 16, 32, 32)), ("3b", Mix(128, 128, 192, 32, 96, 64))):
        x, c = _mix(b, x, f"inception_{p}", c, mix), mix.out
    side = -(-image // 8)  # conv1, pool1 and pool2 each halve the side, rounding up
    x = _pool(b, x, "pool5", side, 1, op="AveragePool")
    x = b.node("Dropout", [x], "drop", ratio=0.4)
    b.node("Softmax", [_head(b, x, c, 1000)], "prob", axis=1)
    return _model(b, "googlenet", image, "prob", 8, [1, 1000])


def unet(image: int) -> onnx.ModelProto:
    """A two-level U-Net of 16-64 channels giving a one-channel mask; `image` a multiple of 4."""
    b = _Builder(11)

    def block(x: str, name: str, cin: int, cout: int) -> str:
        return _conv(b, _conv(b, x, f"{name}.c1", cin, cout, 3), f"{name}.c2", cout, cout, 3)

    enc1 = block("input", "enc1", 3, 16)
    enc2 = block(_pool(b, enc1, "down1", 2, 2), "enc2", 16, 32)
    x = block(_pool(b, enc2, "down2", 2, 2), "mid", 32, 64)
    w = b.normal("up2.w", (64, 32, 2, 2), math.sqrt(2.0 / 64))
    x = b.node("ConvTranspose", [x, w, b.uniform("up2.b", (32,), -0.05, 0.05)], "up2",
               kernel_shape=[2, 2], strides=[2, 2])  # fmt: skip
    x = block(b.node("Concat", [enc2, x], "skip2", axis=1), "dec2", 64, 32)
    # As PyTorch exports nearest upsampling at opset 11: roi is an input there (optional from
    # opset 13) that nearest mode ignores, and the asymmetric/floor pair is F.interpolate's rule
    roi, scales = b.const(np.zeros(0)), b.const(np.array([1.0, 1.0, 2.0, 2.0]))
    x = b.node("Resize", [x, roi, scales], "up1", mode="nearest",
               coordinate_transformation_mode="asymmetric", nearest_mode="floor")  # fmt: skip
    x = _conv(b, x, "up1.proj", 32, 16, 1)
    x = block(b.node("Concat", [enc1, x], "skip1", axis=1), "dec1", 32, 16)
    mask = b.node("Sigmoid", [_conv(b, x, "out", 16, 1, 1, relu=False)], "mask")
    return _model(b, "unet", image, mask, 11, [1, 1, image, image])


def efficientnet(image: int) -> onnx.ModelProto:
    """EfficientNet-B0's stages, BatchNorms folded; Swish written out, as opset 11 has none."""
    b = _Builder(12)

    def swish(x: str, name: str) -> str:
        return b.node("Mul", [x, b.node("Sigmoid", [x], f"{name}.sigmoid")], name)

    def conv_swish(
        x: str, name: str, cin: int, cout: int, k: int, s: int = 1, group: int = 1
    ) -> str:
        y = _conv(b, x, name, cin, cout, k, s, group=group, relu=False)
        return swish(y, f"{name}.swish")

    x = conv_swish("input", "stem", 3, 32, 3, 2)
    c = 32
    for stage, (expand, width, repeats, stride, k) in enumerate(
        ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3),
         (6, 112, 3, 1, 5), (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))
    ):  # fmt: skip
        for i in range(repeats):
            p, s, mid = f"s{stage}.{i}", stride if i == 0 else 1, c * expand
            squeezed = max(1, c // 4)  # SE squeezes to a quarter of the block's input channels
            y = conv_swish(x, f"{p}.expand", c, mid, 1) if expand != 1 else x
            y = conv_swish(y, f"{p}.dw", mid, mid, k, s, group=mid)
            se = b.node("GlobalAveragePool", [y], f"{p}.se.pool")
            se = conv_swish(se, f"{p}.se.reduce", mid, squeezed, 1)
            se = _conv(b, se, f"{p}.se.expand", squeezed, mid, 1, relu=False)
            y = b.node("Mul", [y, b.node("Sigmoid", [se], f"{p}.se.gate")], f"{p}.se")
            y = _conv(b, y, f"{p}.project", mid, width, 1, relu=False)
            x = b.node("Add", [x, y], f"{p}.add") if s == 1 and c == width else y
            c = width
    x = b.node("GlobalAveragePool", [conv_swish(x, "head", c, 1280, 1)], "gap")
    return _model(b, "efficientnet", image, _head(b, x, 1280, 1000), 11, [1, 1000])


MODELS: dict[str, Callable[[int], onnx.ModelProto]] = {
    "alexnet": alexnet,
    "vgg": vgg,
    "inception": inception,
    "squeezenet": squeezenet,
    "shufflenet": shufflenet,
    "densenet": densenet,
    "resnet50": resnet50,
    "transformer": transformer,
    "mobilenet": mobilenet,
    "googlenet": googlenet,
    "unet": unet,
    "efficientnet": efficientnet,
}


def opset_of(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def main() -> None:
    from compiler.frontend.onnx import load_onnx
    from compiler.graph.build_model import build_model
    from tuner.network.timing import OutputMismatch, versus_onnxruntime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-round-s", type=float, default=0.2)
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="keep the compiler's build cache (default: an empty one, so builds are cold)",
    )
    parser.add_argument(
        "--no-conformance", action="store_true", help="skip the ONNX node tests at the end"
    )
    parser.add_argument(
        "--tune-per-task",
        type=int,
        default=0,
        metavar="N",
        help="also tune each model for N trials per task on a local pool (default 0: untuned only)",
    )
    args = parser.parse_args()
    if args.tune_per_task < 0:
        parser.error("--tune-per-task must be >= 0")
    if not args.warm_cache:
        from compiler.toolchain import CACHE_ENV

        cold = tempfile.mkdtemp(prefix="kiln-zoo-cache-")
        atexit.register(shutil.rmtree, cold, ignore_errors=True)
        os.environ[CACHE_ENV] = cold

    pool = None
    if args.tune_per_task:
        pools = contextlib.ExitStack()
        atexit.register(pools.close)
        pool = pools.enter_context(kiln.Pool())
        records_dir = tempfile.mkdtemp(prefix="kiln-zoo-records-")
        atexit.register(shutil.rmtree, records_dir, ignore_errors=True)

    rows = []
    for name in args.models.split(","):
        model = MODELS[name](args.image)
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        feeds = {"input": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        row: dict[str, object] = {
            "model": name,
            "opset": opset_of(model),
            "nodes": len(model.graph.node),
        }
        try:
            t = time.perf_counter()
            graph = load_onnx(model)
            row["import_s"] = time.perf_counter() - t
            t = time.perf_counter()
            built = build_model(graph, None, "host")
            row["build_s"] = time.perf_counter() - t
        except Exception as error:  # a refusal is a row with its reason
            row["note"] = f"{type(error).__name__}: {str(error)[:150]}"
            rows.append(row)
            print(f"{name}: refused: {row['note']}", flush=True)
            continue
        builds = {"untuned": built}
        if pool is not None:
            try:
                builds["tuned"] = tuned_build(
                    pool, graph, name, args.tune_per_task, records_dir, row
                )
            except Exception as error:  # a failed tuning run is a note; the untuned row stands
                row["note"] = f"tuning: {type(error).__name__}: {str(error)[:140]}"
        try:
            result = versus_onnxruntime(model, feeds, builds, args.rounds, args.min_round_s, 1e-3)
            ours = statistics.median(result.ours["untuned"])
            theirs = statistics.median(result.ort)
            row.update(correct=True, ours_ms=ours * 1e3, ort_ms=theirs * 1e3, ratio=theirs / ours)
            if "tuned" in result.ours:
                tuned = statistics.median(result.ours["tuned"])
                row.update(tuned_ms=tuned * 1e3, tuned_ratio=theirs / tuned)
        except OutputMismatch as error:
            row.update(correct=False, note=str(error)[:150])
        rows.append(row)
        print(f"{name}: {row}", flush=True)

    print()
    tuned_head = " trials | tune s | tuned ms | ort/tuned |" if pool is not None else ""
    print(
        f"| {'model':<12} | opset | nodes | import s | build s | correct | ours ms | ort ms | ort/ours |"
        + tuned_head
    )
    print(
        f"|{'-' * 14}|-------|-------|----------|---------|---------|---------|--------|----------|"
        + ("--------|--------|----------|-----------|" if pool is not None else "")
    )

    def cell(r: dict[str, object], key: str, fmt: str) -> str:
        v = r.get(key)
        return format(v, fmt) if isinstance(v, float) else "-".rjust(int(fmt.split(".")[0]))

    for r in rows:

        def f(key: str, fmt: str, r: dict[str, object] = r) -> str:
            return cell(r, key, fmt)

        print(
            f"| {r['model']:<12} | {r['opset']:>5} | {r['nodes']:>5} | {f('import_s', '8.2f')} | "
            f"{f('build_s', '7.1f')} | {r.get('correct', '-')!s:>7} | {f('ours_ms', '7.2f')} | "
            f"{f('ort_ms', '6.2f')} | {f('ratio', '8.2f')} |"
            + (
                f" {r.get('trials', '-')!s:>6} | {f('tune_s', '6.0f')} | {f('tuned_ms', '8.2f')} | "
                f"{f('tuned_ratio', '9.2f')} |"
                if pool is not None
                else ""
            )
        )
        if "note" in r:
            print(f"|   {r['note']}")
    ratios = [v for r in rows if isinstance(v := r.get("ratio"), float)]
    build_s = [v for r in rows if isinstance(v := r.get("build_s"), float)]
    correct = sum(1 for r in rows if r.get("correct") is True)
    conformance = "conformance_pass_pct=nan ops_claimed=nan"
    if not args.no_conformance:
        conformance = run_conformance()
    tuned_line = ""
    if pool is not None:
        tuned_ratios = [v for r in rows if isinstance(v := r.get("tuned_ratio"), float)]
        tuned_line = (
            f" tuned_ratio_geomean={geomean(tuned_ratios):.2f}"
            f" tuned_ratio_min={min(tuned_ratios, default=0.0):.2f}"
        )
    print(
        f"zoo: models={len(rows)} correct={correct} build_s_max={max(build_s, default=0.0):.1f} "
        f"untuned_ratio_geomean={geomean(ratios):.2f} "
        f"untuned_ratio_min={min(ratios, default=0.0):.2f} {conformance}{tuned_line}"
    )


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in values) / len(values)) if values else 0.0


def tuned_build(
    pool: kiln.Pool,
    graph: Graph,
    name: str,
    per_task: int,
    records_dir: str,
    row: dict[str, object],
) -> ModelArtifact:
    """Tune `graph` on `pool` for `per_task` trials per task (one confirmation each, as the
    demo), then build it from those records; the trials and seconds go into `row`."""
    from tuner.network.tune import model_tasks
    from tuner.options import TuneOptions

    tasks, _ = model_tasks(graph)
    records = os.path.join(records_dir, f"{name}.jsonl")
    options = TuneOptions(trials=per_task * max(len(tasks), 1), confirm=1)
    start = time.perf_counter()
    result = kiln.tune_network(pool, graph, options=options, records=records)
    row.update(trials=result.trials, tune_s=time.perf_counter() - start)
    return kiln.build(graph, records)


def run_conformance() -> str:
    """benchmarks/conformance.py in a child process (its table shown); its figures as
    `conformance_pass_pct=<x> ops_claimed=<n>`."""
    script = Path(__file__).with_name("conformance.py")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False, timeout=3600
    )
    print(proc.stdout[-6000:], end="")
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    fields = dict(kv.split("=", 1) for kv in last.split()[1:] if "=" in kv)
    if proc.returncode != 0 or "pass_pct" not in fields:
        print(f"conformance failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return "conformance_pass_pct=nan ops_claimed=nan"
    return f"conformance_pass_pct={fields['pass_pct']} ops_claimed={fields['ops_all_pass']}"


if __name__ == "__main__":
    main()

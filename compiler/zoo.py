"""Reference models built with `onnx.helper` and seeded random weights: no downloads.

Each builder returns an opset-17 `onnx.ModelProto` with the layer shapes and op mix of the real
architecture as an exporter writes it for inference, before any folding:

- `resnet18`: torchvision ResNet-18. Conv (no bias) -> BatchNormalization -> Relu, MaxPool 3x3/2,
  BasicBlocks with 1x1/2 downsample, GlobalAveragePool, Flatten, Gemm (transB=1) to 1000 classes.
- `mobilenet_v2`: torchvision MobileNetV2 (width 1.0). Conv -> BatchNormalization -> Clip(0, 6)
  (min/max as inputs), inverted residuals (expansion 6, depthwise 3x3), residual Adds, 1x1 to 1280,
  GlobalAveragePool, Flatten, Gemm to 1000.
- `bert_tiny`: google/bert_uncased_L-2_H-128_A-2 (HF BertModel). Gather embeddings (word +
  position + token type) + LayerNormalization, 2 encoder layers (hidden 128, 2 heads, FFN 512, Gelu
  in Erf form), a constant additive attention mask; output the last hidden state, and with
  `pooled=True` the pooler output too.

Initializers are named like the framework's parameters (`layer1.0.conv1.weight`,
`encoder.layer.0.attention.self.query.weight`), node outputs like their nodes. Weights are drawn
from `np.random.default_rng(seed)` with He / Xavier scales and BatchNorm statistics close to what
the layer sees, so activations stay O(1) through the depth. The same arguments give byte-identical
models.

    model = resnet18(batch=1, image=224, seed=0)
    export("bert_tiny", "bert.onnx", seed=1)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17; older runtimes reject newer ones
PRODUCER = "kiln.compiler.models"


class _Builder:
    """Collects nodes and initializers of one model, drawing weights from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._constants: dict[tuple[str, bytes, tuple[int, ...]], str] = {}

    def param(self, name: str, array: np.ndarray) -> str:
        """Add `array` as the initializer `name`; returns the name."""
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), name))
        return name

    def const(self, array: np.ndarray | Sequence[int] | float, dtype: type = np.float32) -> str:
        """A shared non-trainable constant (scalar, shape, index), added once per distinct value."""
        a: np.ndarray = np.asarray(array, dtype=dtype)
        key = (a.dtype.str, a.tobytes(), a.shape)
        if key not in self._constants:
            self._constants[key] = self.param(f"const_{len(self._constants)}", a)
        return self._constants[key]

    def normal(self, name: str, shape: Sequence[int], std: float) -> str:
        return self.param(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        return self.param(name, self.rng.uniform(low, high, shape).astype(np.float32))

    def node(
        self, op: str, inputs: Sequence[str], name: str, output: str = "", **attrs: Any
    ) -> str:
        """Add one single-output node `name`; its output value is `output`, by default `name`."""
        out = output or name
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=name, **attrs))
        return out

    def model(
        self,
        name: str,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, list(inputs), list(outputs), self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=PRODUCER,
            ir_version=IR_VERSION,
        )
        onnx.checker.check_model(model, full_check=True)
        return model


def _check_sizes(builder: str, seed: int, **sizes: int) -> None:
    """Raise ValueError naming the first size that is not a positive int, or a bad seed."""
    for key, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{builder}: {key} must be a positive int, got {value!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{builder}: seed must be a non-negative int, got {seed!r}")


# ---------------------------------------------------------------------------------------------
# CNNs


def _conv_bn(
    b: _Builder,
    x: str,
    name: str,
    bn_name: str,
    cin: int,
    cout: int,
    kernel: int,
    stride: int = 1,
    groups: int = 1,
    gamma: tuple[float, float] = (0.8, 1.2),
    after_relu: bool = True,
) -> str:
    """Conv (no bias) -> BatchNormalization with inference statistics.

    The conv weights have variance gain / fan_in, gain 2 (He) where the input went through a
    ReLU (which halves the second moment) and 1 where it is linear (an image, a bottleneck), so
    the conv keeps the scale of the signal; the BatchNorm statistics are near (0, 1), as if the
    layer saw a unit-variance signal, and leave it there.
    """
    fan_in = cin // groups * kernel * kernel
    std = math.sqrt((2.0 if after_relu else 1.0) / fan_in)
    w = b.normal(f"{name}.weight", (cout, cin // groups, kernel, kernel), std)
    pad = kernel // 2
    y = b.node(
        "Conv",
        [x, w],
        name,
        kernel_shape=[kernel, kernel],
        strides=[stride, stride],
        pads=[pad, pad, pad, pad],
        dilations=[1, 1],
        group=groups,
    )
    scale = b.uniform(f"{bn_name}.weight", (cout,), *gamma)
    bias = b.normal(f"{bn_name}.bias", (cout,), 0.05)
    mean = b.normal(f"{bn_name}.running_mean", (cout,), 0.05)
    var = b.uniform(f"{bn_name}.running_var", (cout,), 0.8, 1.2)
    return b.node("BatchNormalization", [y, scale, bias, mean, var], bn_name, epsilon=1e-5)


def _gemm_head(b: _Builder, x: str, channels: int, classes: int) -> str:
    """GlobalAveragePool -> Flatten -> Gemm(transB=1), as torchvision's avgpool + fc export."""
    pooled = b.node("GlobalAveragePool", [x], "avgpool")
    flat = b.node("Flatten", [pooled], "flatten", axis=1)
    w = b.normal("fc.weight", (classes, channels), 1.0 / math.sqrt(channels))
    bias = b.normal("fc.bias", (classes,), 0.01)
    return b.node("Gemm", [flat, w, bias], "fc", "output", alpha=1.0, beta=1.0, transB=1)


def _image_input(batch: int, image: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, image, image])


def _classes_output(batch: int, classes: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, classes])


def resnet18(batch: int = 1, image: int = 224, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 (torchvision layout): input `input` [batch,3,image,image], output [batch,1000].

    Raises:
        ValueError: a non-positive batch or image size, or an image below 32 (the net downsamples
            by 32).
    """
    _check_sizes("resnet18", seed, batch=batch, image=image)
    if image < 32:
        raise ValueError(f"resnet18: image must be >= 32 (it downsamples by 32), got {image}")
    b = _Builder(seed)
    x = _conv_bn(b, "input", "conv1", "bn1", 3, 64, 7, stride=2, after_relu=False)
    x = b.node("Relu", [x], "relu")
    x = b.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for layer, cout in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if layer > 1 and block == 0 else 1
            p = f"layer{layer}.{block}"
            y = _conv_bn(b, x, f"{p}.conv1", f"{p}.bn1", cin, cout, 3, stride)
            y = b.node("Relu", [y], f"{p}.relu1")
            # A small last scale per branch, as trained residual nets have, keeps the sum of 8
            # residual Adds from growing the activations block by block.
            y = _conv_bn(b, y, f"{p}.conv2", f"{p}.bn2", cout, cout, 3, gamma=(0.2, 0.5))
            shortcut = x
            if stride != 1 or cin != cout:
                shortcut = _conv_bn(
                    b, x, f"{p}.downsample.0", f"{p}.downsample.1", cin, cout, 1, stride
                )
            y = b.node("Add", [y, shortcut], f"{p}.add")
            x = b.node("Relu", [y], f"{p}.relu2")
            cin = cout
    _gemm_head(b, x, 512, 1000)
    return b.model("resnet18", [_image_input(batch, image)], [_classes_output(batch, 1000)])


# (expansion t, output channels c, repeats n, first stride s), torchvision's table
MOBILENET_V2_BLOCKS: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def mobilenet_v2(batch: int = 1, image: int = 224, seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 width 1.0 (torchvision layout): input `input` [batch,3,image,image] -> [batch,1000].

    Raises:
        ValueError: a non-positive batch or image size, or an image below 32.
    """
    _check_sizes("mobilenet_v2", seed, batch=batch, image=image)
    if image < 32:
        raise ValueError(f"mobilenet_v2: image must be >= 32 (it downsamples by 32), got {image}")
    b = _Builder(seed)
    zero, six = b.const(0.0), b.const(6.0)

    def relu6(x: str, name: str) -> str:
        return b.node("Clip", [x, zero, six], name)

    x = relu6(
        _conv_bn(b, "input", "features.0.0", "features.0.1", 3, 32, 3, 2, after_relu=False),
        "features.0.2",
    )
    cin, index = 32, 1
    for t, c, n, s in MOBILENET_V2_BLOCKS:
        for i in range(n):
            stride = s if i == 0 else 1
            p, hidden, layer = f"features.{index}.conv", cin * t, 0
            y = x
            if t != 1:
                y = _conv_bn(b, y, f"{p}.0.0", f"{p}.0.1", cin, hidden, 1, after_relu=False)
                y, layer = relu6(y, f"{p}.0.2"), 1
            y = _conv_bn(
                b, y, f"{p}.{layer}.0", f"{p}.{layer}.1", hidden, hidden, 3, stride, hidden
            )
            y = relu6(y, f"{p}.{layer}.2")
            # The linear bottleneck has no activation; a small scale keeps residual sums bounded.
            y = _conv_bn(
                b, y, f"{p}.{layer + 1}", f"{p}.{layer + 2}", hidden, c, 1, gamma=(0.5, 0.8)
            )
            if stride == 1 and cin == c:
                y = b.node("Add", [x, y], f"features.{index}.add")
            x, cin, index = y, c, index + 1
    x = relu6(
        _conv_bn(
            b, x, f"features.{index}.0", f"features.{index}.1", cin, 1280, 1, after_relu=False
        ),
        f"features.{index}.2",
    )
    _gemm_head(b, x, 1280, 1000)
    return b.model("mobilenet_v2", [_image_input(batch, image)], [_classes_output(batch, 1000)])


# ---------------------------------------------------------------------------------------------
# BERT


BERT_VOCAB = 30522
BERT_MAX_POSITIONS = 512
BERT_TYPE_VOCAB = 2


def _linear(b: _Builder, x: str, name: str, fan_in: int, fan_out: int) -> str:
    """MatMul by a [in, out] weight + Add of the bias, as a Linear on a 3-D input exports."""
    w = b.normal(f"{name}.weight", (fan_in, fan_out), math.sqrt(2.0 / (fan_in + fan_out)))
    bias = b.normal(f"{name}.bias", (fan_out,), 0.02)
    y = b.node("MatMul", [x, w], f"{name}.matmul")
    return b.node("Add", [y, bias], f"{name}.add")


def _layer_norm(b: _Builder, x: str, name: str, hidden: int, output: str = "") -> str:
    scale = b.param(f"{name}.weight", (1 + 0.05 * b.rng.standard_normal(hidden)).astype("f4"))
    bias = b.normal(f"{name}.bias", (hidden,), 0.02)
    return b.node("LayerNormalization", [x, scale, bias], name, output, axis=-1, epsilon=1e-12)


def _attention(b: _Builder, x: str, p: str, seq: int, hidden: int, heads: int, mask: str) -> str:
    dh = hidden // heads
    heads_shape = b.const([1, seq, heads, dh], np.int64)

    def split_heads(name: str, perm: list[int]) -> str:
        y = _linear(b, x, f"{p}.self.{name}", hidden, hidden)
        y = b.node("Reshape", [y, heads_shape], f"{p}.self.{name}.reshape")
        return b.node("Transpose", [y], f"{p}.self.{name}.transpose", perm=perm)

    q = split_heads("query", [0, 2, 1, 3])  # [1, heads, seq, dh]
    k = split_heads("key", [0, 2, 3, 1])  # [1, heads, dh, seq]: K transposed for Q @ K^T
    v = split_heads("value", [0, 2, 1, 3])
    scores = b.node("MatMul", [q, k], f"{p}.self.scores")
    scores = b.node("Div", [scores, b.const(math.sqrt(dh))], f"{p}.self.scale")
    scores = b.node("Add", [scores, mask], f"{p}.self.mask")
    probs = b.node("Softmax", [scores], f"{p}.self.softmax", axis=-1)
    ctx = b.node("MatMul", [probs, v], f"{p}.self.context")
    ctx = b.node("Transpose", [ctx], f"{p}.self.context.transpose", perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, b.const([1, seq, hidden], np.int64)], f"{p}.self.merge")
    y = _linear(b, ctx, f"{p}.output.dense", hidden, hidden)
    y = b.node("Add", [y, x], f"{p}.output.residual")
    return _layer_norm(b, y, f"{p}.output.LayerNorm", hidden)


def _gelu(b: _Builder, x: str, name: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)), in the node order HF's exported Gelu has."""
    t = b.node("Div", [x, b.const(math.sqrt(2.0))], f"{name}.div")
    t = b.node("Erf", [t], f"{name}.erf")
    t = b.node("Add", [t, b.const(1.0)], f"{name}.add")
    t = b.node("Mul", [x, t], f"{name}.mul")
    return b.node("Mul", [t, b.const(0.5)], f"{name}.half")


def bert_tiny(
    seq: int = 128,
    seed: int = 0,
    pooled: bool = False,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 2,
    intermediate: int = 512,
) -> onnx.ModelProto:
    """BERT-tiny encoder: input `input_ids` int64 [1,seq] -> `last_hidden_state` [1,seq,hidden].

    No attention-mask input: every position attends (the additive mask is a constant zero), and
    token types are all 0. With `pooled`, a second output `pooler_output` [1,hidden] is
    tanh(dense(hidden state of token 0)).

    Raises:
        ValueError: a non-positive size, seq above 512 positions, or hidden not divisible by heads.
    """
    _check_sizes(
        "bert_tiny",
        seed,
        seq=seq,
        layers=layers,
        hidden=hidden,
        heads=heads,
        intermediate=intermediate,
    )
    if seq > BERT_MAX_POSITIONS:
        raise ValueError(f"bert_tiny: seq must be <= {BERT_MAX_POSITIONS}, got {seq}")
    if hidden % heads:
        raise ValueError(f"bert_tiny: hidden {hidden} is not divisible by heads {heads}")
    b = _Builder(seed)
    e = "embeddings"
    words = b.normal(f"{e}.word_embeddings.weight", (BERT_VOCAB, hidden), 0.02)
    positions = b.normal(f"{e}.position_embeddings.weight", (BERT_MAX_POSITIONS, hidden), 0.02)
    types = b.normal(f"{e}.token_type_embeddings.weight", (BERT_TYPE_VOCAB, hidden), 0.02)
    x = b.node("Gather", [words, "input_ids"], f"{e}.word", axis=0)
    token_types = b.const(np.zeros((1, seq)), np.int64)
    t = b.node("Gather", [types, token_types], f"{e}.token_type", axis=0)
    x = b.node("Add", [x, t], f"{e}.add_token_type")
    position_ids = b.const(np.arange(seq)[None, :], np.int64)
    t = b.node("Gather", [positions, position_ids], f"{e}.position", axis=0)
    x = b.node("Add", [x, t], f"{e}.add_position")
    x = _layer_norm(b, x, f"{e}.LayerNorm", hidden)
    mask = b.const(np.zeros((1, 1, 1, seq)))  # (1 - attention_mask) * min_float for a mask of 1s
    for i in range(layers):
        p = f"encoder.layer.{i}"
        x = _attention(b, x, f"{p}.attention", seq, hidden, heads, mask)
        y = _linear(b, x, f"{p}.intermediate.dense", hidden, intermediate)
        y = _gelu(b, y, f"{p}.intermediate.gelu")
        y = _linear(b, y, f"{p}.output.dense", intermediate, hidden)
        y = b.node("Add", [y, x], f"{p}.output.residual")
        last = "last_hidden_state" if i == layers - 1 else ""
        x = _layer_norm(b, y, f"{p}.output.LayerNorm", hidden, last)
    outputs = [
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, seq, hidden])
    ]
    if pooled:
        first = b.node("Gather", [x, b.const(0, np.int64)], "pooler.first_token", axis=1)
        w = b.normal("pooler.dense.weight", (hidden, hidden), 1.0 / math.sqrt(hidden))
        bias = b.normal("pooler.dense.bias", (hidden,), 0.02)
        y = b.node("Gemm", [first, w, bias], "pooler.dense", transB=1)
        b.node("Tanh", [y], "pooler.activation", "pooler_output")
        outputs.append(
            helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, [1, hidden])
        )
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])
    return b.model("bert_tiny", [ids], outputs)


# ---------------------------------------------------------------------------------------------
# Registry and export

MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet18": resnet18,
    "mobilenet_v2": mobilenet_v2,
    "bert_tiny": bert_tiny,
}


def options(name: str) -> dict[str, Any]:
    """The keyword arguments the builder of model `name` takes, with their defaults."""
    params = inspect.signature(_builder(name)).parameters.values()
    return {p.name: p.default for p in params}


def _builder(name: str) -> Callable[..., onnx.ModelProto]:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def build(name: str, **kw: Any) -> onnx.ModelProto:
    """Build model `name` with the builder's keyword arguments.

    Raises:
        ValueError: an unknown model or an argument its builder does not take (both named).
    """
    unknown = sorted(set(kw) - set(options(name)))
    if unknown:
        raise ValueError(
            f"model {name!r} takes no argument {', '.join(unknown)} "
            f"(it takes {', '.join(options(name))})"
        )
    return _builder(name)(**kw)


def export(name: str, path: str | Path, **kw: Any) -> Path:
    """Build model `name` (see `build`) and write it to `path` as an .onnx file; returns the path."""
    model = build(name, **kw)
    out = Path(path)
    onnx.save_model(model, str(out))
    return out


def parameter_count(model: onnx.ModelProto, exclude_suffixes: Sequence[str] = ()) -> int:
    """Number of float elements in the model's float initializers, minus those ending in a suffix.

    `exclude_suffixes=(".running_mean", ".running_var")` counts what a framework calls parameters
    (BatchNorm statistics are buffers there); the builders' shared constants are excluded always.
    """
    total = 0
    for init in model.graph.initializer:
        if init.data_type != TensorProto.FLOAT or init.name.startswith("const_"):
            continue
        if any(init.name.endswith(s) for s in exclude_suffixes):
            continue
        total += math.prod(init.dims)
    return total

"""The ONNX front end: every supported op imported from a one-node model and run with the graph's
numpy references, against `onnx.reference.ReferenceEvaluator`; bad models give clear errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler.frontend import OnnxImportError, from_onnx, load_onnx, supported_ops
from compiler.graph import GraphError, run_reference

RNG = np.random.default_rng(7)
BIG = np.iinfo(np.int64).max


def rand(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def ints(*values: int) -> np.ndarray:
    return np.asarray(values, np.int64)


class Init:
    """A node input given as an initializer (a constant) rather than a graph input."""

    def __init__(self, value: np.ndarray | np.generic) -> None:
        self.value = np.asarray(value)


@dataclass
class Case:
    op: str
    inputs: list[np.ndarray | Init | None]  # None: an omitted optional input ("")
    attrs: dict[Any, Any] = field(default_factory=dict)
    outputs: int = 1
    opset: int = 17
    oracle: str = "reference"  # or "onnxruntime" where the ReferenceEvaluator lacks the case


def build(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model for `case` and its feeds."""
    names, graph_inputs, inits, feeds = [], [], [], {}
    for i, value in enumerate(case.inputs):
        if value is None:
            names.append("")
        elif isinstance(value, Init):
            names.append(f"c{i}")
            inits.append(numpy_helper.from_array(value.value, f"c{i}"))
        else:
            names.append(f"in{i}")
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(f"in{i}", elem, value.shape))
            feeds[f"in{i}"] = value
    outs = [f"out{k}" for k in range(case.outputs)]
    node = helper.make_node(case.op, names, outs, name="n0", **case.attrs)
    out_infos = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs]
    graph = helper.make_graph([node], "case", graph_inputs, out_infos, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    return model, feeds


X4 = rand(2, 4, 9, 9)
CASES: dict[str, Case] = {
    # -- Conv
    "conv-basic": Case("Conv", [X4, Init(rand(6, 4, 3, 3))]),
    "conv-pads-bias": Case(
        "Conv", [X4, Init(rand(6, 4, 3, 3)), Init(rand(6))], {"pads": [1, 0, 2, 1]}
    ),
    "conv-stride-dilation": Case(
        "Conv", [X4, Init(rand(6, 4, 3, 3))], {"strides": [2, 1], "dilations": [2, 2]}
    ),
    "conv-groups": Case("Conv", [X4, Init(rand(6, 2, 3, 3))], {"group": 2, "pads": [1] * 4}),
    "conv-depthwise": Case("Conv", [X4, Init(rand(4, 1, 3, 3))], {"group": 4, "strides": [2, 2]}),
    "conv-same-upper": Case(
        "Conv", [X4, Init(rand(6, 4, 4, 4))], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}
    ),
    "conv-same-lower": Case("Conv", [X4, Init(rand(6, 4, 4, 2))], {"auto_pad": "SAME_LOWER"}),
    "conv-valid-1x1": Case("Conv", [X4, Init(rand(8, 4, 1, 1))], {"auto_pad": "VALID"}),
    # -- ConvTranspose
    "convt-basic": Case("ConvTranspose", [X4, Init(rand(4, 3, 3, 3))]),
    "convt-stride-pads": Case(
        "ConvTranspose",
        [X4, Init(rand(4, 3, 3, 3)), Init(rand(3))],
        {"strides": [2, 2], "pads": [1, 0, 1, 2]},
    ),
    "convt-output-padding": Case(
        "ConvTranspose",
        [X4, Init(rand(4, 2, 3, 3))],
        {"strides": [2, 3], "output_padding": [1, 2]},
    ),
    "convt-groups": Case(
        "ConvTranspose", [X4, Init(rand(4, 3, 2, 3))], {"group": 2}, oracle="onnxruntime"
    ),
    "convt-groups-dilations": Case(
        "ConvTranspose",
        [X4, Init(rand(4, 3, 2, 3))],
        {"group": 2, "dilations": [2, 1]},
        oracle="onnxruntime",  # the ReferenceEvaluator fails on grouped ConvTranspose
    ),
    "convt-same-upper": Case(
        "ConvTranspose",
        [X4, Init(rand(4, 3, 4, 4))],
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    ),
    "convt-output-shape": Case(
        "ConvTranspose",
        [X4, Init(rand(4, 3, 3, 3))],
        {"strides": [2, 2], "output_shape": [18, 18], "auto_pad": "SAME_UPPER"},
    ),
    # -- ConvTranspose 1-D / 3-D, Resize, Upsample, Einsum (tests/unit/test_resample_ops.py)
    "convt-1d": Case("ConvTranspose", [rand(2, 4, 7), Init(rand(4, 3, 3))], {"strides": [2]}),
    "convt-3d": Case("ConvTranspose", [rand(1, 2, 3, 4, 3), Init(rand(2, 2, 2, 3, 2))]),
    "resize-linear": Case(
        "Resize", [X4, None, Init(np.asarray([1, 1, 0.6, 1.7], np.float32))], {"mode": "linear"}
    ),
    "resize-cubic-sizes": Case(
        "Resize", [X4, None, None, Init(ints(2, 4, 5, 13))], {"mode": "cubic"}, opset=19
    ),
    "resize-nearest-axes": Case(
        "Resize",
        [X4, None, Init(np.asarray([2.5], np.float32))],
        {"axes": [3], "nearest_mode": "ceil"},
        opset=19,
    ),
    "upsample-9": Case("Upsample", [X4, Init(np.asarray([1, 1, 2, 3], np.float32))], opset=9),
    "einsum-matmul": Case("Einsum", [rand(2, 3, 4), rand(2, 4, 5)], {"equation": "bij,bjk->bik"}),
    "einsum-diagonal-sum": Case("Einsum", [rand(3, 4, 4)], {"equation": "...ii->..."}),
    # -- Gemm / MatMul
    "gemm-basic": Case("Gemm", [rand(3, 5), Init(rand(5, 4))]),
    "gemm-trans-alpha-beta": Case(
        "Gemm",
        [rand(5, 3), Init(rand(4, 5)), Init(rand(4))],
        {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0},
    ),
    "gemm-bias-matrix": Case("Gemm", [rand(3, 5), Init(rand(5, 4)), Init(rand(3, 4))]),
    "gemm-bias-scalar": Case("Gemm", [rand(3, 5), Init(rand(5, 4)), Init(rand(1))]),
    "gemm-bias-row": Case("Gemm", [rand(3, 5), Init(rand(5, 4)), Init(rand(1, 4))], {"beta": 3.0}),
    "gemm-dynamic-b": Case(
        "Gemm", [rand(3, 5), rand(4, 5), rand(3, 4)], {"transB": 1, "alpha": 2.0, "beta": 0.5}
    ),
    "gemm-dynamic-c": Case("Gemm", [rand(3, 5), Init(rand(5, 4)), rand(4)], {"beta": 0.25}),
    "matmul-2d": Case("MatMul", [rand(3, 5), Init(rand(5, 4))]),
    "matmul-batched": Case("MatMul", [rand(2, 3, 5), rand(5, 4)]),
    "matmul-broadcast": Case("MatMul", [rand(2, 1, 3, 5), rand(3, 5, 4)]),
    "matmul-vector": Case("MatMul", [rand(5), rand(2, 5, 4)]),
    # -- normalization, pooling, softmax
    "batchnorm-4d": Case(
        "BatchNormalization",
        [X4, Init(rand(4)), Init(rand(4)), Init(rand(4)), Init(rand(4, low=0.1))],
        {"epsilon": 1e-3},
    ),
    "batchnorm-2d": Case(
        "BatchNormalization", [rand(3, 4), rand(4), rand(4), rand(4), rand(4, low=0.1)]
    ),
    "layernorm-last": Case(
        "LayerNormalization", [rand(2, 3, 8), Init(rand(8)), Init(rand(8))], {"epsilon": 1e-3}
    ),
    "layernorm-axis1-nobias": Case("LayerNormalization", [rand(2, 3, 4), rand(3, 4)], {"axis": 1}),
    "softmax-last": Case("Softmax", [rand(2, 3, 5)]),
    "softmax-axis1": Case("Softmax", [rand(2, 3, 5)], {"axis": 1}),
    "softmax-axis-neg3": Case("Softmax", [rand(2, 3, 5)], {"axis": -3}),
    "maxpool-2x2": Case("MaxPool", [X4], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "maxpool-3x3-pads": Case(
        "MaxPool", [X4], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    ),
    "maxpool-ceil": Case(
        "MaxPool", [rand(1, 2, 8, 7)], {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}
    ),
    "maxpool-ceil-pads": Case(
        "MaxPool",
        [rand(1, 2, 7, 7)],
        {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    "maxpool-dilations": Case("MaxPool", [X4], {"kernel_shape": [2, 3], "dilations": [2, 2]}),
    "maxpool-same-upper": Case(
        "MaxPool", [X4], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}
    ),
    "maxpool-same-lower": Case("MaxPool", [X4], {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    "avgpool-exclude-pad": Case(
        "AveragePool", [X4], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    ),
    "avgpool-include-pad": Case(
        "AveragePool",
        [X4],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 2, 2, 1], "count_include_pad": 1},
    ),
    "avgpool-ceil": Case(
        "AveragePool",
        [rand(1, 2, 8, 7)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    ),
    "avgpool-ceil-include-pad": Case(
        "AveragePool",
        [rand(1, 2, 8, 8)],
        {
            "kernel_shape": [3, 3],
            "strides": [2, 2],
            "pads": [1, 1, 1, 1],
            "ceil_mode": 1,
            "count_include_pad": 1,
        },
    ),
    "avgpool-same-upper": Case(
        "AveragePool", [X4], {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}
    ),
    "avgpool-dilations": Case(
        "AveragePool", [X4], {"kernel_shape": [2, 2], "dilations": [2, 3]}, opset=19
    ),
    "globalavgpool": Case("GlobalAveragePool", [X4]),
    # -- elementwise
    "relu": Case("Relu", [rand(3, 4)]),
    "sigmoid": Case("Sigmoid", [rand(3, 4, low=-30, high=30)]),
    "tanh": Case("Tanh", [rand(3, 4)]),
    "erf": Case("Erf", [rand(3, 4)]),
    "sqrt": Case("Sqrt", [rand(3, 4, low=0.0)]),
    "exp": Case("Exp", [rand(3, 4)]),
    "neg": Case("Neg", [rand(3, 4)]),
    "hardswish": Case("HardSwish", [rand(3, 4, low=-5, high=5)]),
    "clip-min-max": Case("Clip", [rand(3, 4), Init(np.float32(-0.5)), Init(np.float32(0.7))]),
    "clip-min-only": Case("Clip", [rand(3, 4), Init(np.float32(0.1))]),
    "clip-max-only": Case("Clip", [rand(3, 4), None, Init(np.float32(0.2))]),
    "clip-none": Case("Clip", [rand(3, 4)], opset=13),
    "add-same": Case("Add", [rand(2, 3), rand(2, 3)]),
    "add-broadcast": Case("Add", [rand(2, 3, 4), Init(rand(4))]),
    "sub-broadcast-both": Case("Sub", [rand(2, 1, 4), rand(3, 1)]),
    "mul-scalar": Case("Mul", [rand(2, 3), Init(np.float32(3.0))]),
    "div-broadcast": Case("Div", [rand(4, 1, 3), rand(2, 1, low=0.5)]),
    "pow-positive": Case("Pow", [rand(3, 4, low=0.1), rand(3, 4)]),
    "pow-int-exponent": Case("Pow", [rand(3, 4), Init(np.int64(3))]),
    "cast-float-int": Case("Cast", [rand(3, 4, low=-9, high=9)], {"to": TensorProto.INT32}),
    "cast-int-float": Case("Cast", [ints(1, -2, 3)], {"to": TensorProto.FLOAT}),
    # -- shapes
    "reshape-minus1-zero": Case("Reshape", [rand(2, 3, 4), Init(ints(0, -1))]),
    "reshape-allowzero": Case("Reshape", [rand(2, 3, 4), Init(ints(4, 3, 2))], {"allowzero": 1}),
    "flatten-axis1": Case("Flatten", [rand(2, 3, 4)]),
    "flatten-axis0": Case("Flatten", [rand(2, 3, 4)], {"axis": 0}),
    "flatten-axis-neg1": Case("Flatten", [rand(2, 3, 4)], {"axis": -1}),
    "squeeze-axes": Case("Squeeze", [rand(1, 3, 1, 4), Init(ints(-2))]),
    "squeeze-all": Case("Squeeze", [rand(1, 3, 1, 4)]),
    "unsqueeze": Case("Unsqueeze", [rand(3, 4), Init(ints(0, -1))]),
    "transpose-perm": Case("Transpose", [rand(2, 3, 4)], {"perm": [1, 2, 0]}),
    "transpose-default": Case("Transpose", [rand(2, 3, 4)]),
    "concat-axis1": Case("Concat", [rand(2, 3), rand(2, 1), Init(rand(2, 2))], {"axis": 1}),
    "concat-axis-neg": Case("Concat", [rand(2, 3, 4), rand(2, 3, 4)], {"axis": -3}),
    "split-sizes": Case("Split", [rand(2, 7), Init(ints(2, 5))], {"axis": 1}, outputs=2),
    "split-equal": Case("Split", [rand(6, 3)], outputs=3),
    "split-num-outputs": Case(
        "Split", [rand(2, 7)], {"axis": -1, "num_outputs": 3}, outputs=3, opset=18
    ),
    "slice-basic": Case("Slice", [rand(5, 6), Init(ints(1, 2)), Init(ints(4, 5))]),
    "slice-negative": Case("Slice", [rand(5, 6), Init(ints(-3)), Init(ints(-1)), Init(ints(-1))]),
    "slice-clamped": Case(
        "Slice", [rand(5, 6), Init(ints(-100, 2)), Init(ints(BIG, 100)), Init(ints(0, 1))]
    ),
    "slice-steps": Case(
        "Slice",
        [rand(5, 6), Init(ints(0, 5)), Init(ints(5, 0)), Init(ints(0, 1)), Init(ints(2, -2))],
    ),
    "slice-reverse-all": Case(
        "Slice", [rand(5, 6), Init(ints(-1)), Init(ints(-BIG)), Init(ints(1)), Init(ints(-1))]
    ),
    "gather-negative": Case("Gather", [rand(5, 3), Init(ints(0, -1, 2, -5))]),
    "gather-axis1-2d": Case(
        "Gather", [rand(2, 5, 3), Init(np.asarray([[1, -2], [0, 4]], np.int64))], {"axis": 1}
    ),
    "gather-dynamic-indices": Case(
        "Gather", [rand(4, 6), np.asarray([3, -1, 0], np.int32)], {"axis": -1}
    ),
    "pad-constant": Case("Pad", [rand(2, 3), Init(ints(1, 0, 2, 3)), Init(np.float32(1.5))]),
    "pad-reflect": Case(
        "Pad", [rand(1, 2, 4, 5), Init(ints(0, 0, 2, 1, 0, 0, 1, 3))], {"mode": "reflect"}
    ),
    "pad-edge": Case("Pad", [rand(3, 4), Init(ints(2, 1, 0, 2))], {"mode": "edge"}),
    "pad-wrap": Case("Pad", [rand(3, 4), Init(ints(1, 2, 2, 1))], {"mode": "wrap"}, opset=19),
    "pad-negative": Case(
        "Pad", [rand(4, 5), Init(ints(-1, 2, 1, -2))], oracle="onnxruntime"
    ),  # the ReferenceEvaluator refuses negative pads
    "pad-axes": Case(
        "Pad", [rand(2, 3, 4), Init(ints(1, 2, 3, 0)), None, Init(ints(0, -1))], opset=18
    ),
    "reducemean-attr": Case("ReduceMean", [rand(2, 3, 4)], {"axes": [1], "keepdims": 0}, opset=13),
    "reducemean-input": Case("ReduceMean", [rand(2, 3, 4), Init(ints(-1, 0))], opset=18),
    "reducemean-all": Case("ReduceMean", [rand(2, 3, 4)], {"keepdims": 1}, opset=18),
    "reducesum-axes": Case("ReduceSum", [rand(2, 3, 4), Init(ints(1, 2))], {"keepdims": 0}),
    "reducesum-all": Case("ReduceSum", [rand(2, 3, 4)]),
    "reducesum-noop": Case("ReduceSum", [rand(2, 3, 4)], {"noop_with_empty_axes": 1}),
    # -- beyond the issue's list
    "abs": Case("Abs", [rand(3, 4)]),
    "reciprocal": Case("Reciprocal", [rand(3, 4, low=0.5)]),
    "leakyrelu": Case("LeakyRelu", [rand(3, 4)], {"alpha": 0.2}),
    "hardsigmoid": Case("HardSigmoid", [rand(3, 4, low=-6, high=6)], {"alpha": 0.3}),
    "gelu": Case("Gelu", [rand(3, 4)], opset=20),
    "gelu-tanh": Case("Gelu", [rand(3, 4)], {"approximate": "tanh"}, opset=20),
    "max-variadic": Case("Max", [rand(2, 3), rand(3), Init(rand(2, 1))]),
    "min-single": Case("Min", [rand(2, 3)]),
    "equal": Case("Equal", [ints(1, 2, 3), Init(ints(1, 0, 3))]),
    "less-broadcast": Case("Less", [rand(2, 3), rand(3)]),
    "greater": Case("Greater", [rand(2, 3), Init(np.float32(0.0))]),
    "where": Case("Where", [rand(2, 3) > 0, rand(2, 3), Init(rand(3))]),
    # -- rounding, trigonometry, float tests, bits, mod (tests/unit/test_elementwise_math_ops.py)
    **{
        op.lower(): Case(op, [rand(3, 4, low=-0.99, high=0.99)], opset=22)
        for op in ("Floor", "Ceil", "Round", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan")
    },
    **{op.lower(): Case(op, [rand(3, 4, low=-0.99, high=0.99)]) for op in ("Sinh", "Cosh")},
    **{op.lower(): Case(op, [rand(3, 4, low=-0.99, high=0.99)]) for op in ("Asinh", "Atanh")},
    "acosh": Case("Acosh", [rand(3, 4, low=1.0, high=5.0)]),
    "isnan": Case("IsNaN", [np.array([1.0, np.nan, np.inf], np.float32)], opset=20),
    "isinf-positive": Case(
        "IsInf", [np.array([-np.inf, np.nan, np.inf], np.float32)], {"detect_negative": 0}
    ),
    "bitwise-and": Case("BitwiseAnd", [ints(5, -3, 12), Init(ints(3, 6, -1))], opset=18),
    "bitwise-or": Case("BitwiseOr", [ints(5, -3, 12), ints(3)], opset=18),
    "bitwise-xor": Case("BitwiseXor", [ints(5, -3, 12), ints(3, 6, -1)], opset=18),
    "bitwise-not": Case("BitwiseNot", [ints(5, -3, 0)], opset=18),
    "mod-int": Case("Mod", [ints(7, -7, 7, -7), ints(3, 3, -3, -3)]),
    "mod-fmod": Case("Mod", [rand(2, 3), Init(np.float32(0.7))], {"fmod": 1}),
    "bitshift-left": Case(
        "BitShift",
        [np.array([1, 16, 255], np.uint8), np.array([3, 2, 1], np.uint8)],
        {"direction": "LEFT"},
    ),
    # -- index ops (tests/unit/test_index_ops.py)
    "argmax": Case("ArgMax", [rand(3, 4, 5)], {"axis": 1, "select_last_index": 1}),
    "argmin": Case("ArgMin", [rand(3, 4)], {"keepdims": 0}),
    "topk": Case("TopK", [rand(3, 6), Init(ints(2))], {"largest": 0}, outputs=2),
    "hardmax": Case("Hardmax", [rand(3, 4)], {"axis": 0}),
    "cumsum": Case("CumSum", [rand(3, 4), Init(np.int32(1))], {"reverse": 1}),
    "trilu": Case("Trilu", [rand(2, 3, 4), Init(np.int64(-1))], {"upper": 0}),
    "eyelike": Case("EyeLike", [rand(3, 4)], {"k": 1}),
    "onehot": Case("OneHot", [ints(0, -1, 5), Init(np.float32(4)), Init(rand(2))], {"axis": 0}),
    "gather-elements": Case("GatherElements", [rand(3, 4), ints(0, -1, 2, 1).reshape(1, 4)]),
    "mvn": Case("MeanVarianceNormalization", [rand(2, 3, 4, 5)]),
    # -- composites (compiler/frontend/onnx_ops_composite.py)
    "sum-variadic": Case("Sum", [rand(2, 3), rand(3), Init(rand(2, 1))]),
    "sum-one": Case("Sum", [rand(2, 3)]),
    "mean-variadic": Case("Mean", [rand(2, 3), Init(rand(2, 3)), rand(1, 3)]),
    "prelu-channel": Case("PRelu", [X4, Init(rand(4, 1, 1))]),
    "elu": Case("Elu", [rand(2, 3)], {"alpha": 0.5}),
    "selu": Case("Selu", [rand(2, 3)]),
    "celu": Case("Celu", [rand(2, 3)], {"alpha": 2.0}),
    "thresholded-relu": Case("ThresholdedRelu", [rand(2, 3)], {"alpha": 0.5}),
    "softsign": Case("Softsign", [rand(2, 3)]),
    "sign": Case("Sign", [np.asarray([[-2.0, 0.0, 3.0]], np.float32)]),
    "greater-or-equal": Case("GreaterOrEqual", [rand(2, 3).round(), Init(np.float32(0.0))]),
    "less-or-equal": Case("LessOrEqual", [rand(2, 3).round(), rand(3).round()]),
    "instance-norm": Case(
        "InstanceNormalization", [X4, Init(rand(4)), Init(rand(4))], {"epsilon": 1e-3}
    ),
    # onnx's ReferenceEvaluator sums only the first channel's window here; onnxruntime (and
    # onnx's own node tests, tests/system/test_onnx_conformance.py) follow the spec.
    "lrn": Case(
        "LRN", [X4], {"size": 3, "alpha": 1e-3, "beta": 0.75, "bias": 2.0}, oracle="onnxruntime"
    ),
    "tile": Case("Tile", [rand(2, 3), Init(ints(2, 3))]),
    "maxpool-1d": Case("MaxPool", [rand(2, 3, 11)], {"kernel_shape": [3], "strides": [2]}),
    "maxpool-1d-same": Case(  # onnx's ReferenceEvaluator fails on 1-D SAME pads
        "MaxPool",
        [rand(2, 3, 10)],
        {"kernel_shape": [4], "auto_pad": "SAME_UPPER"},
        oracle="onnxruntime",
    ),
    "avgpool-1d-pads": Case(
        "AveragePool", [rand(2, 3, 9)], {"kernel_shape": [3], "pads": [1, 2], "strides": [2]}
    ),
    "matmul-1d-2d": Case("MatMul", [rand(4), rand(4, 3)]),
    "matmul-3d-1d": Case("MatMul", [rand(2, 3, 4), Init(rand(4))]),
    "matmul-1d-1d": Case("MatMul", [rand(5), rand(5)]),
    "log": Case("Log", [rand(2, 3, low=0.1)]),
    "softplus": Case("Softplus", [rand(2, 3)]),
    "mish": Case("Mish", [rand(2, 3)], opset=18),
    "log-softmax": Case("LogSoftmax", [rand(2, 3, 4)], {"axis": 1}),
    "reduce-min": Case("ReduceMin", [rand(2, 3, 4)], {"axes": [1], "keepdims": 0}),
    "reduce-prod": Case("ReduceProd", [rand(2, 3, 4), Init(ints(0, -1))], opset=18),
    "reduce-l1": Case("ReduceL1", [rand(2, 3, 4), Init(ints(-1))], opset=18),
    "reduce-l2": Case("ReduceL2", [rand(2, 3, 4), Init(ints(0, 2))], opset=18),
    "reduce-sum-square": Case("ReduceSumSquare", [rand(2, 3, 4)], {"keepdims": 0}),
    "reduce-log-sum": Case("ReduceLogSum", [rand(2, 3, low=0.1), Init(ints(1))], opset=18),
    "reduce-log-sum-exp": Case("ReduceLogSumExp", [rand(2, 3, 4)], {"axes": [2]}),
    "not": Case("Not", [rand(2, 3) > 0]),
    "and": Case("And", [rand(2, 3) > 0, rand(3) > 0]),
    "or": Case("Or", [rand(2, 3) > 0, Init(rand(2, 1) > 0)]),
    "xor": Case("Xor", [rand(2, 3) > 0, rand(2, 3) > 0]),
    "shrink": Case("Shrink", [rand(2, 3)], {"lambd": 0.7, "bias": 0.2}),
    "depth-to-space-dcr": Case("DepthToSpace", [rand(1, 8, 2, 3)], {"blocksize": 2}),
    "depth-to-space-crd": Case("DepthToSpace", [rand(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}),
    "space-to-depth": Case("SpaceToDepth", [rand(1, 2, 4, 6)], {"blocksize": 2}),
    "size": Case("Size", [rand(2, 3, 4)]),
    "expand": Case("Expand", [rand(3, 1), Init(ints(2, 1, 4))]),
    "reducemax": Case("ReduceMax", [rand(2, 3, 4), Init(ints(1))], {"keepdims": 0}, opset=18),
    "reducemax-attr": Case("ReduceMax", [rand(2, 3, 4)], {"axes": [0, 2]}, opset=13),
    "globalmaxpool": Case("GlobalMaxPool", [X4]),
    "range": Case("Range", [Init(np.int64(1)), Init(np.int64(10)), Init(np.int64(3))]),
    # -- evaluated at import
    "shape": Case("Shape", [rand(2, 3, 4)]),
    "shape-start-end": Case("Shape", [rand(2, 3, 4)], {"start": 1, "end": -1}),
    "constant-tensor": Case("Constant", [], {"value": numpy_helper.from_array(rand(2, 3))}),
    "constant-floats": Case("Constant", [], {"value_floats": [1.0, 2.5]}),
    "constant-ints": Case("Constant", [], {"value_ints": [4, 5]}),
    "constantofshape": Case(
        "ConstantOfShape",
        [Init(ints(2, 3))],
        {"value": numpy_helper.from_array(np.asarray([2.5], np.float32))},
    ),
    "constantofshape-default": Case("ConstantOfShape", [Init(ints(3))]),
    "identity": Case("Identity", [rand(2, 3)]),
    "dropout": Case("Dropout", [rand(2, 3)]),
    "dropout-mask": Case("Dropout", [rand(2, 3)], outputs=2),
}


def _check_against_onnx(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], oracle: str = "reference"
) -> None:
    graph = load_onnx(model)
    graph.verify()
    ours = run_reference(graph, feeds)
    if oracle == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        typed = onnx.shape_inference.infer_shapes(model)  # onnxruntime wants typed outputs
        session = ort.InferenceSession(
            typed.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        theirs = session.run(None, feeds)
    else:
        theirs = ReferenceEvaluator(model).run(None, feeds)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        b = np.asarray(b)
        assert a.shape == b.shape
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_onnx_reference(name: str) -> None:
    model, feeds = build(CASES[name])
    _check_against_onnx(model, feeds, CASES[name].oracle)


def test_conv_weight_must_be_known_at_build_time_and_the_error_names_it() -> None:
    model, _ = build(Case("Conv", [X4, rand(6, 4, 3, 3)]))
    with pytest.raises(OnnxImportError, match="must be a constant") as error:
        load_onnx(model)
    assert error.value.needs_constant == "in1"  # a backend binds it at run time


def test_lrn_even_size_follows_the_spec() -> None:
    """An even window takes one more channel after than before (onnxruntime refuses even sizes)."""
    size, alpha, beta, bias = 4, 0.5, 0.75, 2.0
    model, feeds = build(
        Case("LRN", [X4], {"size": size, "alpha": alpha, "beta": beta, "bias": bias})
    )
    x = feeds["in0"]
    channels = x.shape[1]
    square_sum = np.zeros_like(x)
    for c in range(channels):
        lo, hi = max(0, c - (size - 1) // 2), min(channels - 1, c + size // 2)
        square_sum[:, c] = (x[:, lo : hi + 1] ** 2).sum(axis=1)
    want = x / (bias + alpha / size * square_sum) ** beta
    np.testing.assert_allclose(run_reference(load_onnx(model), feeds)[0], want, rtol=1e-5)


def test_every_supported_op_has_a_case() -> None:
    covered = {c.op for c in CASES.values()}
    assert set(supported_ops()) <= covered


# -- lowering choices ------------------------------------------------------------------------------


def test_gemm_with_constant_weight_becomes_dense_with_folded_bias() -> None:
    model, _ = build(CASES["gemm-trans-alpha-beta"])
    graph = load_onnx(model)
    dense = [n for n in graph.nodes if n.op == "dense"]
    assert len(dense) == 1 and len(dense[0].inputs) == 3
    w, b = dense[0].inputs[1:]
    assert graph.types[w].shape == (5, 4) and graph.types[b].shape == (4,)
    assert {n.op for n in graph.nodes} == {"transpose", "dense"}  # transA stays a node


def test_gemm_with_computed_weight_becomes_matmul_mul_add() -> None:
    model, _ = build(CASES["gemm-dynamic-b"])
    assert sorted(n.op for n in load_onnx(model).nodes) == [
        "add",
        "matmul",
        "mul",
        "mul",
        "transpose",
    ]


def test_shape_subgraph_folds_into_a_static_reshape() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="batch", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], name="cat", axis=0),
        helper.make_node("Reshape", ["r", "target"], ["y"], name="reshape"),
    ]
    inits = [
        numpy_helper.from_array(np.asarray(0, np.int64), "zero"),
        numpy_helper.from_array(ints(0), "axes0"),
        numpy_helper.from_array(ints(-1), "minus1"),
    ]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 12])
    model = helper.make_model(
        helper.make_graph(nodes, "dyn", [x_info], [y_info], inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    graph = load_onnx(model, input_shapes={"x": (5, 3, 4)})
    assert [(n.op, n.attrs) for n in graph.nodes] == [("relu", {}), ("reshape", {"shape": (5, 12)})]
    assert graph.constants == {}  # the shape-only initializers are not left behind
    assert graph.outputs == ["y"] and graph.nodes[0].outputs == ["r"]  # ONNX names kept
    x = rand(5, 3, 4)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(run_reference(graph, {"x": x})[0], np.asarray(want))


def test_load_from_path_and_bytes(tmp_path: Path) -> None:
    model, _ = build(CASES["conv-pads-bias"])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    for source in (path, str(path), model.SerializeToString()):
        graph = load_onnx(source)
        assert [n.op for n in graph.nodes] == ["conv2d"]
        assert set(graph.constants) == {"c1", "c2"}
    assert from_onnx(model).types["out0"].shape == (2, 6, 10, 8)


# -- bad models -----------------------------------------------------------------------------------


def _one_node_model(node: onnx.NodeProto, opset: int = 17) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "bad", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_unsupported_op_names_node_op_opset_and_supported_list() -> None:
    model = _one_node_model(helper.make_node("Unique", ["x"], ["y"], name="conv3"))
    with pytest.raises(OnnxImportError) as e:
        load_onnx(model)
    msg = str(e.value)
    assert "node 'conv3' (op 'Unique', opset 17): unsupported op" in msg
    assert "Conv" in msg and "MatMul" in msg


def test_an_opset_1_model_imports_through_the_converter() -> None:
    model = _one_node_model(helper.make_node("Relu", ["x"], ["y"]), opset=1)
    model.ir_version = 3
    _check_against_onnx(model, {"x": rand(2, 3)})


def _old_model(
    node: onnx.NodeProto, inputs: dict[str, np.ndarray], opset: int
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    values = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in inputs.items()
    ]
    y = helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "old", values, [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7  # what onnxruntime accepts for these opsets
    return model, inputs


OLD_OPSET_CASES = {
    # Before opset 13 Softmax coerced its input to 2-D at `axis`: over axes 1 and 2 here.
    "softmax-11-coerced": (helper.make_node("Softmax", ["x"], ["y"], axis=1), 11),
    "pad-10-attribute": (helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 0, 0, 2, 1]), 10),
    "slice-9-attributes": (
        helper.make_node("Slice", ["x"], ["y"], starts=[0, 1], ends=[2, 3], axes=[0, 2]),
        9,
    ),
    "squeeze-11-axes": (helper.make_node("Squeeze", ["x"], ["y"], axes=[0]), 11),
    "unsqueeze-11-axes": (helper.make_node("Unsqueeze", ["x"], ["y"], axes=[1]), 11),
    "clip-10-bounds": (helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.25), 10),
    "reducesum-12-axes": (helper.make_node("ReduceSum", ["x"], ["y"], axes=[2], keepdims=0), 12),
}


@pytest.mark.parametrize("name", sorted(OLD_OPSET_CASES))
def test_old_opsets_import_through_the_version_converter(name: str) -> None:
    node, opset = OLD_OPSET_CASES[name]
    x = rand(1, 3, 4) if name.startswith("squeeze") else rand(2, 3, 4)
    model, feeds = _old_model(node, {"x": x}, opset)
    _check_against_onnx(model, feeds, oracle="onnxruntime")


def test_a_model_the_converter_cannot_bring_forward_names_its_opset() -> None:
    # ImageScaler (experimental, gone since opset 10) has no schema the converter can map
    node = helper.make_node("ImageScaler", ["x"], ["y"], scale=2.0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "scale", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    with pytest.raises(OnnxImportError, match=r"opset 8: onnx's version converter"):
        load_onnx(model)


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_file_names_the_file(tmp_path: Path, keep: float) -> None:
    model, _ = build(CASES["conv-pads-bias"])
    data = model.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(OnnxImportError, match=r"cut\.onnx"):
        load_onnx(path)
    with pytest.raises(OnnxImportError, match="model bytes"):
        load_onnx(data[: int(len(data) * keep)])


def test_missing_file_is_an_import_error(tmp_path: Path) -> None:
    with pytest.raises(OnnxImportError, match=r"nothere\.onnx"):
        load_onnx(tmp_path / "nothere.onnx")


def test_inconsistent_shapes_name_the_node_and_both_shapes() -> None:
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Add", ["a", "b"], ["y"], name="add7")
    model = helper.make_model(
        helper.make_graph([node], "bad", [a, b], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with pytest.raises(OnnxImportError) as e:
        load_onnx(model)
    msg = str(e.value)
    assert "node 'add7' (op 'Add', opset 17)" in msg and "[2, 3]" in msg and "[4, 5]" in msg


def test_declared_output_shape_must_agree() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])
    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    model = helper.make_model(
        helper.make_graph([node], "bad", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    with pytest.raises(OnnxImportError, match=r"node 'r'.*\[2, 3\].*\[3, 2\]"):
        load_onnx(model)


def test_symbolic_dim_needs_input_shapes() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "sym", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with pytest.raises(OnnxImportError, match=r"input 'x' dim 0 \('batch'\) is symbolic"):
        load_onnx(model)
    assert load_onnx(model, input_shapes={"x": (4, 3)}).types["y"].shape == (4, 3)
    with pytest.raises(OnnxImportError, match="fixes it at 3"):
        load_onnx(model, input_shapes={"x": (4, 5)})
    with pytest.raises(OnnxImportError, match="'z'"):
        load_onnx(model, input_shapes={"z": (4, 3)})


def test_computed_reshape_shape_is_refused() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")
    model = helper.make_model(
        helper.make_graph([node], "dyn", [x, s], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    with pytest.raises(OnnxImportError, match=r"node 'rs' \(op 'Reshape'.*must be a constant"):
        load_onnx(model)


def test_bad_attribute_names_node_and_problem() -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=4)
    with pytest.raises(OnnxImportError, match=r"node 'sm' \(op 'Softmax'.*axis 4"):
        load_onnx(_one_node_model(node))


def test_nodes_out_of_order_and_foreign_domains_are_refused() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Relu", ["t"], ["y"], name="late"),
        helper.make_node("Relu", ["x"], ["t"], name="early"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "unsorted", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    with pytest.raises(OnnxImportError, match=r"node 'late' .*reads 't'"):
        load_onnx(model)
    node = helper.make_node("FusedGemm", ["x"], ["y"], name="ms", domain="com.microsoft")
    model = _one_node_model(node)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(OnnxImportError, match=r"node 'ms' .*domain 'com.microsoft'"):
        load_onnx(model)


def test_run_reference_checks_feeds() -> None:
    graph = load_onnx(_one_node_model(helper.make_node("Relu", ["x"], ["y"])))
    with pytest.raises(GraphError, match="no value fed for input 'x'"):
        run_reference(graph, {})
    with pytest.raises(GraphError, match=r"input 'x' is float32\[3, 2\]"):
        run_reference(graph, {"x": rand(3, 2)})
    with pytest.raises(GraphError, match=r"input 'x' is float64"):
        run_reference(graph, {"x": np.zeros((2, 3))})
    with pytest.raises(GraphError, match="no input"):
        run_reference(graph, {"x": rand(2, 3), "q": rand(1)})


# -- small whole models ---------------------------------------------------------------------------


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def test_residual_cnn_block_matches_onnx() -> None:
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", "w1"], ["c1"], name="stem", strides=[2, 2], pads=[3, 3, 3, 3]),
        mk("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn"], name="bn"),
        mk("Relu", ["bn"], ["r1"], name="relu"),
        mk(
            "MaxPool",
            ["r1"],
            ["p"],
            name="pool",
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        mk("Conv", ["p", "w2", "b2"], ["c2"], name="conv2", auto_pad="SAME_UPPER"),
        mk("Clip", ["c2", "lo", "hi"], ["r2"], name="relu6"),
        mk("Add", ["r2", "p"], ["sum"], name="residual"),
        mk("GlobalAveragePool", ["sum"], ["gap"], name="gap"),
        mk("Flatten", ["gap"], ["flat"], name="flatten"),
        mk("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
        mk("Softmax", ["logits"], ["probs"], name="softmax"),
    ]
    inits = [
        _init("w1", rand(8, 3, 7, 7) * 0.2),
        _init("g", rand(8)),
        _init("b", rand(8)),
        _init("m", rand(8)),
        _init("v", rand(8, low=0.5)),
        _init("w2", rand(8, 8, 3, 3) * 0.2),
        _init("b2", rand(8)),
        _init("lo", np.asarray(0, np.float32)),
        _init("hi", np.asarray(6, np.float32)),
        _init("fc_w", rand(10, 8)),
        _init("fc_b", rand(10)),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])
    model = helper.make_model(
        helper.make_graph(nodes, "cnn", [x], [y], inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    graph = load_onnx(model, input_shapes={"x": (2, 3, 32, 32)})
    assert [n.op for n in graph.nodes] == [
        "conv2d", "batch_norm", "relu", "max_pool2d", "conv2d", "clip", "add",
        "global_avg_pool2d", "reshape", "dense", "softmax",
    ]  # fmt: skip
    feeds = {"x": rand(2, 3, 32, 32)}
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_allclose(run_reference(graph, feeds)[0], np.asarray(want), atol=1e-5)


def test_attention_block_matches_onnx() -> None:
    """One BERT-style self-attention + GELU feed-forward layer with shape-computing nodes."""
    mk = helper.make_node
    s, d, h = 6, 16, 2
    nodes = [
        mk("MatMul", ["x", "wqkv"], ["qkv"]),
        mk("Add", ["qkv", "bqkv"], ["qkv_b"]),
        mk("Split", ["qkv_b", "split3"], ["q", "k", "v"], axis=-1),
        mk("Shape", ["x"], ["xs"]),
        mk("Slice", ["xs", "zero1", "two1"], ["bs"]),
        mk("Concat", ["bs", "heads"], ["hshape"], axis=0),
        mk("Reshape", ["q", "hshape"], ["q4"]),
        mk("Reshape", ["k", "hshape"], ["k4"]),
        mk("Reshape", ["v", "hshape"], ["v4"]),
        mk("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        mk("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        mk("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        mk("MatMul", ["qt", "kt"], ["scores"]),
        mk("Div", ["scores", "scale"], ["scaled"]),
        mk("Unsqueeze", ["mask", "axes12"], ["mask4"]),
        mk("Cast", ["mask4"], ["maskf"], to=TensorProto.FLOAT),
        mk("Sub", ["one", "maskf"], ["inv"]),
        mk("Mul", ["inv", "neg_big"], ["bias"]),
        mk("Add", ["scaled", "bias"], ["masked"]),
        mk("Softmax", ["masked"], ["probs"], axis=-1),
        mk("MatMul", ["probs", "vt"], ["ctx4"]),
        mk("Transpose", ["ctx4"], ["ctxt"], perm=[0, 2, 1, 3]),
        mk("Reshape", ["ctxt", "flat_shape"], ["ctx"]),
        mk("Add", ["ctx", "x"], ["res"]),
        mk("LayerNormalization", ["res", "ln_g", "ln_b"], ["ln"], axis=-1, epsilon=1e-12),
        mk("MatMul", ["ln", "w_ff"], ["ff"]),
        mk("Div", ["ff", "sqrt2"], ["ffd"]),
        mk("Erf", ["ffd"], ["erf"]),
        mk("Add", ["erf", "one"], ["erf1"]),
        mk("Mul", ["ff", "erf1"], ["gelu2"]),
        mk("Mul", ["gelu2", "half"], ["gelu"]),
        mk("ReduceMean", ["gelu", "axes_last"], ["pooled"], keepdims=0),
    ]
    f32 = np.float32
    inits = [
        _init("wqkv", rand(d, 3 * d) * 0.3),
        _init("bqkv", rand(3 * d)),
        _init("split3", ints(d, d, d)),
        _init("zero1", ints(0)),
        _init("two1", ints(2)),
        _init("heads", ints(h, d // h)),
        _init("scale", np.asarray(np.sqrt(d // h), f32)),
        _init("axes12", ints(1, 2)),
        _init("one", np.asarray(1, f32)),
        _init("neg_big", np.asarray(-10000, f32)),
        _init("flat_shape", ints(0, 0, -1)),
        _init("ln_g", rand(d)),
        _init("ln_b", rand(d)),
        _init("w_ff", rand(d, 2 * d) * 0.3),
        _init("sqrt2", np.asarray(np.sqrt(2), f32)),
        _init("half", np.asarray(0.5, f32)),
        _init("axes_last", ints(-1)),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, s, d])
    mask = helper.make_tensor_value_info("mask", TensorProto.INT64, [2, s])
    out = helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [2, s])
    model = helper.make_model(
        helper.make_graph(nodes, "attn", [x, mask], [out], inits),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    graph = load_onnx(model)
    assert "reshape" in graph.op_counts() and graph.op_counts()["matmul"] == 4
    feeds = {"x": rand(2, s, d), "mask": np.asarray([[1] * s, [1] * 4 + [0] * 2], np.int64)}
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_allclose(run_reference(graph, feeds)[0], np.asarray(want), atol=1e-5)

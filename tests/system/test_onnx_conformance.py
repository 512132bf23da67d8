"""onnx's own node tests, run by `onnx.backend.test.BackendTest` against Kiln's ONNX backend.

Every node test of the ops in CONFORMING runs: onnx builds a one-node model and its input and
expected output arrays, KilnBackend imports and builds it untuned for this host, runs it on an
agent of a local pool (one for the module), and onnx's runner compares the outputs with its own
tolerances. An op is listed here only once all of its node tests pass; `benchmarks/conformance.py`
reports every op Kiln imports, with the reason each other case is refused.
"""

from __future__ import annotations

import shutil
import warnings
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx.backend.test
from onnx import TensorProto, helper

from kiln.onnx_backend import KilnBackend, close_shared_pool, node_test_cases

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

# Ops all of whose single-node tests pass (benchmarks/conformance.py, 2026-11-27; graph inputs
# used as shapes, axes, pads, bounds or weights are bound at run time).
CONFORMING = (
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh",
    "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "Ceil", "Clip", "Concat",
    "Constant", "ConstantOfShape", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum",
    "DepthToSpace", "Div", "Elu", "Erf", "Exp", "Expand", "EyeLike", "Flatten", "Floor", "Gather",
    "GatherElements", "Gelu", "Gemm", "GlobalAveragePool", "GlobalMaxPool", "Greater",
    "GreaterOrEqual", "HardSigmoid", "HardSwish", "Hardmax", "InstanceNormalization", "IsInf",
    "IsNaN", "LRN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax",
    "MatMul", "Max", "Mean", "MeanVarianceNormalization", "Min", "Mish", "Mod", "Mul", "Neg",
    "Not", "Or", "PRelu", "Pad", "Pow", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
    "ReduceSumSquare", "Relu", "Reshape", "Resize", "Round", "Selu", "Shape", "Shrink", "Sigmoid",
    "Sign", "Sin", "Sinh", "Size", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth",
    "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Tile", "TopK",
    "Transpose", "Trilu", "Unsqueeze", "Upsample", "Where", "Xor",
)  # fmt: skip


def _case_names(ops: tuple[str, ...]) -> list[str]:
    return sorted(c.name for c in node_test_cases(ops))


NAMES = _case_names(CONFORMING)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _backend_test = onnx.backend.test.BackendTest(KilnBackend, __name__)
_backend_test.include(r"^(" + "|".join(NAMES) + r")_cpu$")
# The node tests only (the model tests need downloads), and only those of CONFORMING: onnx would
# add the other ~1,800 as skipped tests.
OnnxBackendNodeModelTest = _backend_test.test_cases["OnnxBackendNodeModelTest"]
_WANTED = {f"{name}_cpu" for name in NAMES}
for _attr in [a for a in vars(OnnxBackendNodeModelTest) if a.startswith("test_")]:
    if _attr not in _WANTED:
        delattr(OnnxBackendNodeModelTest, _attr)


def teardown_module(module: Any) -> None:
    close_shared_pool()


def test_the_conforming_ops_have_node_tests() -> None:
    """Every listed op has node tests (a renamed op would otherwise drop out silently)."""
    for op in CONFORMING:
        assert _case_names((op,)), f"onnx has no single-node test of {op}"


def test_outputs_no_kernel_writes_get_copies() -> None:
    """A graph output that is a graph input, a folded constant, or listed twice still comes back."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    outs = [
        helper.make_tensor_value_info(n, t, s)
        for n, t, s in (("same", TensorProto.FLOAT, [2, 3]), ("shape", TensorProto.INT64, [2]),
                        ("relu", TensorProto.FLOAT, [2, 3]), ("relu_again", TensorProto.FLOAT, [2, 3]))
    ]  # fmt: skip
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["same"]),
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Relu", ["x"], ["relu"]),
            helper.make_node("Identity", ["relu"], ["relu_again"]),
        ],
        "outputs",
        [x],
        outs,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    same, shape, relu, relu_again = KilnBackend.prepare(model).run([data])
    assert np.array_equal(same, data)
    assert shape.tolist() == [2, 3]
    assert np.array_equal(relu, np.maximum(data, 0)) and np.array_equal(relu_again, relu)


def test_a_grouped_convolution_builds_and_runs() -> None:
    """groups=2 over 4 channels (neither 1 nor depthwise): one convolution per group, joined."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 9, 9])
    weight = onnx.numpy_helper.from_array(rng.standard_normal((6, 2, 3, 3)).astype(np.float32), "w")
    bias = onnx.numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=2, pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "grouped", [x], [y], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    (ours,) = KilnBackend.prepare(model).run([data])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(ours, session.run(None, {"x": data})[0], rtol=1e-4, atol=1e-4)

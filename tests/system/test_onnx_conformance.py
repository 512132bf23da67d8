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

import pytest

pytest.importorskip("onnx")

import onnx.backend.test

from kiln.onnx_backend import KilnBackend, close_shared_pool, node_test_cases

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

# Ops all of whose single-node tests pass (benchmarks/conformance.py, 2026-11-26: 35 of the 57
# ops Kiln imports; graph inputs used as shapes, axes, pads or bounds are bound at run time).
CONFORMING = (
    "Abs", "Add", "Clip", "Concat", "Div", "Erf", "Exp", "Expand", "Flatten", "Gather", "Gelu",
    "Gemm", "GlobalAveragePool", "GlobalMaxPool", "Greater", "HardSigmoid", "HardSwish",
    "LeakyRelu", "Less", "Mul", "Neg", "Pad", "Pow", "Reciprocal", "ReduceMean", "Relu",
    "Sigmoid", "Softmax", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze", "Where",
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

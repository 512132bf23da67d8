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

# Ops all of whose single-node tests pass (benchmarks/conformance.py, 2026-11-26: 24 of the 57
# ops Kiln imports).
CONFORMING = (
    "Abs", "Concat", "Div", "Erf", "Exp", "Flatten", "Gather", "Gelu", "GlobalAveragePool",
    "GlobalMaxPool", "Greater", "HardSigmoid", "HardSwish", "LeakyRelu", "Less", "Neg",
    "Reciprocal", "Relu", "Sigmoid", "Softmax", "Sqrt", "Tanh", "Transpose", "Where",
)  # fmt: skip


def _case_names(ops: tuple[str, ...]) -> list[str]:
    return sorted(c.name for c in node_test_cases(ops))


NAMES = _case_names(CONFORMING)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _backend_test = onnx.backend.test.BackendTest(KilnBackend, __name__)
_backend_test.include(r"^(" + "|".join(NAMES) + r")_cpu$")
# The node tests only (the model tests need downloads); those of other ops are skipped.
OnnxBackendNodeModelTest = _backend_test.test_cases["OnnxBackendNodeModelTest"]


def teardown_module(module: Any) -> None:
    close_shared_pool()


def test_the_conforming_ops_have_node_tests() -> None:
    """Every listed op has node tests (a renamed op would otherwise drop out silently)."""
    for op in CONFORMING:
        assert _case_names((op,)), f"onnx has no single-node test of {op}"

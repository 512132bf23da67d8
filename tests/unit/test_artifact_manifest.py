"""An artifact's sha256 (the devices' cache key) covers its entries' specs, not just its code."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact import ArgSpec, Entry, manifest_source
from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model import MODEL_ENTRY, build_model
from compiler.graph.ir import Graph

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def reshape_model(shape: tuple[int, ...]) -> Graph:
    """x: float32[2, 3, 4] reshaped to `shape`, as an ONNX model imported."""
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Reshape", ["x", "shape"], ["y"])],
            "reshape",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
            [numpy_helper.from_array(np.array(shape, dtype=np.int64), "shape")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    return from_onnx(model)


def test_same_code_other_shapes_get_other_hashes() -> None:
    """Two reshapes copy the same 24 floats with the same code; an agent that cached the first
    by its hash must never run the second with the first one's output shape."""
    a = build_model(reshape_model((4, 6)), None, "host")
    b = build_model(reshape_model((24,)), None, "host")
    assert a.artifact.entry(MODEL_ENTRY).args[1].shape == (4, 6)
    assert b.artifact.entry(MODEL_ENTRY).args[1].shape == (24,)
    assert a.artifact.sha256 != b.artifact.sha256
    again = build_model(reshape_model((4, 6)), None, "host")
    assert again.artifact.sha256 == a.artifact.sha256  # and the same build, the same key


def test_manifest_is_a_c_string_of_every_spec() -> None:
    entry = Entry("f", "f__time", (ArgSpec('we"ird\\name', (2,), "uint16", "input"),), 0.0)
    source = manifest_source([entry])
    assert source.startswith('__attribute__((used)) static const char kiln_manifest[] = "')
    assert 'we\\\\\\"ird\\\\\\\\name' in source and "uint16" in source and "[2]" in source

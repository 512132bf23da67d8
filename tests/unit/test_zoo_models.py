"""benchmarks/zoo.py's models: valid ONNX at the old opsets its docstring lists, seeded, and run by
onnxruntime. Building them with Kiln and comparing is the benchmark's job, not this test's."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

import benchmarks.zoo as bench
from tuner.network.timing import OrtPeer

# alexnet's 11x11/4 stem and three 3/2 max pools leave no pixel of a 32x32 image; unet wants a
# multiple of 4
IMAGE = 64


def declared_shape(value: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("name", sorted(bench.MODELS))
def test_model_is_valid_seeded_and_runs_in_onnxruntime(name: str) -> None:
    model = bench.MODELS[name](IMAGE)
    onnx.checker.check_model(model, full_check=True)
    assert 7 <= bench.opset_of(model) <= 11
    # the benchmark compares runs on the same weights: a second build is the same bytes
    assert bench.MODELS[name](IMAGE).SerializeToString() == model.SerializeToString()

    x = np.random.default_rng(0).standard_normal(declared_shape(model.graph.input[0]))
    (y,) = OrtPeer(model, {"input": x.astype(np.float32)}).run()
    assert list(y.shape) == declared_shape(model.graph.output[0])
    assert np.isfinite(y).all()
    assert y.std() > 0


def test_docstring_lists_every_model_with_its_opset() -> None:
    doc = bench.__doc__ or ""
    listed = dict(re.findall(r"^  (\w+)\s+\(opset (\d+)\)", doc, re.MULTILINE))
    assert sorted(listed) == sorted(bench.MODELS)
    for name, build in bench.MODELS.items():
        assert int(listed[name]) == bench.opset_of(build(IMAGE)), name

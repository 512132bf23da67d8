"""The three reference models through the ONNX front end and every graph pass, against onnxruntime.

Import, fold BatchNorm and scales, CSE, DCE, constant folding, NCHW -> NCHW[x]c, fusion and memory
planning must keep each model's outputs (run with the registry's numpy references) within 1e-4
relative of onnxruntime's, and plan a workspace no larger than needed on these chains.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from compiler import zoo
from compiler.frontend.onnx import from_onnx
from compiler.graph import Graph, run_reference
from compiler.graph import passes as P


def optimize(g: Graph) -> Graph:
    g = P.fold_scale_into_conv(P.fold_batch_norm(g))
    g = P.fold_constants(P.eliminate_dead_code(P.eliminate_common_subexpressions(g)))
    return P.to_nchwc(g)


@pytest.mark.parametrize(
    ("name", "kw"),
    [("resnet18", {"image": 64}), ("mobilenet_v2", {"image": 64}), ("bert_tiny", {"seq": 32})],
)
def test_model_keeps_its_outputs_through_every_pass(name: str, kw: dict[str, int]) -> None:
    model = zoo.build(name, **kw)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    rng = np.random.default_rng(1)
    if "int" in inp.type:
        x = rng.integers(0, 30_000, size=inp.shape).astype(np.int64)
    else:
        x = rng.standard_normal(inp.shape).astype(np.float32)
    expected = sess.run(None, {inp.name: x})[0]

    graph = from_onnx(model)
    optimized = optimize(graph)
    optimized.verify()
    assert "batch_norm" not in optimized.op_counts()
    if name != "bert_tiny":
        assert optimized.op_counts().get("conv2d_nchwc", 0) == graph.op_counts()["conv2d"]
        assert optimized.op_counts()["layout_transform"] <= 2  # only at the boundaries
    for g in (graph, optimized):
        (out,) = run_reference(g, {inp.name: x})
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())

    plan = P.fuse(optimized)
    memory = P.plan_memory(plan)
    memory.check()
    assert memory.lower_bound <= memory.total <= 1.05 * memory.lower_bound
    assert len(plan.groups) < len(optimized)

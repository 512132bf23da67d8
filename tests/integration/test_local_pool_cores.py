"""A local pool on a core set (`kiln.Pool(core_sets=...)`, `kiln tune --cores`): its device is
started with `kiln-agent --cores`, tagged with the set's thread count, and what is tuned on it
is tuned and recorded for that many threads (a real tracker and agent, real gcc)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from compiler.frontend.onnx import from_onnx
from compiler.graph.ir import Graph
from compiler.ops.base import PARALLEL_KNOB
from tuner import records as rec
from tuner.loop import target_name
from tuner.measure.builder import LocalBuilder
from tuner.measure.local_pool import LocalPool

CORES = sorted(os.sched_getaffinity(0))


def mlp() -> Graph:
    """x[67, 96] @ w1 -> ReLU -> @ w2: dense kernels big enough for parallel defaults."""
    rng = np.random.default_rng(3)
    w1, w2 = rng.standard_normal((96, 200)), rng.standard_normal((200, 72))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (67, 96))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w.astype(np.float32), n) for n, w in (("w1", w1), ("w2", w2))],
    )
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_core_sets_are_checked_before_anything_starts() -> None:
    core = CORES[0]
    for kwargs, why in (
        ({"core_sets": ((core,), (core,))}, "two core sets"),
        ({"core_sets": ((core,),), "pin_cores": (core,)}, "give one"),
        ({"core_sets": ((core,),), "devices": 2}, "one per device"),
        ({"core_sets": ((max(CORES) + 1000,),)}, "cannot pin"),
        ({"core_sets": ((),)}, "empty"),
    ):
        with pytest.raises(ValueError, match=why):
            LocalPool(**kwargs)
    with pytest.raises(ValueError, match="local pool"):
        kiln.Pool("127.0.0.1:1", key="k", core_sets=((core,),))


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")
def test_a_local_device_on_two_cores_tunes_for_two_threads(tmp_path: Path) -> None:
    cores = tuple(CORES[:2])
    records = tmp_path / "r.jsonl"
    graph = mlp()
    x = np.random.default_rng(0).standard_normal((67, 96)).astype(np.float32)
    expected = np.maximum(x @ graph.constants["w1"], 0) @ graph.constants["w2"]
    with kiln.Pool(core_sets=(cores,)) as pool:
        assert pool.local is not None and pool.devices == 1
        assert pool.device_tags.get("threads") == "2" and pool.thread_counts == (2,)
        assert pool.threads == 2 and pool.records_target.endswith("/threads=2")
        # the device holds both cores: builds run there only at idle priority
        builder = pool.builder()
        try:
            assert isinstance(builder, LocalBuilder) and builder.idle_workers == 2
        finally:
            builder.close()
        progress = kiln.tune_op(pool, "softmax", (67, 130), trials=4, records=records)
        # a build for its two threads runs there; a one-thread build is refused, not run
        two = kiln.build(graph, records, threads=2)
        assert two.threads == 2
        ran = kiln.run(pool, two, {"x": x}, repeat=2)
        np.testing.assert_allclose(ran.outputs[0], expected, rtol=1e-4, atol=1e-3)
        with pytest.raises(ValueError, match="built for 1 thread"):
            kiln.run(pool, kiln.build(graph), {"x": x}, repeat=2)
    assert progress.best is not None and progress.best.result.ok
    stored = rec.FileRecords(records).load()
    assert stored and {r.target for r in stored} == {rec.records_target(target_name("host"), 2)}
    assert all(PARALLEL_KNOB in r.knobs for r in stored)  # the two-thread space

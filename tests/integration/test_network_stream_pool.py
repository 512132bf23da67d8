"""Network tuning streams a batch's builds into a real pool: real gcc builds in a LocalBuilder's
worker processes, a tracker and two agents on 127.0.0.1, the PoolRunner over gRPC. One build of
the first batch is held back until the runner has measured others, and they are measured first."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact import Artifact
from compiler.frontend.onnx import from_onnx
from compiler.graph.ir import Graph
from tuner import records as rec
from tuner.measure import EvaluatorConfig, MeasureResult, Status
from tuner.measure.build_stream import BuildResult, BuildStream, FuturesEngine
from tuner.measure.builder import LocalBuilder, StreamingBuilder
from tuner.measure.fake_runner import config_index_of
from tuner.measure.local_pool import LocalPool
from tuner.measure.pool_runner import PoolConfig, PoolRunner
from tuner.measure.runner import Reference
from tuner.network.tune import model_tasks, tune_network
from tuner.options import TuneOptions
from tuner.records import FileRecords

pytestmark = pytest.mark.usefixtures("build_cache")

FAST = EvaluatorConfig(repeat=2, min_repeat_ms=1.0, timeout_s=10.0)
# How long the held build waits for the runner before it goes on anyway (bounds a failing run).
WAIT_S = 30.0


def dense_net() -> Graph:
    """x (4, 64) @ w (64, 32): one dense task."""
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 64))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


class HoldsOne:
    """A LocalBuilder whose batches stream one unit per index; the first index of the first
    batch is built only once `gate` is set (or WAIT_S passed)."""

    def __init__(self, inner: LocalBuilder) -> None:
        self.inner = inner
        self.target = inner.target
        self.timeout_s = inner.timeout_s
        self.gate = threading.Event()
        self.held: int | None = None
        self.held_built = threading.Event()
        self._threads = ThreadPoolExecutor(4)

    def _unit(self, workload: rec.Workload, i: int, check: bool) -> list[BuildResult]:
        if i == self.held:
            self.gate.wait(WAIT_S)
        built = self.inner.build(workload, [i], check)
        if i == self.held:
            self.held_built.set()
        return built

    def submit(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> BuildStream:
        if self.held is None:
            self.held = indices[0]
        tasks = [self._threads.submit(self._unit, workload, i, check) for i in indices]
        units = [[i] for i in indices]
        return BuildStream(zip(units, tasks, strict=True), FuturesEngine(), self.timeout_s)

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        return self.submit(workload, indices, check).results()

    def close(self) -> None:
        self.gate.set()
        self._threads.shutdown(wait=True)
        self.inner.close()


class Opens:
    """The pool runner, noting each call's config indices and whether the held build was done
    by then; it opens the builder's gate once a call has been measured."""

    def __init__(self, runner: PoolRunner, builder: HoldsOne) -> None:
        self.runner = runner
        self.builder = builder
        self.calls: list[tuple[list[int], bool]] = []

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        done = self.builder.held_built.is_set()
        self.calls.append(([config_index_of(a) for a in artifacts], done))
        results = self.runner.run(artifacts, references)
        self.builder.gate.set()
        return results

    def close(self) -> None:
        self.runner.close()


@pytest.fixture(scope="module")
def pool() -> Iterator[LocalPool]:
    with LocalPool(key="net-stream", agents=2) as p:
        yield p


def test_network_tuning_measures_built_candidates_while_one_still_builds(
    pool: LocalPool, tmp_path: Path
) -> None:
    graph = dense_net()
    [mt], _ = model_tasks(graph)
    builder = HoldsOne(LocalBuilder(workers=2))
    assert isinstance(builder, StreamingBuilder)
    config = PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token)
    runner = Opens(PoolRunner(config, FAST, devices=2), builder)
    store = FileRecords(tmp_path / "r.jsonl")
    try:
        result = tune_network(
            graph,
            builder,
            runner,
            TuneOptions(trials=8, batch_size=4, confirm=0, pipeline=True, tuner="random"),
            store=store,
        )
    finally:
        builder.close()
        runner.close()
    first, held_done_then = runner.calls[0]
    assert builder.held is not None and not held_done_then
    assert first and builder.held not in first
    measured = [i for call, _ in runner.calls for i in call]
    assert sorted(measured) == sorted(set(measured)) and len(measured) == 8
    records = store.load()
    assert len(records) == result.trials == 8
    assert {r.workload for r in records} == {mt.task.workload}
    assert [r.result.status for r in records] == [Status.OK] * 8, [r.result.error for r in records]
    assert records[0].config_index == builder.held  # records keep the order asked

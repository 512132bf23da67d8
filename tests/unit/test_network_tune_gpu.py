"""Whole-model tuning for a GPU target with a fake builder and the fake runner: the tasks are the
GPU model build's template tasks (`plan_model_cuda`), each starts from the config the untuned
GPU build takes, and the records carry the cuda target. No sockets, no nvcc.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact import Artifact, Entry
from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model_cuda import plan_model_cuda
from compiler.graph.ir import Graph
from kiln.api import gpu_model_configs
from tuner import records as rec
from tuner.measure.builder import BuildResult
from tuner.measure.fake_runner import FakeRunner
from tuner.network.tune import ModelTuneResult, configs_from_records, model_tasks, tune_network
from tuner.options import TuneOptions
from tuner.records import FileRecords
from tuner.search import RandomSearch, Searcher
from tuner.task import Task

GPU = "cuda/sm=90"


def cnn() -> Graph:
    """conv 3x3 + bias + ReLU, a strided 1x1 conv + bias, global average pool, Gemm, softmax."""
    rng = np.random.default_rng(0)

    def param(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2, 2]),
        n("GlobalAveragePool", ["c2"], ["g"]),
        n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "wd", "bd"], ["d"], transB=1),
        n("Softmax", ["d"], ["y"], axis=-1),
    ]
    inits = [
        param("w1", 4, 3, 3, 3),
        param("b1", 4),
        param("w2", 4, 4, 1, 1),
        param("b2", 4),
        param("wd", 5, 4),
        param("bd", 5),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 5, 5))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 5))],
        inits,
    )
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


class GpuFakeBuilder:
    """A builder for the GPU target whose artifacts name their workload and config; the pool's
    device says threads=4, which a GPU task must not take."""

    target = GPU
    threads = 4

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        out = []
        for i in indices:
            data = f"{workload}|{i}".encode()
            entry = Entry(symbol=f"k{i}", timing_symbol=f"k{i}", args=(), flop=1.0)
            art = Artifact(data, hashlib.sha256(data).hexdigest(), "cubin", GPU, (entry,))
            out.append(BuildResult(i, art))
        return out

    def close(self) -> None:
        pass


def seconds(art: Artifact) -> float:
    index = int(art.data.decode().rsplit("|", 1)[1])
    return 1e-5 * (1 + (index * 7919 % 101) / 101)


def random_factory(task: Task, valid: object) -> Searcher:
    return RandomSearch(len(task.space), seed=1)


def tune(graph: Graph, store: FileRecords, trials: int, resume: bool = False) -> ModelTuneResult:
    return tune_network(
        graph,
        GpuFakeBuilder(),
        FakeRunner(seconds),
        TuneOptions(trials=trials, batch_size=2, resume=resume, confirm=0, check=False),
        store=store,
        searcher_factory=random_factory,
    )


@pytest.fixture(scope="module")
def graph() -> Graph:
    return cnn()


def test_a_gpu_targets_tasks_are_the_gpu_builds_template_tasks(graph: Graph) -> None:
    plan = plan_model_cuda(graph, None, GPU)
    tunable, skipped = model_tasks(graph, threads=4, target=GPU)
    assert skipped == []
    assert [mt.spec for mt in tunable] == plan.tasks
    assert [mt.spec.template for mt in tunable] == [
        "cuda_conv2d",
        "cuda_conv2d",
        "cuda_global_avg_pool2d",
        "cuda_dense",
        "cuda_softmax",
    ]
    for mt in tunable:
        assert mt.task == Task(rec.Workload(mt.spec.template or "", mt.spec.workload))
        assert mt.task.threads == 1 and mt.blocks == {}
        assert all(mt.fits(i) for i in range(len(mt.task.space)))
    # the default of each task is the config the untuned GPU build gave its anchor
    anchors = {s.group: s.config for s in plan.steps if s.role == "anchor"}
    defaults = [mt.default_index(GPU) for mt in tunable]
    assert defaults == [anchors[mt.spec.groups[0]].index for mt in tunable]  # type: ignore[union-attr]
    assert any(d != 0 for d in defaults)  # so "first" is not the search's luck


def test_gpu_tuning_measures_the_default_first_and_records_the_cuda_target(
    graph: Graph, tmp_path: Path
) -> None:
    store = FileRecords(tmp_path / "r.jsonl")
    tunable, _ = model_tasks(graph, target=GPU)
    result = tune(graph, store, 4 * len(tunable))
    records = store.load()
    assert result.target == GPU and len(records) == result.trials == 4 * len(tunable)
    assert {r.target for r in records} == {GPU}
    for mt, report in zip(tunable, result.tasks, strict=True):
        mine = [r for r in records if r.workload == mt.task.workload]
        assert mine and mine[0].config_index == mt.default_index(GPU)
        assert report.best is not None and report.best.workload.op.startswith("cuda_")
    # what `kiln build --target cuda/sm=90` takes is the tuned best of every task
    configs = gpu_model_configs(graph, store, GPU)
    assert configs == configs_from_records(graph, store, GPU)
    assert {k: c.index for k, c in configs.items()} == {
        t.spec.key: t.best.config_index for t in result.tasks if t.best is not None
    }

    # resume: the earlier records are told, never measured again, and count
    more = tune(graph, store, 8 * len(tunable), resume=True)
    assert more.resumed == 4 * len(tunable) and more.trials == 8 * len(tunable)
    again = store.load()
    assert len(again) == 8 * len(tunable)
    assert len({(r.workload, r.config_index) for r in again}) == len(again)

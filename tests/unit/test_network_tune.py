"""Whole-model tuning with a fake builder and the fake runner: no sockets, no compiler runs.

The net: a stem conv (3 -> 32, bias, ReLU), two identical 32 -> 32 convs with bias and ReLU
(one task of weight 2), a 32 -> 32 conv without bias (its own task) and a conv with strides
(1, 2) that no template covers (reported, not tuned). Fake latencies are a deterministic
function of (workload, config index), scaled per task.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact import Artifact, Entry
from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model import plan_model
from compiler.graph.ir import Graph
from tuner import records as rec
from tuner.measure import MeasureResult, Status
from tuner.measure.builder import BuildResult
from tuner.measure.fake_runner import FakeRunner
from tuner.network.tune import (
    ModelTuneResult,
    ModelTuneStep,
    SearcherFactory,
    configs_from_records,
    model_tasks,
    tune_network,
)
from tuner.options import TuneOptions
from tuner.records import FileRecords
from tuner.search import RandomSearch, Searcher
from tuner.task import Task

TARGET = "fake-target"
C = 32  # channels: the default layout blocks them by 16; configs may pick 32 or 8


def conv_net() -> Graph:
    rng = np.random.default_rng(0)
    inits = []

    def param(name: str, shape: tuple[int, ...]) -> str:
        value = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        inits.append(numpy_helper.from_array(value, name))
        return name

    def conv(x: str, w: str, out: str, cin: int, bias: bool, strides: tuple[int, int] = (1, 1)):
        inputs = [x, param(w, (C, cin, 3, 3))] + ([param(f"{w}_b", (C,))] if bias else [])
        return helper.make_node(
            "Conv", inputs, [out], kernel_shape=[3, 3], pads=[1] * 4, strides=list(strides)
        )

    nodes = [
        conv("x", "w1", "c1", 3, True),
        helper.make_node("Relu", ["c1"], ["r1"]),
        conv("r1", "w2", "c2", C, True),
        helper.make_node("Relu", ["c2"], ["r2"]),
        conv("r2", "w3", "c3", C, True),
        helper.make_node("Relu", ["c3"], ["r3"]),
        conv("r3", "w4", "c4", C, False),
        conv("c4", "w5", "y", C, False, strides=(1, 2)),
    ]
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 16, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


class FakeBuilder:
    """Artifacts whose bytes name their workload and config index; nothing is compiled."""

    target = TARGET

    def __init__(self) -> None:
        self.built: list[tuple[rec.Workload, int]] = []

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        out = []
        for i in indices:
            self.built.append((workload, i))
            data = f"{workload}|{i}".encode()
            entry = Entry(symbol=f"k{i}", timing_symbol=f"k{i}__time", args=(), flop=1.0)
            art = Artifact(
                data, hashlib.sha256(data).hexdigest(), "shared_object", TARGET, (entry,)
            )
            out.append(BuildResult(i, art))
        return out

    def close(self) -> None:
        pass


def latency_by(scale: Callable[[str], float]) -> Callable[[Artifact], float]:
    """Seconds of a candidate: its task's scale times a pseudo-random factor in [1, 2)."""

    def seconds(art: Artifact) -> float:
        workload, index = art.data.decode().rsplit("|", 1)
        return scale(workload) * (1 + (int(index) * 7919 % 101) / 101)

    return seconds


def uniform(workload: str) -> float:
    return 1e-3


def random_factory(task: Task, valid: Callable[[int], bool]) -> Searcher:
    return RandomSearch(len(task.space), seed=1, valid=valid)


def run(
    graph: Graph,
    store: FileRecords | None,
    trials: int,
    *,
    scale: Callable[[str], float] = uniform,
    searcher_factory: SearcherFactory = random_factory,
    resume: bool = False,
    on_batch: Callable[[ModelTuneStep], None] | None = None,
    confirm: int = 0,
) -> ModelTuneResult:
    return tune_network(
        graph,
        FakeBuilder(),
        FakeRunner(latency_by(scale)),
        TuneOptions(trials=trials, batch_size=4, resume=resume, confirm=confirm),
        store=store,
        on_batch=on_batch,
        searcher_factory=searcher_factory,
    )


@pytest.fixture(scope="module")
def graph() -> Graph:
    return conv_net()


def test_tasks_and_the_one_no_template_covers(graph: Graph) -> None:
    tunable, skipped = model_tasks(graph)
    assert [(t.spec.template, t.spec.weight) for t in tunable] == [
        ("conv2d_stem_nchwc", 1),
        ("conv2d_winograd_nchwc", 2),  # 3x3 stride 1: Winograd
        ("conv2d_winograd_nchwc", 1),
    ]
    assert tunable[0].blocks == {"ic_block": 3, "oc_block": 16}
    [spec] = skipped
    assert spec.template is None and "strides (1, 2)" in spec.note
    result = run(graph, None, 12)
    assert result.skipped == skipped


def test_budget_records_and_estimate(graph: Graph, tmp_path: Path) -> None:
    store = FileRecords(tmp_path / "r.jsonl")
    steps: list[ModelTuneStep] = []
    result = run(graph, store, 30, on_batch=steps.append)
    records = store.load()
    assert len(records) == result.trials == 30 == steps[-1].trials
    assert {r.target for r in records} == {TARGET}
    counts = Counter((r.workload, r.config_index) for r in records)
    assert max(counts.values()) == 1  # nothing measured twice
    tunable, _ = model_tasks(graph)
    for mt, report in zip(tunable, result.tasks, strict=True):
        mine = [r for r in records if r.workload == mt.task.workload]
        assert len(mine) == report.trials > 0
        assert all(mt.fits(r.config_index) for r in mine)  # only the graph's channel blocks
        assert report.best is not None
        assert report.best.result.median_s == min(r.result.median_s for r in mine)
    want = sum(t.weight * t.best.result.median_s for t in result.tasks if t.best)
    assert result.estimated_s == pytest.approx(want)
    assert result.curve[-1] == (30, pytest.approx(want))
    assert [s.trials for s in steps] == [t for t, _ in result.curve]
    finite = [v for _, v in result.curve if math.isfinite(v)]
    assert finite == sorted(finite, reverse=True)  # bests only get better


def test_confirm_measures_each_tasks_fastest_configs_again(graph: Graph, tmp_path: Path) -> None:
    store = FileRecords(tmp_path / "r.jsonl")
    result = run(graph, store, 30, confirm=2)
    records = store.load()
    assert result.trials == 30 and len(records) == 30 + 3 * 2 * 2  # 3 tasks, top 2, 2 rounds
    for report in result.tasks:
        assert report.best is not None
        mine = [r for r in records if r.workload == report.best.workload]
        counts = Counter(r.config_index for r in mine)
        assert sorted(counts.values())[-2:] == [3, 3]  # the two fastest, measured three times
        fastest = min(mine, key=lambda r: r.result.median_s)
        assert report.best.config_index == fastest.config_index


def test_the_scheduler_gives_the_costly_task_most_trials(graph: Graph) -> None:
    def scale(workload: str) -> float:  # the weight-2 task is 20x slower than the others
        return 20e-3 if workload.endswith(",2) float32") and f"(1,{C}," in workload else 1e-3

    result = run(graph, None, 60, scale=scale)
    trials = {t.spec.weight: t.trials for t in result.tasks if t.spec.weight == 2}
    others = [t.trials for t in result.tasks if t.spec.weight == 1]
    assert trials[2] > 2 * max(others), [(t.name, t.trials) for t in result.tasks]
    assert result.schedule.allocations[0].reason == "warmup"
    assert {a.reason for a in result.schedule.allocations} >= {"warmup", "gradient"}


class SpySearcher:
    """RandomSearch that remembers what it was told."""

    made: ClassVar[list[SpySearcher]] = []

    def __init__(self, task: Task, valid: Callable[[int], bool]) -> None:
        self.inner = RandomSearch(len(task.space), seed=2, valid=valid)
        self.told: list[int] = []
        self.asked: list[int] = []
        SpySearcher.made.append(self)

    def ask(self, n: int) -> list[int]:
        out = self.inner.ask(n)
        self.asked += out
        return out

    def tell(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        self.told += indices
        self.inner.tell(indices, results)


def test_one_searcher_per_task_continues_across_batches(graph: Graph) -> None:
    SpySearcher.made = []
    result = run(graph, None, 40, searcher_factory=SpySearcher)
    assert len(SpySearcher.made) == len(result.tasks) == 3
    tunable, _ = model_tasks(graph)
    for spy, report, mt in zip(SpySearcher.made, result.tasks, tunable, strict=True):
        # the untuned build's config is measured first, then the searcher's (several batches)
        default = mt.default_index("host")
        assert spy.told[0] == default and default not in spy.asked
        assert len(spy.asked) + 1 == report.trials > 4
        assert spy.told == [default, *spy.asked]


def test_resume_tells_earlier_records_and_counts_them(graph: Graph, tmp_path: Path) -> None:
    store = FileRecords(tmp_path / "r.jsonl")
    first = run(graph, store, 20)
    before = store.load()
    SpySearcher.made = []
    second = run(graph, store, 44, resume=True, searcher_factory=SpySearcher)
    after = store.load()
    assert len(before) == 20 and len(after) == 44 and after[:20] == before
    assert second.resumed == 20 and second.trials == 44
    assert second.curve[0] == (20, pytest.approx(first.estimated_s))
    assert max(Counter((r.workload, r.config_index) for r in after).values()) == 1
    tunable, _ = model_tasks(graph)
    for spy, mt in zip(SpySearcher.made, tunable, strict=True):
        resumed = [r.config_index for r in before if r.workload == mt.task.workload]
        assert resumed and spy.told[: len(resumed)] == resumed  # told before any new batch
        assert not set(spy.asked) & set(resumed)  # and never measured again
    assert second.estimated_s <= first.estimated_s
    # The scheduler starts from the resumed history: no task gets a second warm-up batch.
    assert "warmup" not in {a.reason for a in second.schedule.allocations}


def test_a_task_that_always_fails_is_retired_and_reported(graph: Graph) -> None:
    def scale(workload: str) -> float:
        if workload.startswith("conv2d_stem"):
            raise RuntimeError("boom")
        return 1e-3

    result = run(graph, None, 32, scale=scale)
    stem = result.tasks[0]
    assert stem.best is None and stem.status == "failing" and stem.trials == 8
    assert math.isinf(result.estimated_s)
    assert all(t.best is not None for t in result.tasks[1:])


def test_configs_from_records_pick_the_best_of_this_space_and_target(
    graph: Graph, tmp_path: Path
) -> None:
    store = FileRecords(tmp_path / "r.jsonl")
    result = run(graph, store, 30)
    tunable, _ = model_tasks(graph)
    mt = tunable[1]
    space = mt.task.space
    # faster records that must not win: another space size, another target
    fast = MeasureResult(Status.OK, (1e-9,) * 3, device_id="fake/0")
    wl, size = mt.task.workload, len(space)
    store.append(
        [
            rec.Record(wl, TARGET, 0, mt.task.knobs(0), fast, mt.task.flop, "", size + 1),
            rec.Record(wl, "other", 0, mt.task.knobs(0), fast, mt.task.flop, "", size),
        ]
    )
    configs = configs_from_records(graph, store, TARGET)
    assert set(configs) == {t.spec.key for t in tunable}
    for t, report in zip(tunable, result.tasks, strict=True):
        assert report.best is not None
        chosen = dict(configs[t.spec.key].items())
        top = report.best.knobs
        if all(top[k] == v for k, v in t.blocks.items() if k in top):
            assert chosen == top
        else:  # the best moves blocks: it wins only by BLOCK_CHANGE_MARGIN and the conversions
            assert chosen == top or all(chosen[k] == v for k, v in t.blocks.items() if k in chosen)
    plan = plan_model(graph, configs)  # the model builder takes them, whatever their blocks
    best = result.tasks[1].best
    assert best is not None
    assert any(s.config is not None and dict(s.config.items()) == best.knobs for s in plan.steps)
    assert configs_from_records(graph, FileRecords(tmp_path / "none.jsonl"), TARGET) == {}


def test_a_config_changing_channel_blocks_must_pay_for_the_conversions(
    graph: Graph, tmp_path: Path
) -> None:
    from tuner.network.tune import BLOCK_CHANGE_MARGIN, layout_cost_s

    tunable, _ = model_tasks(graph)
    mt = tunable[1]  # conv2d_nchwc 32 -> 32, default blocks 16
    space, wl = mt.task.space, mt.task.workload
    keeps = next(
        i for i in range(len(space)) if space.get(i)["ic_block"] == 16 == space.get(i)["oc_block"]
    )
    moves = next(i for i in range(len(space)) if space.get(i)["ic_block"] == 32)
    cost = layout_cost_s(mt, space.get(moves))
    assert cost > 0 and layout_cost_s(mt, space.get(keeps)) == 0.0

    def pick(kept_s: float, moved_s: float) -> int:
        store = FileRecords(tmp_path / f"{kept_s}-{moved_s}.jsonl")
        store.append(
            [
                rec.Record(
                    wl,
                    TARGET,
                    i,
                    mt.task.knobs(i),
                    MeasureResult(Status.OK, (t,)),
                    1.0,
                    "",
                    len(space),
                )
                for i, t in ((keeps, kept_s), (moves, moved_s))
            ]
        )
        return space.index_of(configs_from_records(graph, store, TARGET)[mt.spec.key])

    margin = BLOCK_CHANGE_MARGIN
    assert pick(1.0, 1.0 - margin - cost / 2) == keeps  # faster, but not by the conversions
    assert pick(1.0, 1.0 - margin / 2) == keeps  # faster, but within the margin
    assert pick(1.0, 1.0 - margin - 2 * cost) == moves


def matmul_net() -> Graph:
    """x @ W1 -> Relu -> @ W2: two matmul tasks, quick to lower (transfer models lower configs)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, 64)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((64, 16)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 32))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("transfer", [True, False])
def test_the_tasks_a_transfer_model_started_are_reported(tmp_path: Path, transfer: bool) -> None:
    """With records of the other task in the store, each task's xgb searcher starts from a
    model of them, and the result says which (the CLI prints how many)."""
    graph = matmul_net()
    store = FileRecords(tmp_path / "r.jsonl")
    run(graph, store, 16)  # random search: records of every task
    result = tune_network(
        graph,
        FakeBuilder(),
        FakeRunner(latency_by(uniform)),
        TuneOptions(trials=24, batch_size=4, confirm=0, transfer=transfer),
        store=store,
    )
    assert len(result.tasks) == 2
    if transfer:
        assert set(result.transfer) == {t.best.workload for t in result.tasks if t.best}
        assert all("other workloads" in note for note in result.transfer.values())
    else:
        assert result.transfer == {}


def test_the_report_says_what_the_second_half_of_the_budget_gained(graph: Graph) -> None:
    from kiln.cli.network import report

    result = run(graph, None, 32)
    [(t, s)] = [(t, s) for t, s in result.curve if t <= 16][-1:]
    text = report(result)
    gained = (s - result.estimated_s) / s
    assert f"the estimate after {t} trials was {s * 1e3:.3f} ms" in text
    assert f"the second half of the budget gained {gained:.1%}" in text


def test_a_budget_of_one_round_per_task_says_so(graph: Graph) -> None:
    from kiln.cli.network import report

    result = run(graph, None, 12)  # 3 tasks x 4: the warm-up round alone
    assert "the first estimate came at 12 of 12 trials" in report(result)

"""The tuning loop's resume, early stop, give-up and time accounting, with the fake runner.

No sockets and no compiler: a fake builder makes artifacts whose bytes name their config index,
and `tuner.measure.fake_runner.FakeRunner` times them by a function of that index.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from compiler.artifact import Artifact, Entry
from tuner import records as rec
from tuner.loop import TuningError, on_progress, tune
from tuner.measure import MeasureResult, Status
from tuner.measure.builder import BuildResult
from tuner.measure.fake_runner import FakeRunner
from tuner.measure.runner import Reference
from tuner.options import TuneOptions
from tuner.records import FileRecords
from tuner.search import RandomSearch
from tuner.task import Task

WL = rec.Workload("matmul", (64, 64, 64))
TARGET = "fake-target"


class FakeBuilder:
    """Artifacts whose bytes are their config index; indices in `broken` fail to build."""

    target = TARGET

    def __init__(self, broken: Sequence[int] | range = ()) -> None:
        self.broken = set(broken)
        self.calls = 0

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        self.calls += 1
        out = []
        for i in indices:
            if i in self.broken:
                out.append(BuildResult(i, None, "BuildError: gcc said no\nmore detail"))
                continue
            data = str(i).encode()
            entry = Entry(symbol=f"k{i}", timing_symbol=f"k{i}__time", args=(), flop=1.0)
            art = Artifact(
                data, hashlib.sha256(data).hexdigest(), "shared_object", TARGET, (entry,)
            )
            out.append(BuildResult(i, art))
        return out

    def close(self) -> None:
        pass


def index_of(art: Artifact) -> int:
    return int(art.data)


def faster_with_index(art: Artifact) -> float:
    return 1.0 / (1 + index_of(art))


class InterruptingRunner(FakeRunner):
    """A FakeRunner whose `interrupt_at`-th batch is a Ctrl-C arriving mid-measurement."""

    def __init__(self, interrupt_at: int) -> None:
        super().__init__(faster_with_index)
        self.interrupt_at = interrupt_at
        self.calls = 0

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return super().run(artifacts)


def measured_indices(runner: FakeRunner) -> list[int]:
    by_sha = {hashlib.sha256(str(i).encode()).hexdigest(): i for i in range(10_000)}
    return [by_sha[sha] for sha in runner.measured]


def test_an_interrupted_run_resumes_without_remeasuring_and_ends_at_the_budget(
    tmp_path: Path,
) -> None:
    task = Task(WL)
    store = FileRecords(tmp_path / "r.jsonl")
    first = InterruptingRunner(interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        tune(
            task,
            FakeBuilder(),
            first,
            TuneOptions(trials=40, batch_size=5, tuner="random", confirm=0),
            records=store,
        )
    kept = store.load()
    assert len(kept) == 10  # two whole batches; the one in flight is lost, nothing else
    before = {r.config_index for r in kept}

    second = FakeRunner(faster_with_index)
    seen: list[int] = []
    progress = tune(
        task,
        FakeBuilder(),
        second,
        TuneOptions(trials=40, batch_size=5, resume=True, confirm=0),
        searcher=RandomSearch(len(task.space), seed=1),
        records=store,
        callbacks=[on_progress(lambda p: seen.append(p.trials))],
    )
    assert progress.resumed == 10 and progress.trials == 40 and progress.new_trials == 30
    assert not before & set(measured_indices(second))  # never re-measured
    assert len(second.measured) == 30
    every = store.load()
    assert len(every) == 40 and len({r.config_index for r in every}) == 40
    assert seen == [10, 15, 20, 25, 30, 35, 40]  # the resumed state first, then every batch
    best = max(every, key=lambda r: r.config_index)  # faster_with_index: highest index wins
    assert progress.best is not None and progress.best.config_index == best.config_index


def test_resume_trains_the_model_searcher_on_records_it_never_asked_for(tmp_path: Path) -> None:
    model_search = pytest.importorskip("tuner.search.xgb")
    task = Task(WL)
    store = FileRecords(tmp_path / "r.jsonl")
    tune(
        task,
        FakeBuilder(),
        FakeRunner(faster_with_index),
        TuneOptions(trials=12, batch_size=4, tuner="random", confirm=0),
        records=store,
    )
    earlier = {r.config_index for r in store.load()}
    searcher = model_search.XGBSearcher(task.space, flop=task.flop, seed=0, min_ok=4)
    runner = FakeRunner(faster_with_index)
    progress = tune(
        task,
        FakeBuilder(),
        runner,
        TuneOptions(trials=24, batch_size=4, resume=True, confirm=0),
        searcher=searcher,
        records=store,
    )
    assert progress.resumed == 12 and progress.trials == 24
    assert searcher.n_ok >= 12
    assert not earlier & set(measured_indices(runner))


def test_resume_uses_only_this_target_and_this_space(tmp_path: Path) -> None:
    task = Task(WL)
    store = FileRecords(tmp_path / "r.jsonl")
    size = len(task.space)

    def record(index: int, target: str, space_size: int, knobs: dict[str, object]) -> rec.Record:
        result = MeasureResult(Status.OK, (1e-9,), device_id="x/0")
        return rec.Record(WL, target, index, knobs, result, task.flop, rec.now_iso(), space_size)

    store.append(
        [
            record(0, TARGET, size, task.knobs(0)),  # usable
            record(1, "aarch64-neon", size, task.knobs(1)),  # another target
            record(2, TARGET, size + 1, task.knobs(2)),  # a space of another size
            record(3, TARGET, 0, {"not": "these knobs"}),  # index now names another config
            record(0, TARGET, size, task.knobs(0)),  # a duplicate counts once
        ]
    )
    progress = tune(
        task,
        FakeBuilder(),
        FakeRunner(faster_with_index),
        TuneOptions(trials=6, batch_size=3, resume=True, tuner="random", confirm=0),
        records=store,
    )
    assert progress.resumed == 1 and progress.trials == 6
    assert progress.best is not None and progress.best.config_index == 0  # its 1 ns stays best


def test_early_stop_ends_the_run_after_n_trials_without_improvement(tmp_path: Path) -> None:
    task = Task(WL)
    store = FileRecords(tmp_path / "r.jsonl")
    progress = tune(
        task,
        FakeBuilder(),
        FakeRunner(lambda art: 1.0),
        TuneOptions(trials=100, batch_size=3, early_stop=7, tuner="random", confirm=0),
        records=store,
    )
    # best at trial 1; 7 more trials without improvement are done after the third batch
    assert progress.trials == 9 and progress.best_at == 1
    assert "no better candidate in 7 trials" in progress.stop_reason
    assert len(store.load()) == 9


def test_early_stop_counts_from_the_latest_improvement() -> None:
    task = Task(WL)

    def improving_until_10(art: Artifact) -> float:
        return 1.0 / (1 + min(index_of(art), 10))

    progress = tune(
        task,
        FakeBuilder(),
        FakeRunner(improving_until_10),
        TuneOptions(trials=100, batch_size=2, early_stop=4, confirm=0),
        searcher=InOrder(),
    )
    # configs 0..10 keep improving; 11.. do not: best at trial 11, stop once 4 more are done
    assert progress.best_at == 11 and progress.trials == 16
    assert progress.best is not None and progress.best.config_index == 10


class InOrder:
    """Proposes 0, 1, 2, ... (a searcher whose order the test knows)."""

    def __init__(self) -> None:
        self.next = 0

    def ask(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out

    def tell(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        pass


def test_a_template_whose_every_config_fails_ends_after_two_batches() -> None:
    task = Task(WL)
    builder = FakeBuilder(broken=range(len(task.space)))
    runner = FakeRunner(faster_with_index)
    with pytest.raises(TuningError) as info:
        tune(
            task, builder, runner, TuneOptions(trials=1000, batch_size=4, tuner="random", confirm=0)
        )
    message = str(info.value)
    assert builder.calls == 2 and runner.measured == []  # not the whole budget of 1000
    assert "in the first 8 trials (2 batches); giving up" in message
    assert "8x BUILD_ERROR: BuildError: gcc said no" in message
    assert "more detail" not in message  # one line per cause


def test_runtime_failures_everywhere_also_end_early_naming_the_cause() -> None:
    def crash(art: Artifact) -> float:
        raise RuntimeError("kernel wrote out of bounds")

    with pytest.raises(TuningError, match=r"6x RUNTIME_ERROR: kernel wrote out of bounds"):
        tune(
            Task(WL),
            FakeBuilder(),
            FakeRunner(crash),
            TuneOptions(trials=500, batch_size=3, tuner="random", confirm=0),
        )


def test_failures_after_a_resumed_success_do_not_give_up(tmp_path: Path) -> None:
    task = Task(WL)
    store = FileRecords(tmp_path / "r.jsonl")
    tune(
        task,
        FakeBuilder(),
        FakeRunner(faster_with_index),
        TuneOptions(trials=4, batch_size=4, tuner="random", confirm=0),
        records=store,
    )
    broken = FakeBuilder(broken=range(len(task.space)))
    progress = tune(
        task,
        broken,
        FakeRunner(faster_with_index),
        TuneOptions(trials=16, batch_size=4, resume=True, tuner="random", confirm=0),
        records=store,
    )
    assert progress.trials == 16 and progress.errors == 12 and broken.calls == 3


class CountingSearch(RandomSearch):
    """Random search that says each ask cost 0.25 s of model time (a stand-in for a cost model)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.model_seconds = 0.0
        self.asks = 0

    def ask(self, n: int) -> list[int]:
        self.asks += 1
        self.model_seconds += 0.25
        return super().ask(n)


def test_time_accounting_takes_the_searchers_model_seconds() -> None:
    task = Task(WL)
    searcher = CountingSearch(len(task.space))
    progress = tune(
        task,
        FakeBuilder(),
        FakeRunner(faster_with_index),
        TuneOptions(trials=12, batch_size=4, confirm=0),
        searcher=searcher,
    )
    assert searcher.asks == 3 and progress.model_s == pytest.approx(0.75)
    assert progress.model_share == pytest.approx(progress.model_s / progress.wall_s)
    assert progress.wall_s >= progress.build_s + progress.measure_s
    assert progress.stop_reason == "trial budget reached"


def test_resume_without_a_store_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="resume needs a records store"):
        tune(
            Task(WL),
            FakeBuilder(),
            FakeRunner(faster_with_index),
            TuneOptions(trials=4, resume=True, tuner="random", confirm=0),
        )


def test_resume_judges_a_config_measured_again_by_its_upper_median() -> None:
    from dataclasses import replace

    from tuner.loop import resumable_records
    from tuner.measure import MeasureResult, Status
    from tuner.task import Task

    task = Task(rec.Workload("matmul", (64, 64, 64)))
    size = len(task.space)

    def record(index: int, seconds: float, confirmation: bool = False) -> rec.Record:
        result = MeasureResult(Status.OK, (seconds,), device_id="d/0")
        r = rec.Record(task.workload, "t", index, task.knobs(index), result, 1.0, "", size)
        return replace(r, confirmation=confirmation)

    chosen = resumable_records(
        task, [record(3, 0.1), record(5, 0.2), record(3, 0.9, True), record(3, 0.8, True)]
    )
    assert [(r.config_index, r.result.median_s) for r in chosen] == [(3, 0.8), (5, 0.2)]

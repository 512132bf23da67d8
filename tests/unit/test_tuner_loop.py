"""The tuning loop with a fake builder and the fake runner: no sockets, no compiler."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from compiler.artifact import Artifact, Entry
from tuner import records as rec
from tuner.loop import TuningError, tune
from tuner.measure import MeasureResult, Status
from tuner.measure.builder import BuildResult
from tuner.measure.fake_runner import FakeRunner
from tuner.measure.runner import Reference
from tuner.options import TuneOptions
from tuner.search import RandomSearch
from tuner.task import Task

WL = rec.Workload("matmul", (64, 64, 64))


class FakeBuilder:
    """Artifacts whose bytes name their config index; indices in `broken` fail to build."""

    target = "fake-target"

    def __init__(self, broken: Sequence[int] = ()) -> None:
        self.broken = set(broken)
        self.asked: list[int] = []

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        out = []
        self.asked += indices
        for i in indices:
            if i in self.broken:
                out.append(BuildResult(i, None, "BuildError: gcc said no"))
                continue
            data = str(i).encode()
            entry = Entry(symbol=f"k{i}", timing_symbol=f"k{i}__time", args=(), flop=1.0)
            art = Artifact(
                data, hashlib.sha256(data).hexdigest(), "shared_object", self.target, (entry,)
            )
            out.append(BuildResult(i, art))
        return out

    def close(self) -> None:
        pass


def seconds_by_index(art: Artifact) -> float:
    return 1.0 / (1 + int(art.data))  # higher index = faster


def test_random_search_never_repeats_and_exhausts_the_space() -> None:
    s = RandomSearch(50, seed=3)
    seen: list[int] = []
    while batch := s.ask(7):
        seen += batch
    assert sorted(seen) == list(range(50))


def test_loop_records_every_candidate_and_finds_the_fastest(tmp_path: Path) -> None:
    task = Task(WL)
    size = len(task.space)
    path = tmp_path / "r.jsonl"
    runner = FakeRunner(seconds_by_index)
    progress = tune(
        task,
        FakeBuilder(broken=[0]),
        runner,
        TuneOptions(trials=size, batch_size=5, tuner="random", confirm=0),
        records=path,
    )
    assert progress.trials == size
    assert progress.best is not None and progress.best.config_index == size - 1
    loaded = list(rec.load(path))
    assert sorted(r.config_index for r in loaded) == list(range(size))
    assert [r.result.status for r in loaded if r.config_index == 0] == [Status.BUILD_ERROR]
    assert all(r.target == "fake-target" for r in loaded)
    assert len(runner.measured) == size - 1  # the broken config never reached the runner


def test_a_space_where_nothing_builds_ends_with_a_clear_error() -> None:
    task = Task(WL)
    with pytest.raises(TuningError, match="BUILD_ERROR: BuildError: gcc said no"):
        tune(
            task,
            FakeBuilder(broken=range(len(task.space))),
            FakeRunner(seconds_by_index),
            TuneOptions(trials=10, tuner="random", confirm=0),
        )


class LuckyOnce:
    """Config 7 is fastest the first time it runs and slow ever after (a lucky measurement on a
    shared machine); every other config is steady, higher index faster up to config 5."""

    def __init__(self) -> None:
        self.runs: dict[int, int] = {}

    def __call__(self, art: Artifact) -> float:
        i = int(art.data)
        self.runs[i] = self.runs.get(i, 0) + 1
        if i == 7:
            return 0.05 if self.runs[i] == 1 else 0.5
        return 1.0 / (1 + min(i, 5))


def test_confirm_measures_the_top_configs_again_and_drops_a_lucky_one(tmp_path: Path) -> None:
    task = Task(WL)
    path = tmp_path / "r.jsonl"
    timing = LuckyOnce()
    runner = FakeRunner(timing)
    builder = FakeBuilder()
    progress = tune(
        task,
        builder,
        runner,
        TuneOptions(trials=8, batch_size=8, confirm=3),
        searcher=ListSearch(list(range(8))),
        records=path,
    )
    assert progress.trials == 8  # confirmation rounds are not trials
    # the three fastest at first (7, 5 and 6 tie with 5: 5 comes first) ran twice more each
    assert timing.runs[7] == 3 and sum(n == 3 for n in timing.runs.values()) == 3
    # built once more for both rounds
    assert builder.asked == [*range(8), 7, 5, 6]
    assert len(progress.confirmations) == 6
    assert progress.best is not None and progress.best.config_index in (5, 6)
    assert progress.best.result.median_s == pytest.approx(1 / 6)
    # the store holds the confirmations, and its best is the steady config too
    loaded = list(rec.load(path))
    assert len(loaded) == 14
    stored = rec.best(loaded, WL, "fake-target")
    assert stored is not None and stored.config_index in (5, 6)


def test_without_confirm_the_lucky_measurement_wins() -> None:
    """What `confirm` guards against: a single lucky run is taken at its word."""
    progress = tune(
        Task(WL),
        FakeBuilder(),
        FakeRunner(LuckyOnce()),
        TuneOptions(trials=8, batch_size=8, confirm=0),
        searcher=ListSearch(list(range(8))),
    )
    assert progress.best is not None and progress.best.config_index == 7
    assert progress.confirmations == []


class ListSearch:
    """Proposes a fixed list of configs, in order."""

    model_seconds = 0.0

    def __init__(self, order: list[int]) -> None:
        self.order = list(order)

    def ask(self, n: int) -> list[int]:
        out, self.order = self.order[:n], self.order[n:]
        return out

    def tell(self, indices: Sequence[int], results: Sequence[object]) -> None:
        pass


class OverlapProbe:
    """A builder and runner pair that notes, for each batch measured, whether the next batch's
    build had started by then (the runner waits up to `wait_s` for it, then gives up)."""

    target = FakeBuilder.target

    def __init__(self, wait_s: float) -> None:
        self.builder = FakeBuilder()
        self.builds = 0
        self.cond = threading.Condition()
        self.overlapped: list[bool] = []
        self.wait_s = wait_s
        self.fake = FakeRunner(seconds_by_index)

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        with self.cond:
            self.builds += 1
            self.cond.notify_all()
        return self.builder.build(workload, indices)

    def close(self) -> None:
        pass

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        with self.cond:
            batch = len(self.overlapped) + 1
            self.overlapped.append(
                self.cond.wait_for(lambda: self.builds > batch, timeout=self.wait_s)
            )
        return self.fake.run(artifacts)


def test_pipeline_builds_the_next_batch_while_this_one_is_measured(tmp_path: Path) -> None:
    probe = OverlapProbe(wait_s=2.0)
    path = tmp_path / "r.jsonl"
    space = len(Task(WL).space)
    progress = tune(
        Task(WL),
        probe,
        probe,
        TuneOptions(trials=20, batch_size=4, pipeline=True, confirm=0),
        searcher=RandomSearch(space, seed=1),
        records=path,
    )
    # five batches of 4: batches 2..5 were built while 1..4 were measured; the last had none
    assert probe.builds == 5 and probe.overlapped == [True, True, True, True, False]
    loaded = list(rec.load(path))
    assert progress.trials == len(loaded) == 20
    assert len({r.config_index for r in loaded}) == 20  # nothing twice, budget exact


def test_without_pipeline_the_devices_wait_for_each_build() -> None:
    probe = OverlapProbe(wait_s=0.05)
    tune(
        Task(WL),
        probe,
        probe,
        TuneOptions(trials=8, batch_size=4, confirm=0),
        searcher=RandomSearch(len(Task(WL).space), seed=1),
    )
    assert probe.builds == 2 and probe.overlapped == [False, False]


def test_pipeline_drops_the_batch_built_ahead_when_tuning_stops_early(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    builder = CountingBuilder()
    progress = tune(
        Task(WL),
        builder,
        FakeRunner(lambda art: 1.0),
        TuneOptions(trials=64, batch_size=4, early_stop=8, pipeline=True, confirm=0),
        searcher=RandomSearch(len(Task(WL).space), seed=2),
        records=path,
    )
    assert progress.stop_reason == "no better candidate in 8 trials"
    assert progress.trials == 12 == len(list(rec.load(path)))  # 3 batches measured
    assert builder.built == 16  # the fourth was built ahead, then dropped


class CountingBuilder(FakeBuilder):
    built = 0

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        self.built += len(indices)
        return super().build(workload, indices)


class CheckRecordingBuilder(FakeBuilder):
    """Remembers the `check` of every build call."""

    def __init__(self) -> None:
        super().__init__()
        self.checks: list[bool] = []

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        self.checks.append(check)
        return super().build(workload, indices)


@pytest.mark.parametrize("check", [True, False])
def test_the_run_options_check_reaches_every_build_of_any_builder(check: bool) -> None:
    """The check is the run's choice, not the builder's: batches built ahead by the pipeline
    and the confirmation rounds ask the same."""
    builder = CheckRecordingBuilder()
    options = TuneOptions(
        trials=24, batch_size=8, tuner="random", confirm=2, pipeline=True, check=check
    )
    progress = tune(Task(WL), builder, FakeRunner(seconds_by_index), options)
    assert progress.confirmations  # the confirmation rounds built too
    assert len(builder.checks) >= 4 and set(builder.checks) == {check}

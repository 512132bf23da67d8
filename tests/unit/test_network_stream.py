"""Network tuning with `pipeline`: a batch's candidates are measured as their builds finish, so
one slow build holds up only itself. A fake streaming builder on threads and the fake runner; the
net is `test_network_tune`'s (three tunable tasks)."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from test_network_tune import FakeBuilder, conv_net, latency_by, random_factory, uniform

from compiler.artifact import Artifact, Entry
from compiler.graph.ir import Graph
from tuner import records as rec
from tuner.measure import MeasureResult, Status
from tuner.measure.build_stream import BuildResult, BuildStream, FuturesEngine
from tuner.measure.builder import Builder, StreamingBuilder
from tuner.measure.fake_runner import FakeRunner
from tuner.measure.runner import Reference, Runner
from tuner.network.tune import ModelTuneResult, tune_network
from tuner.options import TuneOptions
from tuner.records import FileRecords
from tuner.search import Searcher
from tuner.task import Task

TARGET = FakeBuilder.target
# How long the slow build waits for its gate before it goes on anyway (bounds a failing run).
WAIT_S = 10.0


def fake_build(workload: rec.Workload, i: int) -> BuildResult:
    """What `FakeBuilder` builds: bytes naming the workload and the config index."""
    data = f"{workload}|{i}".encode()
    entry = Entry(symbol=f"k{i}", timing_symbol=f"k{i}__time", args=(), flop=1.0)
    art = Artifact(data, hashlib.sha256(data).hexdigest(), "shared_object", TARGET, (entry,))
    return BuildResult(i, art)


def name_of(art: Artifact) -> tuple[str, int]:
    workload, index = art.data.decode().rsplit("|", 1)
    return workload, int(index)


class OneSlowBuild:
    """A streaming builder of fake artifacts, one unit per index on threads: the first index of
    the first batch it is given waits for `gate` (at most WAIT_S) before it is built."""

    target = TARGET

    def __init__(self, timeout_s: float | None = None) -> None:
        self.timeout_s = timeout_s
        self.gate = threading.Event()
        self.slow: tuple[str, int] | None = None
        self.slow_done = threading.Event()
        self._threads = ThreadPoolExecutor(4)

    def _unit(self, workload: rec.Workload, i: int, slow: bool) -> list[BuildResult]:
        if slow:
            self.gate.wait(WAIT_S)
            self.slow_done.set()
        return [fake_build(workload, i)]

    def submit(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> BuildStream:
        if self.slow is None:
            self.slow = (str(workload), indices[0])
        tasks = [
            self._threads.submit(self._unit, workload, i, self.slow == (str(workload), i))
            for i in indices
        ]
        units = [[i] for i in indices]
        return BuildStream(zip(units, tasks, strict=True), FuturesEngine(), self.timeout_s)

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        return self.submit(workload, indices, check).results()

    def close(self) -> None:
        self.gate.set()
        self._threads.shutdown(wait=True)


class Watching:
    """The fake runner, noting each call's candidates and whether the slow build was done by
    then; `opens` opens the builder's gate once anything was measured."""

    def __init__(self, builder: OneSlowBuild, opens: bool) -> None:
        self.builder = builder
        self.opens = opens
        self.calls: list[tuple[list[tuple[str, int]], bool]] = []
        self.fake = FakeRunner(latency_by(uniform))

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        self.calls.append(([name_of(a) for a in artifacts], self.builder.slow_done.is_set()))
        if self.opens:
            self.builder.gate.set()
        return self.fake.run(artifacts)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def graph() -> Graph:
    return conv_net()


@pytest.fixture
def slow() -> Iterator[OneSlowBuild]:
    builder = OneSlowBuild()
    yield builder
    builder.close()


def options(pipeline: bool) -> TuneOptions:
    return TuneOptions(trials=16, batch_size=4, confirm=0, pipeline=pipeline)


class Told:
    """Each task's searcher as `random_factory` makes it, noting every tell (in `told`)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, list[int], list[tuple[Status, float]]]] = []

    def __call__(self, task: Task, valid: Callable[[int], bool]) -> Searcher:
        inner, told = random_factory(task, valid), self.told

        class Noting:
            def ask(self, n: int) -> list[int]:
                return inner.ask(n)

            def tell(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
                told.append(
                    (str(task.workload), list(indices), [(r.status, r.median_s) for r in results])
                )
                inner.tell(indices, results)

        return Noting()


def tune(
    graph: Graph,
    builder: Builder,
    runner: Runner,
    opts: TuneOptions,
    store: FileRecords,
    told: Told | None = None,
) -> ModelTuneResult:
    factory = told or random_factory
    return tune_network(graph, builder, runner, opts, store=store, searcher_factory=factory)


def contents(result: ModelTuneResult, store: FileRecords) -> list[tuple[object, ...]]:
    """Every record without its time stamp, in the order written, and the scheduler's story."""
    records = [
        (r.workload, r.target, r.config_index, r.knobs, r.result.status, r.result.samples_s)
        for r in store.load()
    ]
    story = [(a.task, a.reason, a.trials) for a in result.schedule.allocations]
    return [*records, *story]


def test_a_batch_is_measured_as_its_builds_finish(
    graph: Graph, slow: OneSlowBuild, tmp_path: Path
) -> None:
    assert isinstance(slow, StreamingBuilder)
    runner = Watching(slow, opens=True)
    store, told = FileRecords(tmp_path / "r.jsonl"), Told()
    result = tune(graph, slow, runner, options(True), store, told)
    first, slow_done_then = runner.calls[0]
    # the first batch's fast candidates went to the runner while its slow build still waited
    assert slow.slow is not None and not slow_done_then
    assert first and slow.slow not in first and {w for w, _ in first} == {slow.slow[0]}
    measured = [c for call, _ in runner.calls for c in call]
    assert slow.slow in measured and measured.index(slow.slow) >= len(first)
    records = store.load()
    assert len(records) == result.trials == 16 and all(r.result.ok for r in records)
    # records, tells and the scheduler's choices are what whole-batch building gives
    plain, plain_told = FileRecords(tmp_path / "plain.jsonl"), Told()
    plain_result = tune(
        graph, FakeBuilder(), FakeRunner(latency_by(uniform)), options(False), plain, plain_told
    )
    assert contents(result, store) == contents(plain_result, plain)
    assert len(told.told) == 4 and told.told == plain_told.told  # one tell per batch


def test_without_pipeline_a_network_batch_is_built_whole(
    graph: Graph, slow: OneSlowBuild, tmp_path: Path
) -> None:
    slow.gate.set()
    runner = Watching(slow, opens=False)
    tune(graph, slow, runner, options(False), FileRecords(tmp_path / "r.jsonl"))
    assert [len(call) for call, _ in runner.calls] == [4] * 4  # one call per batch
    assert all(done for _, done in runner.calls)


def test_a_build_past_its_timeout_is_a_build_error_and_the_rest_are_measured(
    graph: Graph, tmp_path: Path
) -> None:
    builder = OneSlowBuild(timeout_s=0.2)  # the gate stays shut: the slow build never ends
    try:
        runner = Watching(builder, opens=False)
        store = FileRecords(tmp_path / "r.jsonl")
        tune(graph, builder, runner, options(True), store)
    finally:
        builder.close()
    records = store.load()
    [late] = [r for r in records if (str(r.workload), r.config_index) == builder.slow]
    assert late.result.status is Status.BUILD_ERROR and "build timed out" in late.result.error
    assert sum(r.result.ok for r in records) == len(records) - 1 == 15


class BuiltAhead:
    """The fake runner; at each of the first `watch` calls it waits (at most WAIT_S) until the
    builder has been given a workload not yet measured besides the one it measures, and notes
    whether that happened."""

    def __init__(self, builder: FakeBuilder, watch: int) -> None:
        self.builder, self.watch = builder, watch
        self.measured: list[str] = []
        self.ahead: list[bool] = []
        self.fake = FakeRunner(latency_by(uniform))

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        workload = name_of(artifacts[0])[0]
        if workload not in self.measured:
            self.measured.append(workload)
        if len(self.ahead) < self.watch:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                if {str(w) for w, _ in self.builder.built} - set(self.measured):
                    break
                time.sleep(0.01)
            self.ahead.append(bool({str(w) for w, _ in self.builder.built} - set(self.measured)))
        return self.fake.run(artifacts)

    def close(self) -> None:
        pass


def test_the_next_task_is_built_while_this_one_is_measured(graph: Graph, tmp_path: Path) -> None:
    builder = FakeBuilder()  # a plain builder: built ahead on a thread
    runner = BuiltAhead(builder, watch=2)
    store = FileRecords(tmp_path / "r.jsonl")
    result = tune(graph, builder, runner, options(True), store)
    # the warm-up's second and third tasks were being built while the first and second measured
    assert runner.ahead == [True, True]
    assert len(store.load()) == result.trials == 16
    plain = FileRecords(tmp_path / "plain.jsonl")
    plain_result = tune(
        graph, FakeBuilder(), FakeRunner(latency_by(uniform)), options(False), plain
    )
    assert contents(result, store) == contents(plain_result, plain)


class Logged(FakeBuilder):
    """FakeBuilder as a streaming builder whose every submit is noted in `log` at once."""

    timeout_s = None

    def __init__(self, log: list[tuple[str, str, tuple[int, ...]]]) -> None:
        super().__init__()
        self.log = log

    def submit(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> BuildStream:
        self.log.append(("submit", str(workload), tuple(indices)))
        done: Future[list[BuildResult]] = Future()
        done.set_result(self.build(workload, indices, check))
        return BuildStream([(list(indices), done)], FuturesEngine())


class LoggedRunner:
    def __init__(self, log: list[tuple[str, str, tuple[int, ...]]]) -> None:
        self.log = log
        self.fake = FakeRunner(latency_by(uniform))

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        names = [name_of(a) for a in artifacts]
        self.log.append(("measure", names[0][0], tuple(i for _, i in names)))
        return self.fake.run(artifacts)

    def close(self) -> None:
        pass


def test_the_next_tasks_confirmation_is_built_while_this_one_is_measured(
    graph: Graph, tmp_path: Path
) -> None:
    log: list[tuple[str, str, tuple[int, ...]]] = []
    store = FileRecords(tmp_path / "r.jsonl")
    opts = TuneOptions(trials=16, batch_size=4, confirm=2, pipeline=True)
    result = tune(graph, Logged(log), LoggedRunner(log), opts, store)
    confirmed: dict[str, list[int]] = {}
    for r in store.load():
        if r.confirmation and r.config_index not in confirmed.setdefault(str(r.workload), []):
            confirmed[str(r.workload)].append(r.config_index)
    order = list(confirmed)
    assert len(order) == 3
    for a, b in itertools.pairwise(order):
        submitted_a = log.index(("submit", a, tuple(confirmed[a])))
        submitted_b = log.index(("submit", b, tuple(confirmed[b])))
        measured_a = next(
            i for i, e in enumerate(log) if i > submitted_a and e[:2] == ("measure", a)
        )
        assert submitted_a < submitted_b < measured_a
    # each confirmation set was built once for its two rounds
    assert sum(e[0] == "submit" and e[2] == tuple(confirmed[a]) for e in log for a in order) == 3
    plain = FileRecords(tmp_path / "plain.jsonl")
    opts_plain = TuneOptions(trials=16, batch_size=4, confirm=2, pipeline=False)
    plain_result = tune(graph, FakeBuilder(), FakeRunner(latency_by(uniform)), opts_plain, plain)
    assert contents(result, store) == contents(plain_result, plain)

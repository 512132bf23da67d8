"""Build streams: results handed back as units finish, every index once, failures as results
(a task that raised, bytes that do not match their hash, a unit past its timeout), and the
tuning loop measuring a batch's first builds while a slow one still runs. Threads only."""

from __future__ import annotations

import copy
import hashlib
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from compiler.artifact import Artifact, Entry
from tuner import records as rec
from tuner.loop import tune
from tuner.measure import MeasureResult
from tuner.measure.build_stream import BuildResult, BuildStream, FuturesEngine
from tuner.measure.builder import StreamingBuilder
from tuner.measure.fake_runner import FakeRunner
from tuner.measure.runner import Reference
from tuner.options import TuneOptions
from tuner.task import Task

WL = rec.Workload("matmul", (64, 64, 64))
WAIT_S = 30.0


def built(i: int) -> BuildResult:
    data = str(i).encode()
    entry = Entry(symbol=f"k{i}", timing_symbol=f"k{i}__time", args=(), flop=1.0)
    art = Artifact(data, hashlib.sha256(data).hexdigest(), "shared_object", "fake-target", (entry,))
    return BuildResult(i, art)


class GatedBuilder:
    """A streaming builder of fake artifacts, one unit per index, on threads; the build of
    `slow` waits for `gate` (a test sets it once the runner has seen other candidates)."""

    target = "fake-target"

    def __init__(self, slow: int, timeout_s: float | None = None) -> None:
        self.slow = slow
        self.timeout_s = timeout_s
        self.gate = threading.Event()
        self._threads = ThreadPoolExecutor(4)

    def _unit(self, i: int) -> list[BuildResult]:
        if i == self.slow and not self.gate.wait(WAIT_S):
            raise TimeoutError("nobody opened the gate")
        return [built(i)]

    def submit(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> BuildStream:
        tasks = [self._threads.submit(self._unit, i) for i in indices]
        return BuildStream(
            zip([[i] for i in indices], tasks, strict=True), FuturesEngine(), self.timeout_s
        )

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        return self.submit(workload, indices, check).results()

    def close(self) -> None:
        self.gate.set()
        self._threads.shutdown(wait=True)


@pytest.fixture
def gated() -> Iterator[GatedBuilder]:
    builder = GatedBuilder(slow=7)
    yield builder
    builder.close()


class OpensGate:
    """A runner that notes the config indices of each call and opens the builder's gate once it
    has measured anything."""

    def __init__(self, builder: GatedBuilder) -> None:
        self.builder = builder
        self.calls: list[list[int]] = []
        self.fake = FakeRunner(lambda art: 1.0 / (1 + int(art.data)))

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        self.calls.append([int(a.data) for a in artifacts])
        self.builder.gate.set()
        return self.fake.run(artifacts)

    def close(self) -> None:
        pass


class ListSearch:
    def __init__(self, order: list[int]) -> None:
        self.order = order

    def ask(self, n: int) -> list[int]:
        out, self.order = self.order[:n], self.order[n:]
        return out

    def tell(self, indices: Sequence[int], results: Sequence[object]) -> None:
        pass


def test_the_loop_measures_finished_builds_while_a_slow_one_runs(gated: GatedBuilder) -> None:
    assert isinstance(gated, StreamingBuilder)
    runner = OpensGate(gated)
    progress = tune(
        Task(WL),
        gated,
        runner,
        TuneOptions(trials=8, batch_size=4, pipeline=True, confirm=0, check=False),
        searcher=ListSearch([7, 1, 2, 3, 4, 5, 6, 0]),
    )
    # the first batch's other three were measured before build 7 was let go
    assert 7 not in runner.calls[0] and set(runner.calls[0]) <= {1, 2, 3}
    assert sorted(i for call in runner.calls for i in call) == list(range(8))
    assert [r.config_index for r in progress.history] == [7, 1, 2, 3, 4, 5, 6, 0]  # batch order
    assert all(r.result.ok for r in progress.history)


def test_without_pipeline_the_loop_builds_whole_batches(gated: GatedBuilder) -> None:
    gated.gate.set()
    runner = OpensGate(gated)
    tune(
        Task(WL),
        gated,
        runner,
        TuneOptions(trials=8, batch_size=4, confirm=0, check=False),
        searcher=ListSearch(list(range(8))),
    )
    assert runner.calls == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_unit_past_its_timeout_fails_and_the_others_stream_on() -> None:
    builder = GatedBuilder(slow=2, timeout_s=0.2)
    try:
        stream = builder.submit(WL, [1, 2, 3])
        chunks = list(stream.as_completed())
        got = {b.config_index: b for chunk in chunks for b in chunk}
    finally:
        builder.close()
    assert sorted(got) == [1, 2, 3]
    assert got[1].artifact is not None and got[3].artifact is not None
    assert got[2].artifact is None and "build timed out" in got[2].error
    assert chunks[-1] == [got[2]]  # the others came first
    assert stream.seconds > 0


def test_failures_of_the_engine_or_the_bytes_are_build_errors() -> None:
    good = built(1)
    assert good.artifact is not None
    forged = copy.copy(good.artifact)  # as unpickling does, without __post_init__'s check
    object.__setattr__(forged, "data", b"not 1")  # bytes and hash disagree
    with ThreadPoolExecutor(2) as threads:

        def raises() -> list[BuildResult]:
            raise RuntimeError("worker lost")

        tasks = [
            ([1], threads.submit(lambda: [BuildResult(1, forged)])),
            ([2], threads.submit(raises)),
            ([3], threads.submit(lambda: [built(4)])),  # answers for another index
        ]
        results = BuildStream(tasks, FuturesEngine()).results()
    assert [r.config_index for r in results] == [1, 2, 3]
    assert all(r.artifact is None for r in results)
    assert "do not match their sha256" in results[0].error
    assert results[1].error == "build task failed: RuntimeError: worker lost"
    assert "answered for [4]" in results[2].error


def test_a_cancelled_stream_hands_nothing_more_back() -> None:
    builder = GatedBuilder(slow=5)
    try:
        stream = builder.submit(WL, [5])
        stream.cancel()
        assert list(stream.as_completed()) == []
    finally:
        builder.close()

"""A candidate's build result, and a batch's builds handed back as they finish.

A streaming builder's `submit(workload, indices, check)` starts one task per translation unit on
its engine (a process pool, a Dask cluster) and returns a `BuildStream` at once.
`BuildStream.as_completed()` then yields the results in chunks, each chunk every result that
finished since the last (at least one unit's), so the tuning loop measures the first candidates
while the others still compile, and one slow build holds up only itself. `results()` waits for
all of them and gives them in the order asked, as `Builder.build` does.

What MUST hold, whatever the engine: every index asked comes back exactly once; a failure is a
BUILD_ERROR-bound `BuildResult` (artifact None, the error's text), never an exception: a task
that raised, was cancelled or lost its engine, an artifact whose bytes do not match its sha256
(a transfer gone wrong), and a unit not done `timeout_s` after it started ("timed out"; the
task is cancelled, and where the engine cannot stop a running task, as a process pool or a Dask
worker cannot, it runs on and its result is dropped).

"Started" is what the engine can tell: a process pool's task is running once it is in the
pool's call queue (at most one unit per pool ahead of the workers), a Dask task once the
scheduler has handed it to a worker. An engine that cannot answer (its scheduler gone) starts
every clock, so a stream always ends.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from compiler.artifact import Artifact
from tuner.measure.runner import Reference

# How often a stream asks its engine which units have started, while some have not; the wait
# returns at once when a unit finishes, so this only bounds how late a timeout's clock starts.
POLL_S = 0.25


@dataclass(frozen=True)
class BuildResult:
    """One candidate: its artifact (own entry first), or None with the error that stopped it;
    with the builder's `check`, the reference kernel its outputs are checked against."""

    config_index: int
    artifact: Artifact | None
    error: str = ""
    reference: Reference | None = None


def failed(indices: Iterable[int], error: str) -> list[BuildResult]:
    """A BUILD_ERROR-bound result for each of `indices`, all with `error`."""
    return [BuildResult(i, None, error) for i in indices]


class Engine(Protocol):
    """How a stream watches the tasks of its builder's engine (`handle`: one unit's task)."""

    def wait_any(self, handles: Sequence[Any], timeout_s: float) -> None:
        """Return when one of `handles` is done, or after `timeout_s`."""
        ...

    def done(self, handle: Any) -> bool: ...

    def started(self, handles: Sequence[Any]) -> list[bool]:
        """Whether each task has started (True for all when the engine cannot say)."""
        ...

    def result(self, handle: Any) -> list[BuildResult]:
        """A done task's results; raises what the task raised."""
        ...

    def cancel(self, handle: Any) -> None: ...


class FuturesEngine:
    """The engine of `concurrent.futures` (process and thread pools)."""

    def wait_any(self, handles: Sequence[Any], timeout_s: float) -> None:
        concurrent.futures.wait(handles, timeout_s, concurrent.futures.FIRST_COMPLETED)

    def done(self, handle: Any) -> bool:
        return bool(handle.done())

    def started(self, handles: Sequence[Any]) -> list[bool]:
        return [h.running() or h.done() for h in handles]

    def result(self, handle: Any) -> list[BuildResult]:
        return list(handle.result())

    def cancel(self, handle: Any) -> None:
        handle.cancel()


@dataclass(eq=False)
class _Unit:
    indices: list[int]
    handle: Any
    started_at: float | None = None


class BuildStream:
    """The started builds of one batch (see the module docstring).

    Args:
        units: each unit's config indices and its task on `engine`.
        engine: what runs the tasks.
        timeout_s: a unit not done this long after it started fails (None: no limit).
    """

    def __init__(
        self,
        units: Iterable[tuple[Sequence[int], Any]],
        engine: Engine,
        timeout_s: float | None = None,
    ) -> None:
        self._t0 = time.monotonic()
        self.engine = engine
        self.timeout_s = timeout_s
        self.order: list[int] = []  # every index, in the order the units were given
        self._left: list[_Unit] = []
        for indices, handle in units:
            self._left.append(_Unit(list(indices), handle))
            self.order.extend(indices)
        self.seconds = 0.0  # from submit to the last result, once the stream is drained

    def as_completed(self) -> Iterator[list[BuildResult]]:
        """Chunks of results as units finish (or time out); every index once, then the end."""
        while self._left:
            now = time.monotonic()
            self._start_clocks(now)
            done = [u for u in self._left if self.engine.done(u.handle)]
            late = [u for u in self._left if u not in done and self._expired(u, now)]
            if not done and not late:
                self.engine.wait_any([u.handle for u in self._left], self._tick(now))
                continue
            chunk = [r for u in done for r in self._outcome(u)]
            for u in late:
                self.engine.cancel(u.handle)
                chunk += failed(
                    u.indices, f"build timed out: not done {self.timeout_s:g} s after it started"
                )
            self._left = [u for u in self._left if u not in done and u not in late]
            if not self._left:
                self.seconds = time.monotonic() - self._t0
            yield chunk

    def results(self) -> list[BuildResult]:
        """Every result, in the order the units were given (what `Builder.build` returns)."""
        by_index = {r.config_index: r for chunk in self.as_completed() for r in chunk}
        return [by_index[i] for i in self.order]

    def cancel(self) -> None:
        """Cancel every unit not handed out yet (a batch built ahead that is not wanted)."""
        for u in self._left:
            self.engine.cancel(u.handle)
        self._left = []

    def _start_clocks(self, now: float) -> None:
        if self.timeout_s is None:
            return
        waiting = [u for u in self._left if u.started_at is None]
        if not waiting:
            return
        for u, started in zip(
            waiting, self.engine.started([u.handle for u in waiting]), strict=True
        ):
            if started:
                u.started_at = now

    def _expired(self, unit: _Unit, now: float) -> bool:
        return (
            self.timeout_s is not None
            and unit.started_at is not None
            and now - unit.started_at >= self.timeout_s
        )

    def _tick(self, now: float) -> float:
        if self.timeout_s is None:
            return POLL_S
        clocks = [
            u.started_at + self.timeout_s - now for u in self._left if u.started_at is not None
        ]
        return max(0.0, min([POLL_S, *clocks]))

    def _outcome(self, unit: _Unit) -> list[BuildResult]:
        try:
            got = self.engine.result(unit.handle)
        except Exception as exc:  # a task's failure is its candidates' result
            return failed(unit.indices, f"build task failed: {type(exc).__name__}: {exc}")
        if [r.config_index for r in got] != unit.indices:
            return failed(unit.indices, f"build task answered for {[r.config_index for r in got]}")
        return [_verified(r) for r in got]


def _verified(result: BuildResult) -> BuildResult:
    """`result`, or a failure when an artifact's bytes do not hash to its sha256: bytes that
    crossed a process or a network are checked once here, before any device caches them."""
    arts = [result.artifact, result.reference.artifact if result.reference else None]
    for art in arts:
        if art is not None and hashlib.sha256(art.data).hexdigest() != art.sha256:
            return BuildResult(
                result.config_index, None, "artifact bytes do not match their sha256"
            )
    return result

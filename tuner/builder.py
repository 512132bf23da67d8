"""Build candidates into artifacts, in a pool of worker processes so compiles overlap measurements.

A config that fails to build is a BUILD_ERROR result with the compiler's message, never an exception.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from compiler import build as compiler_build
from compiler.artifact import Artifact
from tuner.records import Workload
from tuner.task import Task


@dataclass(frozen=True)
class BuildResult:
    config_index: int
    artifact: Artifact | None
    error: str = ""


def build_one(workload: Workload, index: int, target: str) -> BuildResult:
    """Instantiate the template with config `index`, lower, generate C and compile it."""
    try:
        task = Task(workload)
        sch, args = task.template.instantiate(workload.shape, task.space.get(index))
        symbol = f"kiln_{workload.op}_{'x'.join(map(str, workload.shape))}_c{index}"
        art = compiler_build.build(sch, args, symbol=symbol, target=target, flop=task.flop)
    except Exception as exc:  # any failure of one candidate is that candidate's result
        return BuildResult(index, None, f"{type(exc).__name__}: {exc}")
    return BuildResult(index, art)


class Builder(Protocol):
    target: str

    def build(self, workload: Workload, indices: Sequence[int]) -> list[BuildResult]:
        """One BuildResult per index, in order."""
        ...

    def close(self) -> None: ...


class LocalBuilder:
    """Builds on this machine; `workers` > 1 uses a process pool kept alive between batches."""

    def __init__(self, target: str = "host", workers: int = 1) -> None:
        self.target = target
        self._pool: Executor | None = None
        if workers > 1:
            # spawn, not fork: the parent holds gRPC channels, which do not survive a fork.
            self._pool = ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn")
            )

    def build(self, workload: Workload, indices: Sequence[int]) -> list[BuildResult]:
        if self._pool is None:
            return [build_one(workload, i, self.target) for i in indices]
        futures = [self._pool.submit(build_one, workload, i, self.target) for i in indices]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

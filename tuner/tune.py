"""The tuning loop: ask the searcher, build, measure, record, tell; stop at the trial budget."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner import records as rec
from tuner.builder import Builder
from tuner.measure import MeasureResult, Status
from tuner.runner.base import Runner
from tuner.search import RandomSearch, Searcher
from tuner.task import Task

_LOG = logging.getLogger(__name__)


@dataclass
class TuneProgress:
    """What the loop has done so far; handed to the progress callback after every batch."""

    history: list[rec.Record] = field(default_factory=list)
    best: rec.Record | None = None

    @property
    def trials(self) -> int:
        return len(self.history)

    @property
    def errors(self) -> int:
        return sum(not r.result.ok for r in self.history)

    @property
    def best_gflops(self) -> float:
        return self.best.gflops if self.best else 0.0


class TuningError(RuntimeError):
    """The run could not produce any working candidate."""


def tune(
    task: Task,
    builder: Builder,
    runner: Runner,
    n_trials: int,
    batch_size: int = 8,
    searcher: Searcher | None = None,
    records_path: str | os.PathLike[str] | None = None,
    on_batch: Callable[[TuneProgress], None] | None = None,
) -> TuneProgress:
    """Tune `task` for up to n_trials candidates; every candidate is appended to records_path.

    Raises:
        TuningError: when every candidate failed, naming the first few causes.
    """
    searcher = searcher or RandomSearch(len(task.space))
    progress = TuneProgress()
    while progress.trials < n_trials:
        indices = searcher.ask(min(batch_size, n_trials - progress.trials))
        if not indices:
            break  # the whole space was measured
        built = builder.build(task.workload, indices)
        artifacts = [b.artifact for b in built if b.artifact is not None]
        measured = iter(runner.run(artifacts))
        results: list[MeasureResult] = []
        for b in built:
            if b.artifact is None:
                results.append(MeasureResult.failed(Status.BUILD_ERROR, b.error))
            else:
                results.append(next(measured))
        target = next((a.target for a in artifacts), builder.target)
        batch = [
            rec.Record(task.workload, target, i, task.knobs(i), r, task.flop, rec.now_iso())
            for i, r in zip(indices, results, strict=True)
        ]
        if records_path is not None:
            rec.append(records_path, batch)
        searcher.tell(indices, results)
        progress.history.extend(batch)
        for r in batch:
            if r.result.ok and (
                progress.best is None or r.result.median_s < progress.best.result.median_s
            ):
                progress.best = r
        if on_batch is not None:
            on_batch(progress)
    if progress.best is None:
        causes = sorted({f"{r.result.status.value}: {r.result.error}" for r in progress.history})
        raise TuningError(
            f"no candidate of {task.workload} succeeded in {progress.trials} trials; "
            f"causes: {'; '.join(causes[:3]) or 'none measured'}"
        )
    return progress

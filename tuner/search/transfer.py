"""Transfer: a cost model pretrained on earlier records of other workloads guides a new task.

Knob features mean nothing across templates and shapes, so the transfer model is trained on the
workload-independent loop-IR curve features (`tuner.search.features.loop_features`) with one ranking
group per workload. In a new task it scores a bounded random sample of candidates (lowering
each costs milliseconds) and `XGBSearcher` measures its top picks first; after that the task's
own model takes over.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from compiler.lower import lower
from tuner.records import Record, Workload
from tuner.search.cost_model import CostModel, Objective, normalized_throughput
from tuner.search.features import (
    FEATURE_PASSES,
    FEATURE_VERSION,
    LOOP_FEATURE_LENGTH,
    loop_features,
)
from tuner.task import Task

_LOG = logging.getLogger(__name__)


def task_loop_features(task: Task, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """Loop-IR features [n, LOOP_FEATURE_LENGTH] of configs `indices` of `task`; each config is
    lowered once per process (`_config_features` keeps the rows)."""
    out = np.zeros((len(indices), LOOP_FEATURE_LENGTH), dtype=np.float32)
    for row, index in enumerate(indices):
        out[row] = _config_features(task, int(index))
    return out


# A model's tuning run fits a transfer model for each of its tasks on the same records, and
# lowering a config is milliseconds for a dense kernel but seconds for a Winograd one (MobileNetV2
# after ResNet-18's 320 records spent 20 minutes re-lowering them, task after task, before its
# first measurement). 50,000 rows of LOOP_FEATURE_LENGTH float32 stay under 40 MB.
@functools.lru_cache(maxsize=50_000)
def _config_features(task: Task, index: int) -> np.ndarray:
    sch, args = task.template.instantiate(task.workload.shape, task.space.get(index))
    return loop_features(lower(sch, args, name="f", passes=FEATURE_PASSES), task.flop)


def _index(task: Task, record: Record) -> int | None:
    """The record's config in today's space of its task, or None when it is no longer there."""
    try:
        return task.space.index_of(record.knobs)
    except ValueError:
        return None


class TransferModel:
    """A ranking model over loop-IR features, trained across workloads of one target.

    Args:
        objective: "rank" (default) or "reg".
        seed: seeds sampling and the model.
        max_per_workload: records used per workload at most (each is lowered once to fit).
    """

    feature_version = FEATURE_VERSION

    def __init__(self, objective: Objective = "rank", seed: int = 0, max_per_workload: int = 300):
        self._model = CostModel(objective, seed=seed)
        self._rng = np.random.default_rng(seed)
        self.max_per_workload = max_per_workload
        self.workloads: list[Workload] = []
        self.lowering_seconds = 0.0  # spent computing loop features, fit and scoring

    @property
    def fitted(self) -> bool:
        return self._model.fitted

    def fit(self, records: Iterable[Record], target: str, exclude: Workload | None = None) -> int:
        """Train on `records` of `target`, one group per workload other than `exclude`.

        Returns:
            The number of samples trained on; 0 (and no model) when no workload has two
            distinct configs with at least one success.
        """
        by_workload: dict[Workload, dict[int, float]] = defaultdict(dict)
        tasks: dict[Workload, Task] = {}
        for r in records:
            if r.target != target or r.workload == exclude:
                continue
            # a record's config is of the space of its thread count (`parallel` above one)
            task = tasks.setdefault(r.workload, Task(r.workload, r.threads))
            try:
                index = _index(task, r)
            except (KeyError, ValueError) as exc:  # an op or shape this version does not know
                _LOG.warning("transfer: skipping records of %s: %s", r.workload, exc)
                continue
            if index is None:
                continue
            ok = r.result.ok and r.result.median_s > 0
            throughput = (r.flop or task.flop) / r.result.median_s if ok else 0.0
            group = by_workload[r.workload]
            group[index] = max(group.get(index, 0.0), throughput)
        xs, ys, sizes = [], [], []
        start = time.perf_counter()
        for workload, group in sorted(by_workload.items(), key=lambda kv: repr(kv[0])):
            if len(group) < 2 or max(group.values()) <= 0:
                continue
            indices = np.fromiter(group, dtype=np.int64, count=len(group))
            if indices.size > self.max_per_workload:
                indices = self._rng.choice(indices, self.max_per_workload, replace=False)
            xs.append(task_loop_features(tasks[workload], indices))
            ys.append(normalized_throughput(np.asarray([group[int(i)] for i in indices])))
            sizes.append(indices.size)
            self.workloads.append(workload)
        if not sizes:
            return 0
        self._model.fit(np.vstack(xs), np.concatenate(ys), groups=sizes)
        self.lowering_seconds += time.perf_counter() - start
        _LOG.info("transfer model: %d samples of %d workloads", sum(sizes), len(sizes))
        return sum(sizes)

    def scorer(self, task: Task) -> Callable[[np.ndarray], np.ndarray]:
        """A score function over config indices of `task` for `XGBSearcher(transfer=...)`.

        Raises:
            RuntimeError: the model was never fitted.
        """
        if not self.fitted:
            raise RuntimeError("TransferModel.scorer called before a successful fit")

        def score(indices: np.ndarray) -> np.ndarray:
            start = time.perf_counter()
            scores = self._model.predict(task_loop_features(task, indices))
            self.lowering_seconds += time.perf_counter() - start
            return scores

        return score

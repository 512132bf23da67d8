"""Transfer across workloads: mechanics of fitting on records of A and guiding a task of B.

The records' timings are made up: these tests check what the transfer model proposes (valid,
distinct, unmeasured configs of another workload), never that it proposes fast ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from tuner.measure import MeasureResult, Status
from tuner.records import Record, Workload
from tuner.search import transfer
from tuner.search.features import LOOP_FEATURE_LENGTH
from tuner.search.transfer import TransferModel, task_loop_features
from tuner.search.xgb import XGBSearcher
from tuner.task import Task

A = Workload("dense", (64, 64, 64))
B = Workload("dense", (96, 96, 96))
TARGET = "llvm -mcpu=test"


def _records(workload: Workload, n: int, target: str = TARGET) -> list[Record]:
    task = Task(workload)
    rng = np.random.default_rng(0)
    out = []
    for i in rng.choice(len(task.space), n, replace=False):
        knobs = task.knobs(int(i))
        if i % 5 == 0:
            result = MeasureResult.failed(Status.RUNTIME_ERROR, "made-up failure")
        else:  # made-up timing: faster with a wider register tile
            result = MeasureResult(Status.OK, samples_s=(1e-3 / (knobs["mr"] * knobs["nr"]),))
        out.append(Record(workload, target, int(i), knobs, result, task.flop, "t"))
    return out


def test_features_of_both_workloads_have_the_same_width() -> None:
    a = task_loop_features(Task(A), [0, 1])
    b = task_loop_features(Task(B), [0, 7])
    assert a.shape == b.shape == (2, LOOP_FEATURE_LENGTH)


def test_transfer_model_guides_the_first_batch_of_another_workload() -> None:
    other_target = _records(A, 5, target="other")  # ignored
    own = _records(B, 6)  # the new task's own records are left out of pretraining
    model = TransferModel(seed=0)
    used = model.fit([*_records(A, 40), *other_target, *own], TARGET, exclude=B)
    assert used == 40 and model.workloads == [A]
    assert model.fitted

    task = Task(B)
    measured = [r.config_index for r in own]

    def valid(i: int) -> bool:
        return task.worth_measuring(i)

    score = model.scorer(task)
    s = XGBSearcher(
        task.space, flop=task.flop, seed=1, valid=valid, transfer=score, transfer_sample=32
    )
    s.exclude(measured)
    first = s.ask(8)
    assert len(first) == len(set(first)) == 8
    assert all(valid(i) for i in first) and not set(first) & set(measured)
    # the batch is the transfer model's top 8 of its sample
    sample = s._transfer_plan  # what is left of the ranked sample
    assert sample is not None and len(sample) == 32 - 8
    assert min(score(np.asarray(first))) >= max(score(np.asarray(sample)))
    assert model.lowering_seconds > 0


def test_transfer_without_usable_records() -> None:
    model = TransferModel()
    assert model.fit(_records(A, 10, target="other"), TARGET) == 0
    assert not model.fitted
    with pytest.raises(RuntimeError, match="before a successful fit"):
        model.scorer(Task(B))


def test_each_config_is_lowered_once_however_many_tasks_fit_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Model tuning fits a transfer model per task on the same records: the second fit (and
    the scoring of configs already featured) lowers nothing."""
    lowered: list[str] = []
    real = transfer.lower

    def counting(*args: object, **kwargs: object) -> object:
        lowered.append("x")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    transfer._config_features.cache_clear()
    monkeypatch.setattr(transfer, "lower", counting)
    records = _records(A, 12)
    first = TransferModel(seed=0).fit(records, TARGET, exclude=B)
    once = len(lowered)
    assert first == once == len({r.config_index for r in records})
    again = TransferModel(seed=0)
    assert again.fit(records, TARGET, exclude=Workload("dense", (32, 32, 32))) == first
    assert len(lowered) == once
    features = task_loop_features(Task(A), [r.config_index for r in records[:3]])
    assert len(lowered) == once and features.shape == (3, LOOP_FEATURE_LENGTH)

"""Searchers by name: what `kiln tune-op --tuner NAME`, the Python API and network tuning make
for a task (`searcher_for` from TuneOptions, `make_searcher` by name)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from tuner.options import TuneOptions
from tuner.records.base import RecordStore
from tuner.search.base import RandomSearch, Searcher
from tuner.task import Task

_LOG = logging.getLogger(__name__)

TUNERS = ("xgb", "random")

# index array -> scores: a transfer model's ranking of a task's configs (tuner.search.transfer)
TransferScore = Callable[[np.ndarray], np.ndarray]


def make_searcher(
    name: str,
    task: Task,
    seed: int = 0,
    transfer: TransferScore | None = None,
    target: str = "host",
    constraint: Callable[[int], bool] | None = None,
) -> Searcher:
    """The searcher called `name` ("xgb" or "random") over the task's space.

    Both skip configs the template calls implausible on `target` (a register tile that spills
    there) and, when given, those `constraint` rejects (a model's layout blocks). `transfer`
    (xgb only) scores candidates with a model pretrained on other workloads. On a GPU target
    ("cuda/sm=90") the xgb searcher's model also sees each candidate's GPU features
    (`tuner.search.gpu_features`: threads, shared memory, registers, occupancy on that sm).

    Raises:
        ValueError: an unknown name, or xgboost cannot be imported for "xgb".
    """
    if name not in TUNERS:
        raise ValueError(f"tuner must be one of {', '.join(TUNERS)}, got {name!r}")

    def plausible(index: int) -> bool:
        if constraint is not None and not constraint(index):
            return False
        return task.worth_measuring(index, target)

    checked = constraint is not None or hasattr(task.template, "worth_measuring")
    valid: Callable[[int], bool] | None = plausible if checked else None
    if name == "random":
        return RandomSearch(len(task.space), seed=seed, valid=valid)
    try:  # imported lazily: it pulls in xgboost, which the random searcher never needs
        from tuner.search.xgb import XGBSearcher
    except ImportError as exc:
        raise ValueError(f"the xgb tuner is not available here ({exc}); use random") from None
    from tuner.search.gpu_features import gpu_feature_fn

    return XGBSearcher(
        task.space,
        flop=task.flop,
        seed=seed,
        valid=valid,
        transfer=transfer,
        config_features=gpu_feature_fn(task, target),
    )


def searcher_for(
    task: Task,
    options: TuneOptions,
    store: RecordStore | None,
    target: str,
    records_target: str,
    constraint: Callable[[int], bool] | None = None,
) -> tuple[Searcher, str]:
    """The searcher `options` ask for (`make_searcher` for compile target `target`), with a
    transfer model from `store`'s records on `records_target` when `options.transfer` and the
    tuner is "xgb"; and the transfer model's note ("" without one)."""
    transfer, note = None, ""
    if options.tuner == "xgb" and options.transfer and store is not None:
        transfer, note = transfer_scorer(store, task, options.seed, records_target)
    searcher = make_searcher(options.tuner, task, options.seed, transfer, target, constraint)
    return searcher, note


def transfer_scorer(
    store: RecordStore, task: Task, seed: int, target: str
) -> tuple[TransferScore | None, str]:
    """A scorer pretrained on the store's records of other workloads on `target` (a records
    target name), and a line saying what it learned from; (None, "") without such records."""
    from tuner.search.transfer import TransferModel  # lazily, like the xgb searcher

    model = TransferModel(seed=seed)
    samples = model.fit(store.load(target=target), target, exclude=task.workload)
    if samples == 0:
        return None, ""
    note = (
        f"transfer: a model of {samples} records of {len(model.workloads)} other workloads "
        f"on {target} picks the first candidates"
    )
    _LOG.info("%s", note)
    return model.scorer(task), note

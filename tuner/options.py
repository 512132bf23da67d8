"""TuneOptions: how a tuning run goes, one record shared by operator and network tuning."""

from __future__ import annotations

from dataclasses import dataclass

GIVE_UP_AFTER_BATCHES = 2
CONFIRM_TOP = 4  # configs measured again at the end, by default


@dataclass(frozen=True)
class TuneOptions:
    """Budget, search and checks of a tuning run (`tuner.loop.tune`, `tuner.network.tune_network`).

    Attributes:
        trials: the trial budget, resumed trials included; for a network, of the whole network
            (the task scheduler hands it out).
        batch_size: candidates asked, built, measured and recorded together.
        tuner: the searcher, "xgb" (annealing over an XGBoost cost model) or "random".
        seed: seeds the searchers (and a network's task scheduler).
        transfer: with "xgb" and a records store, let a model of the store's records of other
            workloads on this target pick the first candidates.
        early_stop: end after this many trials without a better candidate (a network: per task;
            None: never).
        confirm: at the end, measure this many of the fastest configs again and keep the one
            whose upper median is fastest (0 or 1: off). On by default: one lucky measurement
            should not pick the config a user builds.
        resume: read this workload's records on this target first, tell the searcher and count
            them toward the budget; never re-measure them.
        pipeline: build the next batch while this one is measured (the searcher then proposes
            one batch of results behind). Off by default: builds running beside measurements on
            the same cores disturb them, so turn it on where the devices have cores of their own
            (`kiln.Pool(pin_cores=...)`, a remote pool); the CLI does, pinning local devices
            (`Pool.builder` then also builds on their cores, at idle priority).
            Network tuning: each batch's candidates are measured as their builds finish, and
            the batch the task scheduler expects next is built while this one is measured.
        check: compare every candidate's outputs with a reference kernel on the device; a
            wrong answer is a WRONG_ANSWER record and never a best.
        give_up_after_batches: with no working candidate after this many batches, raise
            TuningError instead of spending the rest of the budget.
    """

    trials: int = 64
    batch_size: int = 8
    tuner: str = "xgb"
    seed: int = 0
    transfer: bool = True
    early_stop: int | None = None
    confirm: int = CONFIRM_TOP
    resume: bool = False
    pipeline: bool = False
    check: bool = True
    give_up_after_batches: int = GIVE_UP_AFTER_BATCHES

    def __post_init__(self) -> None:
        if self.trials < 1 or self.batch_size < 1:
            raise ValueError(
                f"trials and batch_size must be >= 1, got {self.trials}, {self.batch_size}"
            )
        if self.confirm < 0:
            raise ValueError(f"confirm must be >= 0, got {self.confirm}")
        if self.early_stop is not None and self.early_stop < 1:
            raise ValueError(f"early_stop must be >= 1, got {self.early_stop}")
        if self.give_up_after_batches < 1:
            raise ValueError(
                f"give_up_after_batches must be >= 1, got {self.give_up_after_batches}"
            )
        if self.tuner not in ("xgb", "random"):
            raise ValueError(f"tuner must be xgb or random, got {self.tuner!r}")

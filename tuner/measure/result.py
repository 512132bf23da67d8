"""What the tuner measures and what comes back: plain records, free of protobuf.

A failed candidate is a `MeasureResult` with a status other than OK and an error text; nothing in
the measuring path raises for a candidate that failed, so one bad config never ends a tuning run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import StrEnum

from protos.evaluator import EvaluatorConfig

__all__ = [
    "NOISY_SPREAD",
    "AccelCycles",
    "EvaluatorConfig",
    "MeasureResult",
    "Status",
    "spread",
]

# A result whose samples spread more than this (interquartile range over median) is measured
# again; still past it with the new samples, it is flagged `noisy`. On a 2-vCPU VM a tenth of
# 3,264 recorded results of a tuning run spread more than this (median 2.8%).
NOISY_SPREAD = 0.10


def spread(samples: tuple[float, ...] | list[float]) -> float:
    """Interquartile range over median of `samples` (0 for fewer than two): the noise of one
    measurement, in the unit a user reads (0.05 = the middle half within 5% of the median)."""
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    mid = statistics.median(samples)
    return (q3 - q1) / mid if mid > 0 else 0.0


class Status(StrEnum):
    """The typed outcome of one candidate; the names match `protos.common.Status`."""

    OK = "OK"
    BUILD_ERROR = "BUILD_ERROR"
    UPLOAD_ERROR = "UPLOAD_ERROR"
    LOAD_ERROR = "LOAD_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    CRASH = "CRASH"
    TIMEOUT = "TIMEOUT"
    WRONG_ANSWER = "WRONG_ANSWER"
    DEVICE_LOST = "DEVICE_LOST"
    NO_DEVICE = "NO_DEVICE"
    UNAUTHORIZED = "UNAUTHORIZED"


@dataclass(frozen=True)
class AccelCycles:
    """Where a simulated accelerator's run (vta_sim) spent its cycles.

    `busy_cycles`, `token_stall_cycles` and `dram_wait_cycles` map a module ("load", "compute",
    "store") to its cycles executing, waiting for a dependency token, waiting for DRAM.
    """

    total_cycles: int
    gemm_cycles: int
    busy_cycles: dict[str, int] = field(default_factory=dict)
    token_stall_cycles: dict[str, int] = field(default_factory=dict)
    dram_wait_cycles: dict[str, int] = field(default_factory=dict)

    @property
    def gemm_utilisation(self) -> float:
        """Useful GEMM cycles over all cycles."""
        return self.gemm_cycles / self.total_cycles if self.total_cycles else 0.0

    def utilisation(self, module: str) -> float:
        """Busy cycles of `module` over all cycles (0 for a module not reported)."""
        busy = self.busy_cycles.get(module, 0)
        return busy / self.total_cycles if self.total_cycles else 0.0


@dataclass(frozen=True)
class MeasureResult:
    """The outcome of measuring one candidate."""

    status: Status
    samples_s: tuple[float, ...] = ()
    error: str = ""
    device_id: str = ""
    number_used: int = 0
    signal: int = 0
    emulated: bool = False
    extra: dict[str, float] = field(default_factory=dict)
    noisy: bool = False  # its samples spread past NOISY_SPREAD even after a re-measure
    # timed cold: the caches swept before each repeat (EvaluatorConfig.flush_cache_bytes); cold
    # and warm times of one kernel are not comparable, so records keep which it was
    cold: bool = False
    accel: AccelCycles | None = None  # a simulated accelerator's cycles (not kept in records)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK and len(self.samples_s) > 0

    @property
    def median_s(self) -> float:
        """Median seconds per call; infinity for a failed candidate so it sorts last."""
        return statistics.median(self.samples_s) if self.ok else float("inf")

    @property
    def spread(self) -> float:
        """Interquartile range over median of the samples (`spread`); 0 for a failure."""
        return spread(self.samples_s) if self.ok else 0.0

    @classmethod
    def failed(cls, status: Status, error: str, device_id: str = "") -> MeasureResult:
        return cls(status=status, error=error, device_id=device_id)

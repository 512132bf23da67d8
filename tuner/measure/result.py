"""What the tuner measures and what comes back: plain records, free of protobuf.

A failed candidate is a `MeasureResult` with a status other than OK and an error text; nothing in
the measuring path raises for a candidate that failed, so one bad config never ends a tuning run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import StrEnum

from protos.evaluator import EvaluatorConfig

__all__ = ["EvaluatorConfig", "MeasureResult", "Status"]


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

    @property
    def ok(self) -> bool:
        return self.status is Status.OK and len(self.samples_s) > 0

    @property
    def median_s(self) -> float:
        """Median seconds per call; infinity for a failed candidate so it sorts last."""
        return statistics.median(self.samples_s) if self.ok else float("inf")

    @classmethod
    def failed(cls, status: Status, error: str, device_id: str = "") -> MeasureResult:
        return cls(status=status, error=error, device_id=device_id)

"""What an agent counts as it serves: plain thread-safe counters, always kept, read by `metrics`.

`device_agent.metrics` reads them at scrape time for Prometheus; without --metrics-port nobody
does, and counting costs a lock taken for one dict update, never held across I/O.

    jobs              (method, status) -> finished Measures and Runs; method "measure" | "run",
                      status a `Status` name (OK, CRASH, UNAUTHORIZED, ...)
    uploads           outcome -> Upload calls: "stored", or why not (see `UPLOAD_OUTCOMES`)
    upload_bytes      bytes of the stored uploads
    executor_restarts reason -> executor children replaced after a death ("died"), a timeout kill
                      ("timeout"), a cancel ("cancelled") or a malformed answer ("malformed")
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from device_agent.domain import Status

UPLOAD_OUTCOMES = (
    "stored",
    "invalid",
    "too_large",
    "hash_mismatch",
    "truncated",
    "cancelled",
    "error",
)


@dataclass(frozen=True)
class StatsSnapshot:
    """A copy of the counters at one moment."""

    jobs: dict[tuple[str, str], int] = field(default_factory=dict)
    uploads: dict[str, int] = field(default_factory=dict)
    upload_bytes: int = 0
    executor_restarts: dict[str, int] = field(default_factory=dict)


class AgentStats:
    """The agent's counters; every method is safe to call from many threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: Counter[tuple[str, str]] = Counter()
        self._uploads: Counter[str] = Counter()
        self._upload_bytes = 0
        self._restarts: Counter[str] = Counter()

    def job_done(self, method: str, status: Status) -> None:
        """Count one finished Measure or Run (`method`: `jobs.MEASURE` or `jobs.RUN`) by status."""
        with self._lock:
            self._jobs[(method, status.name)] += 1

    def upload_done(self, outcome: str, size_bytes: int = 0) -> None:
        """Count one Upload call by outcome (one of UPLOAD_OUTCOMES) and the bytes it stored."""
        with self._lock:
            self._uploads[outcome] += 1
            self._upload_bytes += size_bytes

    def executor_restarted(self, reason: str) -> None:
        """Count one executor child replaced by a fresh one."""
        with self._lock:
            self._restarts[reason] += 1

    def snapshot(self) -> StatsSnapshot:
        """The counters now."""
        with self._lock:
            return StatsSnapshot(
                dict(self._jobs), dict(self._uploads), self._upload_bytes, dict(self._restarts)
            )

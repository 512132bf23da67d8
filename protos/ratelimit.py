"""Rate-limited logging: a flood of rejected calls costs a daemon a few log lines, not one per call.

`RateLimitedLog.log(kind, level, msg, *args)` writes at most `burst` lines per `kind` in each
`window_s`; the calls it swallows are counted, and the first line of the next window says how many
("... (and 4,211 more like it in the last 10 s)"). Kinds are few and fixed by the caller (a method
name and a status code, never client-chosen text), and the table of kinds is bounded too: past
`max_kinds`, unseen kinds share one bucket. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_OVERFLOW_KIND = "(other)"


@dataclass
class _Bucket:
    window_start: float
    written: int = 0
    suppressed: int = 0


class RateLimitedLog:
    """At most `burst` lines per kind per `window_s` on `logger`; the rest counted and reported."""

    def __init__(
        self,
        logger: logging.Logger,
        burst: int = 5,
        window_s: float = 10.0,
        max_kinds: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = burst
        self._window_s = window_s
        self._max_kinds = max_kinds
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}

    def log(self, kind: str, level: int, msg: str, *args: object) -> bool:
        """Log `msg % args` unless `kind` has used its burst this window; True when written."""
        now = self._clock()
        with self._lock:
            if kind not in self._buckets and len(self._buckets) >= self._max_kinds:
                kind = _OVERFLOW_KIND
            bucket = self._buckets.get(kind)
            if bucket is None:
                bucket = self._buckets[kind] = _Bucket(now)
            suppressed = 0
            if now - bucket.window_start >= self._window_s:
                suppressed, bucket.suppressed = bucket.suppressed, 0
                bucket.window_start, bucket.written = now, 0
            if bucket.written >= self._burst:
                bucket.suppressed += 1
                return False
            bucket.written += 1
        if suppressed:
            msg += f" (and {suppressed:,} more like it in the last {self._window_s:g} s)"
        self._logger.log(level, msg, *args)
        return True

    def suppressed(self) -> int:
        """Calls swallowed in the current windows, over all kinds."""
        with self._lock:
            return sum(bucket.suppressed for bucket in self._buckets.values())

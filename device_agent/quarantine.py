"""Quarantine: an entry of an artifact that keeps killing its executor is refused without running.

Every CRASH or TIMEOUT of a Measure or Run counts against (artifact sha256, entry symbol); at
`threshold` counts the pair is quarantined, and later requests for it are answered at once with
Status RUNTIME_ERROR and an error that starts "quarantined:" -- the entry did fail at run time,
repeatedly, so RUNTIME_ERROR (not LOAD_ERROR, which says the artifact could not be loaded) tells
the tuner the truth without another executor death.

Keyed by entry, not by artifact alone: one crashing kernel of a many-kernel artifact does not block
its siblings. The counts live in the agent's memory only, so a restart of the agent lifts every
quarantine; re-uploading does not (the same hash is the same bytes, which would crash the same way).
A client that cancels, or an agent that stops, does not count.
"""

from __future__ import annotations

import threading

from device_agent.domain import Status

COUNTED = frozenset({Status.CRASH, Status.TIMEOUT})


class Quarantine:
    """Counts executor deaths per (sha256, symbol); thread-safe. `threshold` 0 disables it."""

    def __init__(self, threshold: int) -> None:
        self._threshold = threshold
        self._lock = threading.Lock()
        self._deaths: dict[tuple[str, str], list[str]] = {}

    def reason(self, sha256: str, symbol: str) -> str | None:
        """Why the entry is refused, or None when it may run."""
        if self._threshold <= 0:
            return None
        with self._lock:
            deaths = self._deaths.get((sha256, symbol), [])
            if len(deaths) < self._threshold:
                return None
            return (
                f"quarantined: entry {symbol} of artifact {sha256} killed its executor "
                f"{len(deaths)} times (last: {deaths[-1]}); it will not run again until the "
                "agent restarts"
            )

    def quarantined(self) -> int:
        """How many entries are refused now."""
        if self._threshold <= 0:
            return 0
        with self._lock:
            return sum(len(deaths) >= self._threshold for deaths in self._deaths.values())

    def record(self, sha256: str, symbol: str, status: Status, detail: str) -> None:
        """Count a job's outcome when it is a CRASH or TIMEOUT."""
        if status not in COUNTED or self._threshold <= 0:
            return
        with self._lock:
            deaths = self._deaths.setdefault((sha256, symbol), [])
            deaths.append(f"{status.value} {detail}".strip())
            del deaths[: -self._threshold]

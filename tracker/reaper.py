"""The reaper: a daemon thread that runs DevicePool.reap() every reap_interval_s until stopped."""

from __future__ import annotations

import logging
import threading

from tracker.pool import DevicePool

_LOG = logging.getLogger(__name__)


class Reaper:
    """Expires silent agents and lapsed leases in the background."""

    def __init__(self, pool: DevicePool, interval_s: float) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kiln-tracker-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to finish and wait up to `timeout_s` for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._pool.reap()
            except Exception:
                # A store hiccup (later: redis down) must not end expiry for good; retry next tick.
                _LOG.exception("reaper sweep failed")

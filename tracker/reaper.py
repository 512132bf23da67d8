"""The reaper: a daemon thread that runs DevicePool.reap() every reap_interval_s until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tracker.model import ExpiryReport
from tracker.pool import DevicePool

_LOG = logging.getLogger(__name__)


class Reaper:
    """Expires silent agents and lapsed leases in the background.

    Args:
        on_report: called with each sweep's ExpiryReport (metrics count expiries with it).
    """

    def __init__(
        self,
        pool: DevicePool,
        interval_s: float,
        on_report: Callable[[ExpiryReport], None] | None = None,
    ) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self._on_report = on_report
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
                report = self._pool.reap()
                if self._on_report is not None:
                    self._on_report(report)
            except Exception:
                # A store hiccup (later: redis down) must not end expiry for good; retry next tick.
                _LOG.exception("reaper sweep failed")

"""The reaper: a task on the tracker's event loop that runs DevicePool.reap() every reap_interval_s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from tracker.model import ExpiryReport
from tracker.pool import DevicePool

_LOG = logging.getLogger(__name__)


class Reaper:
    """Expires silent agents and lapsed leases in the background, on the pool's event loop.

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
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start sweeping; call on the pool's loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kiln-tracker-reaper")

    async def stop(self) -> None:
        """Stop sweeping (a sweep under way is cancelled) and wait for the task to end."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                report = await self._pool.reap()
                if self._on_report is not None:
                    self._on_report(report)
            except Exception:
                # A store hiccup (redis down) must not end expiry for good; retry next tick.
                _LOG.exception("reaper sweep failed")

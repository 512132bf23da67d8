"""This process's waiting Acquire calls, in grant order: higher priority first, FIFO within one.

Not thread-safe: the DevicePool uses it on its event loop only. The order comes from each
waiter's QueueTicket, which the store hands out: the store keeps the pool-wide queue (every
replica's waiters, surviving a tracker restart), this module only the calls of this process that
wait on it. A waiting call holds no thread: it awaits its waiter's `future`, which the pool
completes when it grants, supersedes or closes. Everything here lives on the tracker's event loop.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
from collections.abc import Iterator

from tracker.model import Lease, LeaseRequest, QueueTicket


@dataclasses.dataclass(eq=False)
class Waiter:
    """One waiting request; dispatch sets `lease` on a grant, a takeover sets `superseded`.

    `future` completes (with None) when the waiter has something to look at: a lease, a takeover,
    the pool closing. The answer is read from the waiter, never from the future. A Waiter is made
    on the event loop (its future belongs to the running loop).
    """

    request: LeaseRequest
    ticket: QueueTicket
    deadline: float
    """time.monotonic() at which the wait ends with NO_DEVICE."""
    recheck_at: float | None = None
    """time.monotonic() at which the startup grace ends and the selector is checked again."""
    lease: Lease | None = None
    superseded: bool = False
    future: asyncio.Future[None] = dataclasses.field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def order(self) -> tuple[int, int]:
        return self.ticket.order

    @property
    def wake_at(self) -> float:
        """time.monotonic() at which the waiter must look again even if nobody woke it."""
        return self.deadline if self.recheck_at is None else min(self.deadline, self.recheck_at)

    def wake(self) -> None:
        """Complete the future (once; a future its caller already cancelled stays cancelled)."""
        if not self.future.done():
            self.future.set_result(None)


class WaitQueue:
    """Waiters sorted by their tickets' order."""

    def __init__(self) -> None:
        self._waiters: list[Waiter] = []

    def push(self, waiter: Waiter) -> None:
        """Queue `waiter` at the place its ticket gives it."""
        bisect.insort(self._waiters, waiter, key=lambda w: w.order)

    def remove(self, waiter: Waiter) -> None:
        """Drop `waiter` if still queued."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def find(self, request_id: str) -> Waiter | None:
        """The waiter holding `request_id`, if any."""
        for waiter in self._waiters:
            if waiter.ticket.request_id == request_id:
                return waiter
        return None

    def __iter__(self) -> Iterator[Waiter]:
        """Waiters in grant order; a snapshot, so callers may remove while iterating."""
        return iter(list(self._waiters))

    def __len__(self) -> int:
        return len(self._waiters)

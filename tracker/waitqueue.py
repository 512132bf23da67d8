"""This process's waiting Acquire calls, in grant order: higher priority first, FIFO within one.

Not thread-safe on its own: the DevicePool guards it with its condition variable's lock. The order
comes from each waiter's QueueTicket, which the store hands out: the store keeps the pool-wide
queue (every replica's waiters, surviving a tracker restart), this module only the threads of this
process that wait on it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator

from tracker.model import Lease, LeaseRequest, QueueTicket


@dataclasses.dataclass(eq=False)
class Waiter:
    """One waiting request; dispatch sets `lease` on a grant, a takeover sets `superseded`."""

    request: LeaseRequest
    ticket: QueueTicket
    lease: Lease | None = None
    superseded: bool = False

    @property
    def order(self) -> tuple[int, int]:
        return self.ticket.order


class WaitQueue:
    """Waiters sorted by their tickets' order."""

    def __init__(self) -> None:
        self._waiters: list[Waiter] = []

    def push(self, request: LeaseRequest, ticket: QueueTicket) -> Waiter:
        """Queue `request` at the place its ticket gives it."""
        waiter = Waiter(request, ticket)
        bisect.insort(self._waiters, waiter, key=lambda w: w.order)
        return waiter

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

"""Pending Acquire requests in grant order: higher priority first, FIFO within a priority.

Not thread-safe on its own: the DevicePool guards it with its condition variable's lock. It lives
in the tracker process; sharing a queue between replicas is a later issue's (redis sorted set).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Iterator

from tracker.model import DeviceSpec, Lease, LeaseRequest


@dataclasses.dataclass(eq=False)
class Waiter:
    """One waiting request; `lease` is set by dispatch when a device is granted to it."""

    request: LeaseRequest
    seq: int
    lease: Lease | None = None

    @property
    def order(self) -> tuple[int, int]:
        return (-self.request.priority, self.seq)


class WaitQueue:
    """Waiters sorted by (-priority, arrival)."""

    def __init__(self) -> None:
        self._waiters: list[Waiter] = []
        self._seq = itertools.count()

    def push(self, request: LeaseRequest) -> Waiter:
        """Queue `request` behind every waiter of equal or higher priority."""
        waiter = Waiter(request, next(self._seq))
        bisect.insort(self._waiters, waiter, key=lambda w: w.order)
        return waiter

    def remove(self, waiter: Waiter) -> None:
        """Drop `waiter` if still queued."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def __iter__(self) -> Iterator[Waiter]:
        """Waiters in grant order; a snapshot, so callers may remove while iterating."""
        return iter(list(self._waiters))

    def __len__(self) -> int:
        return len(self._waiters)

    def depth_for(self, spec: DeviceSpec) -> int:
        """How many waiting requests this device could serve."""
        return sum(1 for waiter in self._waiters if waiter.request.matches(spec))

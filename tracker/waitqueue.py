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
import collections
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
    """Waiters sorted by their tickets' order, found by request id, and counted per key: a
    device freed on a key nobody here waits for costs no walk through 500 waiters of another."""

    def __init__(self) -> None:
        self._waiters: list[Waiter] = []
        self._by_id: dict[str, Waiter] = {}
        self._keys: collections.Counter[str] = collections.Counter()

    def push(self, waiter: Waiter) -> None:
        """Queue `waiter` at the place its ticket gives it (replacing one with its request id)."""
        previous = self._by_id.get(waiter.ticket.request_id)
        if previous is not None:
            self.remove(previous)
        bisect.insort(self._waiters, waiter, key=lambda w: w.order)
        self._by_id[waiter.ticket.request_id] = waiter
        self._keys[waiter.request.key] += 1

    def remove(self, waiter: Waiter) -> None:
        """Drop `waiter` if still queued."""
        if self._by_id.get(waiter.ticket.request_id) is not waiter:
            return
        del self._by_id[waiter.ticket.request_id]
        index = bisect.bisect_left(self._waiters, waiter.order, key=lambda w: w.order)
        while self._waiters[index] is not waiter:  # tickets are unique; this is a safeguard
            index += 1
        del self._waiters[index]
        self._keys[waiter.request.key] -= 1
        if not self._keys[waiter.request.key]:
            del self._keys[waiter.request.key]

    def find(self, request_id: str) -> Waiter | None:
        """The waiter holding `request_id`, if any."""
        return self._by_id.get(request_id)

    def may_want(self, key: str) -> bool:
        """Whether a waiter here asks for `key` or for any key (its tags unchecked)."""
        return key in self._keys or "" in self._keys

    def __iter__(self) -> Iterator[Waiter]:
        """Waiters in grant order; a snapshot, so callers may remove while iterating."""
        return iter(list(self._waiters))

    def __len__(self) -> int:
        return len(self._waiters)

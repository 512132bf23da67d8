"""The TrackerStore contract: every state transition of the pool as one atomic method.

A store owns agents, devices, leases, per-device fences and the pool-wide queue of waiting Acquire
requests. The DevicePool above it owns the waiting calls and the clock; it passes `now_unix` into
every call, so a store never reads a clock (tests inject time, and replicas sharing a redis store
agree on it). Each method is one transition that an implementation MUST make atomic (memory: a
method that never awaits; redis: a Lua script), so two concurrent calls or replicas can never both
grant one device.

The methods are coroutines, awaited on the tracker's event loop: a store that does I/O (redis)
does it asynchronously, so no call holds a thread while it waits for an answer. A store object
belongs to the loop that first awaits it.

Invariants every implementation MUST keep:
- a device has at most one active lease, and a lease names exactly one device;
- a device is LOST exactly while its agent is expired; a LOST device is never granted;
- an ended lease is gone from the active set and its device is FREE (unless LOST) in the same step;
- the reason a lease ended is remembered (bounded) so Renew/Release can say why;
- a device's fence strictly increases across its grants, also across a restart of the tracker
  (fence = grant time in microseconds, bumped past the device's previous fence), and across its
  removal by a re-registration without it or a deregistration: the store keeps the device's last
  fence after the device itself is gone, so the same id registered again continues above it.
  Only the expiry sweep forgets the fence of a device it prunes after the LOST retention: by then
  any new grant's time in microseconds is far past it;
- a grant never overtakes the queue: a device goes to a request only if no live queued request
  ordered before it would be given that device by serving the queue in order (see `grant`).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable, Sequence

from tracker.model import (
    Deregistered,
    DeviceRecord,
    ExpiryReport,
    Lease,
    LeaseRequest,
    QueueTicket,
    Registration,
)
from tracker.tokens import TokenIssuer

# Reasons a lease ends; clients see them in RenewResponse.reason and ReleaseResponse.reason.
REASON_UNKNOWN = "unknown lease"
REASON_EXPIRED = "lease expired"
REASON_RELEASED = "lease released"
REASON_AGENT_SILENT = "device lost: agent stopped heartbeating"
REASON_DEVICE_DROPPED = "device lost: agent re-registered without it"
REASON_AGENT_DEREGISTERED = "device lost: agent deregistered"

# Ended-lease reasons kept for Renew/Release answers. A holder asks again within seconds, so a
# bounded memory is enough and a long-lived tracker does not grow without limit.
MAX_ENDED_LEASES = 10_000


Shape = tuple[str, tuple[tuple[str, str], ...]]
"""A request's key and its tag selector as sorted pairs: requests alike for matching."""


def shape_counts(requests: Iterable[LeaseRequest]) -> dict[Shape, int]:
    """How many of `requests` there are per shape."""
    counts: dict[Shape, int] = {}
    for request in requests:
        shape = (request.key, tuple(sorted(request.tag_selector.items())))
        counts[shape] = counts.get(shape, 0) + 1
    return counts


def next_fence(now_unix: float, previous: int) -> int:
    """The fence of a grant at `now_unix` on a device whose last fence was `previous`."""
    return max(int(now_unix * 1_000_000), previous + 1)


class TrackerStore(abc.ABC):
    """Agents, devices, leases and queued requests of one pool."""

    @abc.abstractmethod
    async def register(self, registration: Registration, now_unix: float) -> tuple[str, ...]:
        """Make `registration.devices` the agent's whole device set and mark it alive.

        MUST be idempotent. A device that stays keeps its lease; a device no longer listed is
        removed and its lease ended with REASON_DEVICE_DROPPED. A device_id owned by another live
        agent MUST be refused (nothing changes); one owned by an expired agent is taken over.

        Returns:
            The ids of leases this call ended.

        Raises:
            InvalidArgument: a device_id belongs to another live agent (names the field).
        """

    @abc.abstractmethod
    async def heartbeat(self, agent_id: str, now_unix: float) -> bool:
        """Record a heartbeat; False (and no change) when the agent is unknown or expired."""

    @abc.abstractmethod
    async def deregister(self, agent_id: str) -> Deregistered:
        """Forget the agent and all of its devices, live or LOST, in one atomic step.

        A lease on one of them ends with REASON_AGENT_DEREGISTERED (its holder's Renew and Release
        then say so). The devices' last fences are kept, so a device registered again under the
        same id is granted fences above every one issued before. Queued requests stay queued.
        Unknown agents are not an error: nothing changes and the result is empty.

        Returns:
            The ids of the devices removed and of the leases ended.
        """

    @abc.abstractmethod
    async def grant(
        self,
        request: LeaseRequest,
        lease_id: str,
        now_unix: float,
        ttl_s: float,
        issue_token: TokenIssuer,
        ticket: QueueTicket | None = None,
    ) -> Lease | None:
        """Lease one FREE device that `request` matches, or return None.

        MUST pick and mark the device in one atomic step, and MUST choose as if the queue were
        served in order: every live queued request ordered before this one (before `ticket`; or,
        for a new arrival with ticket None, every one of equal or higher priority) in turn claims
        the lowest-id free device it matches, and this request gets the lowest-id free device it
        matches that none of them claimed. With a ticket, the granted request leaves the queue in
        the same step. The lease's fence is `next_fence(now_unix, device's last fence)`.
        """

    @abc.abstractmethod
    async def renew(
        self, lease_id: str, now_unix: float, ttl_s: float, issue_token: TokenIssuer
    ) -> Lease:
        """Extend an active lease to `now_unix + ttl_s`, with a fresh token for the new expiry.

        The fence stays. A lease past its expiry MUST be ended here (REASON_EXPIRED) even if no
        sweep ran yet.

        Raises:
            LeaseLost: the lease is unknown or ended; the message is the reason.
        """

    @abc.abstractmethod
    async def release(self, lease_id: str, now_unix: float) -> Lease:
        """End an active lease (REASON_RELEASED) and free its device.

        Returns:
            The lease as it was; its token may be "" (stores need not keep tokens).

        Raises:
            LeaseLost: the lease is unknown or already ended (so double release is not an error).
        """

    @abc.abstractmethod
    async def expire(
        self,
        now_unix: float,
        agent_timeout_s: float,
        lost_device_retention_s: float = math.inf,
    ) -> ExpiryReport:
        """One sweep: silent agents, lapsed leases, long-lost devices, abandoned queue entries.

        Devices of agents silent for longer than `agent_timeout_s` become LOST and their leases
        end with REASON_AGENT_SILENT; other leases past `expires_at_unix` end with REASON_EXPIRED;
        devices LOST for longer than `lost_device_retention_s` are forgotten (an agent whose
        devices are all forgotten is forgotten too); queued requests past their expiry are dropped.
        """

    @abc.abstractmethod
    async def devices(self, key: str = "", after: str = "", limit: int = 0) -> list[DeviceRecord]:
        """Known devices with `key` ("" = all), LOST ones included, sorted by device_id: those
        whose id sorts after `after` ("" = from the first), at most `limit` (0 = all)."""

    @abc.abstractmethod
    async def devices_by_id(self, device_ids: Sequence[str]) -> list[DeviceRecord]:
        """The known devices among `device_ids` (unknown ids left out), in no particular order."""

    @abc.abstractmethod
    async def live_devices(self, key: str = "") -> list[DeviceRecord]:
        """The devices with `key` ("" = all) of live agents, in no particular order: what a
        NO_DEVICE answer looks at first, without touching the LOST ones."""

    @abc.abstractmethod
    async def enqueue(self, request: LeaseRequest, now_unix: float, ttl_s: float) -> QueueTicket:
        """Queue `request` (its request_id MUST be set) until `now_unix + ttl_s`.

        If a live entry with that request_id is queued, it is taken over: its expiry is refreshed
        and its ticket (original priority and place) returned, whatever this request says.
        """

    @abc.abstractmethod
    async def keep_queued(
        self,
        entries: Sequence[tuple[QueueTicket, LeaseRequest]],
        now_unix: float,
        ttl_s: float,
    ) -> None:
        """Refresh these waiting entries to expire at `now_unix + ttl_s`, re-creating any that
        a sweep dropped meanwhile with their original ticket."""

    @abc.abstractmethod
    async def dequeue(self, request_id: str) -> None:
        """Drop a queued request (answered, cancelled, timed out); no error when absent."""

    @abc.abstractmethod
    async def queued(self, now_unix: float) -> list[tuple[QueueTicket, LeaseRequest]]:
        """Live queued requests of every replica, in service order."""

    async def queued_shapes(self, now_unix: float) -> dict[Shape, int]:
        """How many live queued requests there are per shape (key, sorted tag selector): what
        ListDevices' queue depths need, without the requests themselves."""
        return shape_counts(request for _, request in await self.queued(now_unix))

    async def watch(self, on_change: Callable[[str | None], None]) -> None:
        """From now on, call `on_change` (on this event loop) when another process may have
        freed a device or left the queue, so waiters here get a chance at it: with the freed
        device's key when that is all that changed, else None. Returns without waiting for a
        change; `close` stops the watching.

        A store that only one process uses (memory) never needs to call it; the default does
        nothing. Calls may be missed (the pool also re-dispatches on every reap).
        """
        del on_change

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and background resources; later calls are not required to work."""

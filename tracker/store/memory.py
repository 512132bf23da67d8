"""The embedded store: all state in dicts; lost when the process exits.

Every method runs to its end without awaiting, so on the event loop each is atomic without a lock.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import itertools
import logging
import math
from collections.abc import Iterable, Sequence

from tracker.errors import InvalidArgument, LeaseLost
from tracker.model import (
    Deregistered,
    DeviceRecord,
    DeviceSpec,
    DeviceState,
    ExpiryReport,
    Lease,
    LeaseRequest,
    QueueTicket,
    Registration,
)
from tracker.store import base
from tracker.tokens import TokenIssuer

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class _Agent:
    address: str
    last_heartbeat_unix: float
    expired_at_unix: float | None = None
    device_ids: list[str] = dataclasses.field(default_factory=list)

    @property
    def expired(self) -> bool:
        return self.expired_at_unix is not None


@dataclasses.dataclass
class _Device:
    spec: DeviceSpec
    agent_id: str
    lease_id: str | None = None


@dataclasses.dataclass
class _Queued:
    ticket: QueueTicket
    request: LeaseRequest
    expires_at_unix: float


class _Queue:
    """Queued requests by request id, and the same entries by key: a grant on one key looks only
    at the requests that could claim that key's devices, not at every waiter of the pool."""

    def __init__(self) -> None:
        self._by_id: dict[str, _Queued] = {}
        self._by_key: dict[str, dict[str, _Queued]] = collections.defaultdict(dict)

    def get(self, request_id: str) -> _Queued | None:
        return self._by_id.get(request_id)

    def put(self, entry: _Queued) -> None:
        self.pop(entry.ticket.request_id)
        self._by_id[entry.ticket.request_id] = entry
        self._by_key[entry.request.key][entry.ticket.request_id] = entry

    def pop(self, request_id: str) -> None:
        entry = self._by_id.pop(request_id, None)
        if entry is None:
            return
        same_key = self._by_key[entry.request.key]
        del same_key[request_id]
        if not same_key:
            del self._by_key[entry.request.key]

    def entries(self) -> list[_Queued]:
        return list(self._by_id.values())

    def competing(self, key: str) -> Iterable[_Queued]:
        """Every entry that may take a free device of `key` before a request of that key.

        A request of another key never takes one. But a request for any key ("") takes the
        first free device of any key that entries ahead of it left, so while one is queued
        (or the request itself is for any key) every entry counts.
        """
        if not key or "" in self._by_key:
            return self._by_id.values()
        return self._by_key.get(key, {}).values()


class MemoryStore(base.TrackerStore):
    """TrackerStore in process memory; no method awaits, so each is atomic on the event loop."""

    def __init__(self) -> None:
        self._agents: dict[str, _Agent] = {}
        self._devices: dict[str, _Device] = {}
        self._leases: dict[str, Lease] = {}
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._fences: dict[str, int] = {}
        self._queue = _Queue()
        self._seq = itertools.count(1)
        # Sorted ids of grantable devices (live agent, no lease): all, and per key, so a grant
        # with 1,000 devices registered looks at the first few instead of sorting them all.
        self._free: list[str] = []
        self._free_by_key: dict[str, list[str]] = collections.defaultdict(list)

    async def register(self, registration: Registration, now_unix: float) -> tuple[str, ...]:
        agent_id = registration.agent_id
        for index, spec in enumerate(registration.devices):
            device = self._devices.get(spec.device_id)
            if device is None or device.agent_id == agent_id:
                continue
            if not self._agents[device.agent_id].expired:
                raise InvalidArgument(
                    f"devices[{index}].device_id {spec.device_id!r} is registered by live "
                    f"agent {device.agent_id!r}"
                )
        ended: list[str] = []
        new_ids = {spec.device_id for spec in registration.devices}
        old = self._agents.get(agent_id)
        for device_id in old.device_ids if old else ():
            if device_id not in new_ids:
                ended += self._drop_device(device_id, base.REASON_DEVICE_DROPPED)
        for spec in registration.devices:
            device = self._devices.get(spec.device_id)
            if device is not None and device.agent_id != agent_id:
                # Taking over from an expired agent: its leases ended when it expired.
                self._agents[device.agent_id].device_ids.remove(spec.device_id)
                device = None
            if device is None:
                device = self._devices[spec.device_id] = _Device(spec, agent_id)
            else:
                self._mark_busy(device)  # its key may change
                device.spec = spec
            if device.lease_id is None:
                self._mark_free(device)
        self._agents[agent_id] = _Agent(
            address=registration.agent_address,
            last_heartbeat_unix=now_unix,
            device_ids=[spec.device_id for spec in registration.devices],
        )
        return tuple(ended)

    async def heartbeat(self, agent_id: str, now_unix: float) -> bool:
        agent = self._agents.get(agent_id)
        if agent is None or agent.expired:
            return False
        agent.last_heartbeat_unix = now_unix
        return True

    async def deregister(self, agent_id: str) -> Deregistered:
        agent = self._agents.pop(agent_id, None)
        if agent is None:
            return Deregistered()
        removed: list[str] = []
        ended: list[str] = []
        for device_id in agent.device_ids:
            device = self._devices.get(device_id)
            if device is None or device.agent_id != agent_id:
                continue
            # The device's fence stays in self._fences: a later grant continues above it.
            ended += self._drop_device(device_id, base.REASON_AGENT_DEREGISTERED)
            removed.append(device_id)
        return Deregistered(tuple(removed), tuple(ended))

    async def grant(
        self,
        request: LeaseRequest,
        lease_id: str,
        now_unix: float,
        ttl_s: float,
        issue_token: TokenIssuer,
        ticket: QueueTicket | None = None,
    ) -> Lease | None:
        claimed: set[str] = set()
        for entry in self._ahead(request, ticket, now_unix):
            for device_id in self._free_ids(entry.key):
                if device_id not in claimed and entry.matches(self._devices[device_id].spec):
                    claimed.add(device_id)
                    break
        for device_id in self._free_ids(request.key):
            device = self._devices[device_id]
            if device_id in claimed or not request.matches(device.spec):
                continue
            fence = base.next_fence(now_unix, self._fences.get(device_id, 0))
            self._fences[device_id] = fence
            expires_at_unix = now_unix + ttl_s
            token = issue_token(lease_id, device_id, fence, expires_at_unix)
            lease = Lease(lease_id, device.spec, expires_at_unix, token, request.user, fence)
            self._leases[lease_id] = lease
            device.lease_id = lease_id
            self._mark_busy(device)
            if ticket is not None:
                self._queue.pop(ticket.request_id)
            return lease
        return None

    async def renew(
        self, lease_id: str, now_unix: float, ttl_s: float, issue_token: TokenIssuer
    ) -> Lease:
        lease = self._active(lease_id)
        if lease.expires_at_unix <= now_unix:
            self._end(lease_id, base.REASON_EXPIRED)
            raise LeaseLost(base.REASON_EXPIRED)
        expires_at_unix = now_unix + ttl_s
        token = issue_token(lease_id, lease.device.device_id, lease.fence, expires_at_unix)
        lease = dataclasses.replace(lease, expires_at_unix=expires_at_unix, token=token)
        self._leases[lease_id] = lease
        return lease

    async def release(self, lease_id: str, now_unix: float) -> Lease:
        lease = self._active(lease_id)
        if lease.expires_at_unix <= now_unix:
            self._end(lease_id, base.REASON_EXPIRED)
            raise LeaseLost(base.REASON_EXPIRED)
        self._end(lease_id, base.REASON_RELEASED)
        return lease

    async def expire(
        self,
        now_unix: float,
        agent_timeout_s: float,
        lost_device_retention_s: float = math.inf,
    ) -> ExpiryReport:
        agents: list[str] = []
        lost: list[str] = []
        ended: list[str] = []
        pruned: list[str] = []
        for agent_id, agent in list(self._agents.items()):
            if agent.expired_at_unix is not None:
                if now_unix - agent.expired_at_unix > lost_device_retention_s:
                    for device_id in agent.device_ids:
                        del self._devices[device_id]
                        self._fences.pop(device_id, None)
                        pruned.append(device_id)
                    del self._agents[agent_id]
                continue
            if now_unix - agent.last_heartbeat_unix <= agent_timeout_s:
                continue
            agent.expired_at_unix = now_unix
            agents.append(agent_id)
            for device_id in agent.device_ids:
                lost.append(device_id)
                self._mark_busy(self._devices[device_id])
                lease_id = self._devices[device_id].lease_id
                if lease_id is not None:
                    self._end(lease_id, base.REASON_AGENT_SILENT)
                    ended.append(lease_id)
        for lease_id, lease in list(self._leases.items()):
            if lease.expires_at_unix <= now_unix:
                self._end(lease_id, base.REASON_EXPIRED)
                ended.append(lease_id)
        dropped = [
            q.ticket.request_id for q in self._queue.entries() if q.expires_at_unix <= now_unix
        ]
        for request_id in dropped:
            self._queue.pop(request_id)
        return ExpiryReport(tuple(agents), tuple(lost), tuple(ended), tuple(pruned), tuple(dropped))

    async def devices(self, key: str = "", after: str = "", limit: int = 0) -> list[DeviceRecord]:
        records: list[DeviceRecord] = []
        for device_id in sorted(self._devices):
            if device_id <= after:
                continue
            device = self._devices[device_id]
            if key and device.spec.key != key:
                continue
            if limit and len(records) >= limit:
                break
            records.append(self._record(device))
        return records

    async def devices_by_id(self, device_ids: Sequence[str]) -> list[DeviceRecord]:
        return [
            self._record(self._devices[device_id])
            for device_id in device_ids
            if device_id in self._devices
        ]

    async def live_devices(self, key: str = "") -> list[DeviceRecord]:
        return [
            self._record(device)
            for agent in self._agents.values()
            if not agent.expired
            for device in map(self._devices.__getitem__, agent.device_ids)
            if not key or device.spec.key == key
        ]

    def _record(self, device: _Device) -> DeviceRecord:
        agent = self._agents[device.agent_id]
        lease = self._leases.get(device.lease_id) if device.lease_id else None
        if agent.expired:
            state = DeviceState.LOST
        elif lease is not None:
            state = DeviceState.LEASED
        else:
            state = DeviceState.FREE
        holder = lease.user if lease is not None else ""
        fence = lease.fence if lease is not None else 0
        return DeviceRecord(device.spec, state, holder, agent.last_heartbeat_unix, fence)

    async def enqueue(self, request: LeaseRequest, now_unix: float, ttl_s: float) -> QueueTicket:
        if not request.request_id:
            raise InvalidArgument("request_id must not be empty to queue a request")
        entry = self._queue.get(request.request_id)
        if entry is not None and entry.expires_at_unix > now_unix:
            entry.expires_at_unix = now_unix + ttl_s
            return entry.ticket
        ticket = QueueTicket(request.request_id, request.priority, next(self._seq))
        self._queue.put(_Queued(ticket, request, now_unix + ttl_s))
        return ticket

    async def keep_queued(
        self,
        entries: Sequence[tuple[QueueTicket, LeaseRequest]],
        now_unix: float,
        ttl_s: float,
    ) -> None:
        for ticket, request in entries:
            self._queue.put(_Queued(ticket, request, now_unix + ttl_s))

    async def dequeue(self, request_id: str) -> None:
        self._queue.pop(request_id)

    async def queued(self, now_unix: float) -> list[tuple[QueueTicket, LeaseRequest]]:
        live = [q for q in self._queue.entries() if q.expires_at_unix > now_unix]
        live.sort(key=lambda q: q.ticket.order)
        return [(q.ticket, q.request) for q in live]

    async def close(self) -> None:
        """Nothing to release: the state dies with the object."""

    def _ahead(
        self, request: LeaseRequest, ticket: QueueTicket | None, now_unix: float
    ) -> list[LeaseRequest]:
        """Live queued requests served before this one that could take a device it could, in
        service order."""
        if ticket is None:
            ahead = [
                q
                for q in self._queue.competing(request.key)
                if q.ticket.priority >= request.priority and q.expires_at_unix > now_unix
            ]
        else:
            ahead = [
                q
                for q in self._queue.competing(request.key)
                if q.ticket.order < ticket.order
                and q.expires_at_unix > now_unix
                and q.ticket.request_id != ticket.request_id
            ]
        ahead.sort(key=lambda q: q.ticket.order)
        return [q.request for q in ahead]

    def _free_ids(self, key: str) -> list[str]:
        """Sorted ids of grantable devices with `key` ("" = any); a snapshot."""
        return list(self._free_by_key.get(key, ()) if key else self._free)

    def _mark_free(self, device: _Device) -> None:
        for ids in (self._free, self._free_by_key[device.spec.key]):
            index = bisect.bisect_left(ids, device.spec.device_id)
            if index == len(ids) or ids[index] != device.spec.device_id:
                ids.insert(index, device.spec.device_id)

    def _mark_busy(self, device: _Device) -> None:
        for ids in (self._free, self._free_by_key[device.spec.key]):
            index = bisect.bisect_left(ids, device.spec.device_id)
            if index < len(ids) and ids[index] == device.spec.device_id:
                del ids[index]

    def _active(self, lease_id: str) -> Lease:
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseLost(self._ended.get(lease_id, base.REASON_UNKNOWN))
        return lease

    def _end(self, lease_id: str, reason: str) -> None:
        lease = self._leases.pop(lease_id)
        device = self._devices.get(lease.device.device_id)
        if device is not None and device.lease_id == lease_id:
            device.lease_id = None
            if not self._agents[device.agent_id].expired:
                self._mark_free(device)
        self._ended[lease_id] = reason
        while len(self._ended) > base.MAX_ENDED_LEASES:
            self._ended.popitem(last=False)
        _LOG.debug("lease %s on %s ended: %s", lease_id, lease.device.device_id, reason)

    def _drop_device(self, device_id: str, reason: str) -> list[str]:
        device = self._devices.pop(device_id)
        self._mark_busy(device)
        if device.lease_id is None:
            return []
        self._end(device.lease_id, reason)
        return [device.lease_id]

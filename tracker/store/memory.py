"""The embedded store: all state in dicts behind one lock; lost when the process exits."""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading

from tracker.errors import InvalidArgument, LeaseLost
from tracker.model import (
    DeviceRecord,
    DeviceSpec,
    DeviceState,
    ExpiryReport,
    Lease,
    LeaseRequest,
    Registration,
)
from tracker.store import base
from tracker.tokens import TokenIssuer

_LOG = logging.getLogger(__name__)

# Ended-lease reasons kept for Renew/Release answers. A holder asks again within seconds, so a
# bounded memory is enough and a long-lived tracker does not grow without limit.
_MAX_ENDED_LEASES = 10_000


@dataclasses.dataclass
class _Agent:
    address: str
    last_heartbeat_unix: float
    expired: bool = False
    device_ids: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Device:
    spec: DeviceSpec
    agent_id: str
    lease_id: str | None = None


class MemoryStore(base.TrackerStore):
    """TrackerStore in process memory; every method holds one lock, so each is atomic."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._agents: dict[str, _Agent] = {}
        self._devices: dict[str, _Device] = {}
        self._leases: dict[str, Lease] = {}
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()

    def register(self, registration: Registration, now_unix: float) -> tuple[str, ...]:
        agent_id = registration.agent_id
        with self._lock:
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
                    self._devices[spec.device_id] = _Device(spec, agent_id)
                else:
                    device.spec = spec
            self._agents[agent_id] = _Agent(
                address=registration.agent_address,
                last_heartbeat_unix=now_unix,
                device_ids=[spec.device_id for spec in registration.devices],
            )
            return tuple(ended)

    def heartbeat(self, agent_id: str, now_unix: float) -> bool:
        with self._lock:
            agent = self._agents.get(agent_id)
            if agent is None or agent.expired:
                return False
            agent.last_heartbeat_unix = now_unix
            return True

    def grant(
        self,
        request: LeaseRequest,
        lease_id: str,
        now_unix: float,
        ttl_s: float,
        issue_token: TokenIssuer,
    ) -> Lease | None:
        with self._lock:
            for device_id in sorted(self._devices):
                device = self._devices[device_id]
                if device.lease_id is not None or self._agents[device.agent_id].expired:
                    continue
                if not request.matches(device.spec):
                    continue
                expires_at_unix = now_unix + ttl_s
                token = issue_token(lease_id, device_id, expires_at_unix)
                lease = Lease(lease_id, device.spec, expires_at_unix, token, request.user)
                self._leases[lease_id] = lease
                device.lease_id = lease_id
                return lease
            return None

    def renew(self, lease_id: str, now_unix: float, ttl_s: float) -> Lease:
        with self._lock:
            lease = self._active(lease_id)
            if lease.expires_at_unix <= now_unix:
                self._end(lease_id, base.REASON_EXPIRED)
                raise LeaseLost(base.REASON_EXPIRED)
            lease = dataclasses.replace(lease, expires_at_unix=now_unix + ttl_s)
            self._leases[lease_id] = lease
            return lease

    def release(self, lease_id: str, now_unix: float) -> Lease:
        with self._lock:
            lease = self._active(lease_id)
            if lease.expires_at_unix <= now_unix:
                self._end(lease_id, base.REASON_EXPIRED)
                raise LeaseLost(base.REASON_EXPIRED)
            self._end(lease_id, base.REASON_RELEASED)
            return lease

    def expire(self, now_unix: float, agent_timeout_s: float) -> ExpiryReport:
        with self._lock:
            agents: list[str] = []
            lost: list[str] = []
            ended: list[str] = []
            for agent_id, agent in self._agents.items():
                if agent.expired or now_unix - agent.last_heartbeat_unix <= agent_timeout_s:
                    continue
                agent.expired = True
                agents.append(agent_id)
                for device_id in agent.device_ids:
                    lost.append(device_id)
                    lease_id = self._devices[device_id].lease_id
                    if lease_id is not None:
                        self._end(lease_id, base.REASON_AGENT_SILENT)
                        ended.append(lease_id)
            for lease_id, lease in list(self._leases.items()):
                if lease.expires_at_unix <= now_unix:
                    self._end(lease_id, base.REASON_EXPIRED)
                    ended.append(lease_id)
            return ExpiryReport(tuple(agents), tuple(lost), tuple(ended))

    def devices(self, key: str = "") -> list[DeviceRecord]:
        with self._lock:
            records = []
            for device_id in sorted(self._devices):
                device = self._devices[device_id]
                if key and device.spec.key != key:
                    continue
                agent = self._agents[device.agent_id]
                lease = self._leases.get(device.lease_id) if device.lease_id else None
                if agent.expired:
                    state = DeviceState.LOST
                elif lease is not None:
                    state = DeviceState.LEASED
                else:
                    state = DeviceState.FREE
                holder = lease.user if lease is not None else ""
                records.append(DeviceRecord(device.spec, state, holder, agent.last_heartbeat_unix))
            return records

    def close(self) -> None:
        """Nothing to release: the state dies with the object."""

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
        self._ended[lease_id] = reason
        while len(self._ended) > _MAX_ENDED_LEASES:
            self._ended.popitem(last=False)
        _LOG.debug("lease %s on %s ended: %s", lease_id, lease.device.device_id, reason)

    def _drop_device(self, device_id: str, reason: str) -> list[str]:
        device = self._devices.pop(device_id)
        if device.lease_id is None:
            return []
        self._end(device.lease_id, reason)
        return [device.lease_id]

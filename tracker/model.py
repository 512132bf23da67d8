"""Plain records the tracker's core works with; no protobuf here (serde converts)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping


class DeviceState(enum.Enum):
    """Where a device stands in the pool."""

    FREE = "free"
    LEASED = "leased"
    LOST = "lost"  # its agent stopped heartbeating


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """A device as an agent registered it."""

    device_id: str
    key: str
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    agent_address: str = ""
    backend: str = ""


@dataclasses.dataclass(frozen=True)
class Registration:
    """One Register call: an agent and all of its devices (validated by the pool)."""

    agent_id: str
    agent_address: str
    devices: tuple[DeviceSpec, ...]


@dataclasses.dataclass(frozen=True)
class LeaseRequest:
    """What a client asks Acquire for."""

    key: str = ""
    tag_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    priority: int = 0
    user: str = ""
    timeout_s: float = 0.0
    lease_ttl_s: float = 0.0
    request_id: str = ""
    """Client-chosen id; an Acquire with the id of a still-queued request takes over its place."""

    def matches(self, spec: DeviceSpec) -> bool:
        """True when the device has this key ("" = any) and every selected tag."""
        if self.key and spec.key != self.key:
            return False
        return all(spec.tags.get(name) == value for name, value in self.tag_selector.items())


@dataclasses.dataclass(frozen=True)
class Lease:
    """A granted, time-limited right to use one device."""

    lease_id: str
    device: DeviceSpec
    expires_at_unix: float
    token: str
    user: str
    fence: int = 0
    """Strictly increasing per device across grants; kept by Renew (see protos.fencing)."""


@dataclasses.dataclass(frozen=True)
class DeviceRecord:
    """A store's view of one device: its spec, state, holder and last heartbeat."""

    spec: DeviceSpec
    state: DeviceState
    lease_holder: str
    last_heartbeat_unix: float
    fence: int = 0
    """The fence of its current lease; 0 when it has none."""


@dataclasses.dataclass(frozen=True)
class DeviceStatus:
    """What ListDevices reports for one device."""

    spec: DeviceSpec
    state: DeviceState
    lease_holder: str
    heartbeat_age_s: float
    queue_depth: int


@dataclasses.dataclass(frozen=True)
class ExpiryReport:
    """What one expiry sweep ended."""

    expired_agents: tuple[str, ...] = ()
    lost_devices: tuple[str, ...] = ()
    ended_leases: tuple[str, ...] = ()
    pruned_devices: tuple[str, ...] = ()
    """Devices LOST for longer than the retention, forgotten by this sweep."""
    dropped_requests: tuple[str, ...] = ()
    """Queued requests whose tracker stopped refreshing them (it died and no one re-attached)."""

    @property
    def changed(self) -> bool:
        """True when the sweep may have made a device grantable to some waiter."""
        return bool(self.expired_agents or self.ended_leases or self.dropped_requests)


@dataclasses.dataclass(frozen=True)
class QueueTicket:
    """A queued Acquire's place in the pool-wide queue: higher priority first, then lower seq."""

    request_id: str
    priority: int
    seq: int

    @property
    def order(self) -> tuple[int, int]:
        """Sort key: the smaller, the earlier the request is served."""
        return (-self.priority, self.seq)


@dataclasses.dataclass(frozen=True)
class AcquireResult:
    """A lease, or None and the reason there was no device."""

    lease: Lease | None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class ReleaseResult:
    """Whether Release ended an active lease, and why not."""

    released: bool
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Registered:
    """What Register answers: the heartbeat interval and each device's lowest valid fence."""

    heartbeat_interval_s: float
    fence_floors: dict[str, int]


@dataclasses.dataclass(frozen=True)
class Deregistered:
    """What one deregistration removed: the agent's devices and the leases it ended on them."""

    devices: tuple[str, ...] = ()
    ended_leases: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class DevicePage:
    """One page of ListDevices; `next_page_token` is "" on the last."""

    devices: list[DeviceStatus]
    next_page_token: str

"""The TrackerStore contract: every state transition of the pool as one atomic method.

A store owns agents, devices and leases. The DevicePool above it owns the wait queue and the clock;
it passes `now_unix` into every call, so a store never reads a clock (tests inject time, and
replicas sharing a redis store agree on it). Each method is one transition that an implementation
MUST make atomic (a lock for memory; a Lua script or WATCH/MULTI transaction for redis), so two
tracker threads or replicas can never both grant one device.

Invariants every implementation MUST keep:
- a device has at most one active lease, and a lease names exactly one device;
- a device is LOST exactly while its agent is expired; a LOST device is never granted;
- an ended lease is gone from the active set and its device is FREE (unless LOST) in the same step;
- the reason a lease ended is remembered (bounded) so Renew/Release can say why.
"""

from __future__ import annotations

import abc

from tracker.model import DeviceRecord, ExpiryReport, Lease, LeaseRequest, Registration
from tracker.tokens import TokenIssuer

# Reasons a lease ends; clients see them in RenewResponse.reason and ReleaseResponse.reason.
REASON_UNKNOWN = "unknown lease"
REASON_EXPIRED = "lease expired"
REASON_RELEASED = "lease released"
REASON_AGENT_SILENT = "device lost: agent stopped heartbeating"
REASON_DEVICE_DROPPED = "device lost: agent re-registered without it"


class TrackerStore(abc.ABC):
    """Agents, devices and leases of one pool."""

    @abc.abstractmethod
    def register(self, registration: Registration, now_unix: float) -> tuple[str, ...]:
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
    def heartbeat(self, agent_id: str, now_unix: float) -> bool:
        """Record a heartbeat; False (and no change) when the agent is unknown or expired."""

    @abc.abstractmethod
    def grant(
        self,
        request: LeaseRequest,
        lease_id: str,
        now_unix: float,
        ttl_s: float,
        issue_token: TokenIssuer,
    ) -> Lease | None:
        """Lease one FREE device that `request` matches, or return None.

        MUST pick and mark the device in one atomic step. Among several free matches the choice is
        the implementation's (memory: lowest device_id), but it MUST be deterministic for one state.
        """

    @abc.abstractmethod
    def renew(self, lease_id: str, now_unix: float, ttl_s: float) -> Lease:
        """Extend an active lease to `now_unix + ttl_s`.

        A lease past its expiry MUST be ended here (REASON_EXPIRED) even if no sweep ran yet.

        Raises:
            LeaseLost: the lease is unknown or ended; the message is the reason.
        """

    @abc.abstractmethod
    def release(self, lease_id: str, now_unix: float) -> Lease:
        """End an active lease (REASON_RELEASED) and free its device.

        Raises:
            LeaseLost: the lease is unknown or already ended (so double release is not an error).
        """

    @abc.abstractmethod
    def expire(self, now_unix: float, agent_timeout_s: float) -> ExpiryReport:
        """Expire agents silent for longer than `agent_timeout_s` and leases past their expiry.

        Devices of expired agents become LOST and their leases end with REASON_AGENT_SILENT;
        other leases past `expires_at_unix` end with REASON_EXPIRED.
        """

    @abc.abstractmethod
    def devices(self, key: str = "") -> list[DeviceRecord]:
        """Every known device with `key` ("" = all), LOST ones included, sorted by device_id."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and background resources; later calls are not required to work."""

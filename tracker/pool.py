"""DevicePool: the tracker's core. Registers agents, queues Acquire requests, grants leases.

State lives in a TrackerStore; what the pool adds is the wait queue and the clock. Whenever a
device may have become free (register, release, failed renew, expiry sweep) the pool dispatches:
it offers free devices to waiters in queue order and wakes them through one condition variable.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from tracker import validation
from tracker.config import TrackerConfig
from tracker.errors import InvalidArgument, LeaseLost
from tracker.model import (
    AcquireResult,
    DeviceSpec,
    DeviceState,
    DeviceStatus,
    ExpiryReport,
    Lease,
    LeaseRequest,
    ReleaseResult,
)
from tracker.store.base import TrackerStore
from tracker.tokens import TokenIssuer, random_token
from tracker.waitqueue import WaitQueue

_LOG = logging.getLogger(__name__)

# Waiters re-check cancellation this often. Cancel callbacks also wake them at once; the poll only
# bounds the delay if a wake-up is missed.
_CANCEL_POLL_S = 0.25

REASON_SHUTTING_DOWN = "tracker shutting down"
REASON_CANCELLED = "request cancelled: client went away"


def _new_lease_id() -> str:
    return uuid.uuid4().hex


class DevicePool:
    """Thread-safe front of a TrackerStore with a priority wait queue for Acquire."""

    def __init__(
        self,
        store: TrackerStore,
        config: TrackerConfig,
        clock: Callable[[], float] = time.time,
        issue_token: TokenIssuer = random_token,
        new_lease_id: Callable[[], str] = _new_lease_id,
    ) -> None:
        """Create a pool over `store`.

        Args:
            clock: seconds since the epoch; lease expiry and heartbeat age use it. Acquire waits
                use time.monotonic, since a condition variable waits in real time anyway.
        """
        self.config = config
        self._store = store
        self._clock = clock
        self._issue_token = issue_token
        self._new_lease_id = new_lease_id
        self._cond = threading.Condition()
        self._queue = WaitQueue()
        self._closed = False

    def register(self, agent_id: str, agent_address: str, devices: Sequence[DeviceSpec]) -> float:
        """Replace the agent's devices; returns the heartbeat interval the agent must keep.

        Raises:
            InvalidArgument: see validation.registration.
        """
        registration = validation.registration(agent_id, agent_address, devices)
        ended = self._store.register(registration, self._clock())
        _LOG.info(
            "agent %s at %s registered %d devices",
            registration.agent_id,
            registration.agent_address,
            len(registration.devices),
        )
        if ended:
            _LOG.warning("re-register of %s ended leases %s", registration.agent_id, ended)
        self._dispatch()
        return self.config.heartbeat_interval_s

    def heartbeat(self, agent_id: str) -> bool:
        """Record a heartbeat; False means the agent must register again."""
        if not agent_id:
            raise InvalidArgument("agent_id must not be empty")
        return self._store.heartbeat(agent_id, self._clock())

    def acquire(
        self,
        request: LeaseRequest,
        cancelled: threading.Event | None = None,
        client_time_remaining_s: float | None = None,
    ) -> AcquireResult:
        """Wait for a matching device, queued behind higher-priority and earlier requests.

        Args:
            cancelled: set when the client goes away; the request then leaves the queue.
            client_time_remaining_s: the RPC deadline, if the client set one; the wait never
                outlasts it, nor request.timeout_s, nor config.max_acquire_wait_s.
        """
        validation.lease_request(request)
        wait_s = min(request.timeout_s, self.config.max_acquire_wait_s)
        if client_time_remaining_s is not None:
            wait_s = min(wait_s, max(client_time_remaining_s, 0.0))
        deadline = time.monotonic() + wait_s
        with self._cond:
            if self._closed:
                return AcquireResult(None, REASON_SHUTTING_DOWN)
            waiter = self._queue.push(request)
            self._dispatch_locked()
            while waiter.lease is None and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (cancelled is not None and cancelled.is_set()):
                    break
                self._cond.wait(min(remaining, _CANCEL_POLL_S))
            self._queue.remove(waiter)
            lease, closed = waiter.lease, self._closed
        if cancelled is not None and cancelled.is_set():
            if lease is not None:
                self.release(lease.lease_id)
            return AcquireResult(None, REASON_CANCELLED)
        if lease is not None:
            _LOG.info("lease %s on %s to %r", lease.lease_id, lease.device.device_id, lease.user)
            return AcquireResult(lease)
        return AcquireResult(None, REASON_SHUTTING_DOWN if closed else self._no_device(request))

    def renew(self, lease_id: str, lease_ttl_s: float = 0.0) -> Lease:
        """Extend a lease by `lease_ttl_s` (0 = default) from now.

        Raises:
            LeaseLost: the lease is unknown or ended; its message is the reason.
        """
        validation.lease_id(lease_id)
        validation.non_negative_seconds("lease_ttl_s", lease_ttl_s)
        try:
            return self._store.renew(lease_id, self._clock(), self._ttl(lease_ttl_s))
        except LeaseLost:
            self._dispatch()  # the renew may have ended an expired lease and freed its device
            raise

    def release(self, lease_id: str) -> ReleaseResult:
        """End a lease; released=False with a reason when it was unknown or already ended."""
        validation.lease_id(lease_id)
        try:
            lease = self._store.release(lease_id, self._clock())
        except LeaseLost as lost:
            self._dispatch()
            return ReleaseResult(False, lost.reason)
        _LOG.info("lease %s on %s released", lease_id, lease.device.device_id)
        self._dispatch()
        return ReleaseResult(True)

    def list_devices(self, key: str = "") -> list[DeviceStatus]:
        """Every device with `key` ("" = all) with its state and the requests it could serve."""
        now = self._clock()
        records = self._store.devices(key)
        with self._cond:
            depths = [self._queue.depth_for(record.spec) for record in records]
        return [
            DeviceStatus(
                record.spec,
                record.state,
                record.lease_holder,
                max(now - record.last_heartbeat_unix, 0.0),
                depth,
            )
            for record, depth in zip(records, depths, strict=True)
        ]

    def reap(self) -> ExpiryReport:
        """Expire silent agents and lapsed leases, then offer freed devices to waiters."""
        report = self._store.expire(self._clock(), self.config.agent_timeout_s)
        for agent_id in report.expired_agents:
            _LOG.warning("agent %s stopped heartbeating; its devices are LOST", agent_id)
        if report.changed:
            self._dispatch()
        return report

    @property
    def waiting(self) -> int:
        """Number of Acquire requests in the queue."""
        with self._cond:
            return len(self._queue)

    def wake(self) -> None:
        """Wake every waiter to re-check its cancel flag (called from gRPC cancel callbacks)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse new Acquires and answer waiting ones with NO_DEVICE; the store stays open."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _ttl(self, requested_s: float) -> float:
        if requested_s <= 0:
            return self.config.default_lease_ttl_s
        return min(requested_s, self.config.max_lease_ttl_s)

    def _dispatch(self) -> None:
        with self._cond:
            self._dispatch_locked()

    def _dispatch_locked(self) -> None:
        granted = False
        now = self._clock()
        for waiter in self._queue:
            request = waiter.request
            lease = self._store.grant(
                request,
                self._new_lease_id(),
                now,
                self._ttl(request.lease_ttl_s),
                self._issue_token,
            )
            if lease is not None:
                waiter.lease = lease
                self._queue.remove(waiter)
                granted = True
        if granted:
            self._cond.notify_all()

    def _no_device(self, request: LeaseRequest) -> str:
        matching = [r for r in self._store.devices(request.key) if request.matches(r.spec)]
        live = sum(1 for r in matching if r.state is not DeviceState.LOST)
        if live:
            return f"all {live} matching devices busy"
        wanted = f"key={request.key!r} tags={dict(request.tag_selector)!r}"
        if matching:
            return f"no live device matches {wanted}: all {len(matching)} matching devices lost"
        return f"no registered device matches {wanted}"

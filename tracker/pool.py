"""DevicePool: the tracker's core. Registers agents, queues Acquire requests, grants leases.

State lives in a TrackerStore, the pool-wide queue of waiting requests included; what the pool
adds is the local waiters and the clock. Whenever a device may have become free (register,
release, failed renew, expiry sweep, a change another replica announced through `store.watch`)
the pool dispatches: it offers free devices to its waiters in queue order and completes each
granted waiter's future. The store makes every grant respect the whole queue, so a waiter on one
replica never overtakes an earlier one on another.

The pool lives on one asyncio event loop: every method that reaches the store is a coroutine, and
the store's own calls are awaited there too (redis.asyncio for the Redis store), so neither a
waiting Acquire nor a store round trip holds a thread. `acquire` runs an Acquire whole:
`start_acquire` answers at once or returns a queued Waiter, `acquire` awaits the waiter's future,
then `finish` answers it, or `abandon` drops it when the call is cancelled (its client left).
A transition that must not be cut in half by a cancelled caller (a grant whose answer would be
lost) runs to its end in a task of its own, and what it granted a departed caller is released.

A request that no registered device could ever serve (no device with its key and tags, in any
state) is answered NO_DEVICE at once instead of waiting out its timeout: the client made a typo
or asks for hardware the pool does not have. Busy and LOST devices are known, so a request for
them waits: LOST devices usually come back when their agent registers again under its old id.
For config.startup_grace_s after the pool starts, unknown selectors wait too (until the grace
ends), since a restarted tracker's agents have not registered again yet.

Queued requests survive a restart: a waiting request is in the store with its ticket (priority and
place), refreshed on every reap while its call is alive. An Acquire that carries the request_id of
a still-queued request (the client retrying after the tracker went away) takes over that place.
Entries nobody refreshes expire after config.queued_request_ttl_s, so a dead tracker's waiters do
not block the queue for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from tracker import listing, validation
from tracker.config import TrackerConfig
from tracker.errors import InvalidArgument, LeaseLost, StoreUnavailable
from tracker.model import (
    AcquireResult,
    DevicePage,
    DeviceSpec,
    DeviceStatus,
    ExpiryReport,
    Lease,
    LeaseRequest,
    Registered,
    ReleaseResult,
)
from tracker.store.base import TrackerStore
from tracker.tokens import TokenIssuer, ephemeral_issuer
from tracker.waitqueue import Waiter, WaitQueue

_LOG = logging.getLogger(__name__)

REASON_SHUTTING_DOWN = "tracker shutting down"
REASON_CANCELLED = "request cancelled: client went away"
REASON_SUPERSEDED = "superseded by a newer Acquire with the same request_id"

# A uuid is 32-36 characters; the cap keeps a client from parking large keys in the store.
MAX_REQUEST_ID_CHARS = 128

_T = TypeVar("_T")


def _new_id() -> str:
    return uuid.uuid4().hex


def _wanted(request: LeaseRequest) -> str:
    return f"key={request.key!r} tags={dict(request.tag_selector)!r}"


def _no_registered(request: LeaseRequest) -> str:
    return f"no registered device matches {_wanted(request)}"


class DevicePool:
    """Front of a TrackerStore with a priority wait queue for Acquire, on one event loop.

    Its coroutines MUST all run on one loop (the one its store belongs to); `waiting` may be read
    from any thread.
    """

    def __init__(
        self,
        store: TrackerStore,
        config: TrackerConfig,
        clock: Callable[[], float] = time.time,
        issue_token: TokenIssuer | None = None,
        new_lease_id: Callable[[], str] = _new_id,
    ) -> None:
        """Create a pool over `store`; `start()` it on its loop before serving.

        Args:
            clock: seconds since the epoch; lease expiry and heartbeat age use it. Acquire waits
                and the startup grace use time.monotonic, the loop's own clock.
            issue_token: signs lease tokens; pass `tokens.hmac_issuer(lease_key)` for a pool
                whose agents verify them. None = `tokens.ephemeral_issuer()` (nobody can verify).
        """
        self.config = config
        self._store = store
        self._clock = clock
        self._issue_token = issue_token or ephemeral_issuer()
        self._new_lease_id = new_lease_id
        self._dispatch_task: asyncio.Task[None] | None = None
        self._dispatch_again = False
        self._queue = WaitQueue()
        self._closed = False
        self._background: set[asyncio.Task[Any]] = set()
        self._grace_ends = time.monotonic() + config.startup_grace_s
        # Agents are not judged silent until one agent timeout after this pool started: with a
        # store that outlived a restart (Redis), the tracker's own downtime is no agent's silence.
        self._silence_judged_from = self._clock() + config.agent_timeout_s

    async def start(self) -> None:
        """Listen to the store's announcements of changes by other processes (store.watch)."""
        await self._store.watch(self._on_store_change)

    async def register(
        self, agent_id: str, agent_address: str, devices: Sequence[DeviceSpec]
    ) -> Registered:
        """Replace the agent's devices; returns the heartbeat interval the agent must keep and
        each device's fence floor (see listing.fence_floors).

        Raises:
            InvalidArgument: see validation.registration.
            StoreUnavailable: the store cannot be reached.
        """
        registration = validation.registration(agent_id, agent_address, devices)
        now = self._clock()
        ended = await self._store.register(registration, now)
        _LOG.info(
            "agent %s at %s registered %d devices",
            registration.agent_id,
            registration.agent_address,
            len(registration.devices),
        )
        if ended:
            _LOG.warning("re-register of %s ended leases %s", registration.agent_id, ended)
        await self._dispatch()
        records = await self._store.devices_by_id([spec.device_id for spec in registration.devices])
        return Registered(self.config.heartbeat_interval_s, listing.fence_floors(records, now))

    async def heartbeat(self, agent_id: str) -> bool:
        """Record a heartbeat; False means the agent must register again."""
        if not agent_id:
            raise InvalidArgument("agent_id must not be empty")
        return await self._store.heartbeat(agent_id, self._clock())

    async def deregister(self, agent_id: str) -> int:
        """Remove the agent and all of its devices (an agent stopping gracefully); returns how
        many devices it had, 0 when the agent was unknown (not an error).

        Leases on those devices end at once, as when a device is lost: the holder's next Renew is
        answered DEVICE_LOST ("device lost: agent deregistered"). Queued requests stay queued for
        other devices; one that no registered device matches any more waits out its deadline and
        is answered NO_DEVICE then, like a request for LOST devices. A device registered again
        later gets fences above every one issued before (see TrackerStore.deregister).

        Raises:
            InvalidArgument: an empty or malformed agent_id.
            StoreUnavailable: the store cannot be reached.
        """
        validation.agent_id(agent_id)
        removed = await self._store.deregister(agent_id)
        if removed.ended_leases:
            _LOG.info(
                "agent %s deregistered %d devices, ending leases %s",
                agent_id,
                len(removed.devices),
                ", ".join(removed.ended_leases),
            )
        else:
            _LOG.info("agent %s deregistered %d devices", agent_id, len(removed.devices))
        return len(removed.devices)

    async def acquire(
        self, request: LeaseRequest, client_time_remaining_s: float | None = None
    ) -> AcquireResult:
        """Wait for a matching device: start_acquire, wait, then finish.

        Cancelling the call (its client left) drops the request from the queue at once, and a
        lease granted to it in the race is released.

        Args:
            client_time_remaining_s: see start_acquire.

        Raises:
            InvalidArgument: a malformed request.
            StoreUnavailable: the store cannot be reached.
        """
        started = await self._to_the_end(
            self.start_acquire(request, client_time_remaining_s), undo=self._undo_start
        )
        if isinstance(started, AcquireResult):
            return started
        try:
            await self._wait(started)
        except asyncio.CancelledError:
            self._unqueue(started)  # at once; abandon's store calls follow in the background
            self._spawn(self.abandon(started))
            raise
        return await self._to_the_end(self.finish(started), undo=self._undo_finish)

    async def _wait(self, waiter: Waiter) -> None:
        """Until the waiter is woken, its deadline passes, or the startup grace ends with its
        selector still unknown."""
        while True:
            timeout_s = waiter.wake_at - time.monotonic()
            if timeout_s > 0:
                # asyncio.wait leaves the future alone on a timeout or a cancellation.
                done, _ = await asyncio.wait((waiter.future,), timeout=timeout_s)
                if done:
                    return
            if not await self.grace_ended(waiter):
                return

    async def start_acquire(
        self, request: LeaseRequest, client_time_remaining_s: float | None = None
    ) -> AcquireResult | Waiter:
        """Answer an Acquire at once, or queue it and return its Waiter; never waits for a device.

        A request that no registered device matches (none with its key and tags, LOST ones
        included) is answered NO_DEVICE at once, "no registered device matches key=... tags=...",
        without queuing; during the startup grace it waits instead, until the grace ends. Matching
        devices that are all busy or LOST make it wait until its deadline.

        A request with a request_id that is still queued (this or an earlier tracker process
        queued it) takes over that place; a local call still waiting with that id is answered
        NO_DEVICE with REASON_SUPERSEDED. A call cut short by close() leaves its entry queued,
        so the client can re-attach to a restarted tracker.

        A Waiter's caller waits for `waiter.future` until `waiter.wake_at`, calls `grace_ended`
        when that was the end of the startup grace, and then `finish` (or `abandon` when its
        client left) exactly once; `acquire` does all that.

        Args:
            client_time_remaining_s: the RPC deadline, if the client set one; the wait never
                outlasts it, nor request.timeout_s, nor config.max_acquire_wait_s.

        Raises:
            InvalidArgument: a malformed request.
            StoreUnavailable: the store cannot be reached.
        """
        validation.lease_request(request)
        if len(request.request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidArgument(
                f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters, "
                f"got {len(request.request_id)}"
            )
        wait_s = min(request.timeout_s, self.config.max_acquire_wait_s)
        if client_time_remaining_s is not None:
            wait_s = min(wait_s, max(client_time_remaining_s, 0.0))
        deadline = time.monotonic() + wait_s
        if self._closed:
            return AcquireResult(None, REASON_SHUTTING_DOWN)
        if not request.request_id or wait_s <= 0:
            # A new arrival: one atomic grant that respects everything queued, no queue entry.
            lease = await self._grant(request)
            if lease is not None:
                return self._granted(lease)
            if wait_s <= 0:
                return AcquireResult(None, await self._no_device(request))
        # Past the grace, a selector nobody registered fails now; within it, it is checked again
        # when the grace ends, as if the request had arrived then.
        recheck_at: float | None = self._grace_ends
        if time.monotonic() >= self._grace_ends:
            recheck_at = None
            unregistered = await self._unregistered(request)
            if unregistered:
                return AcquireResult(None, unregistered)
        if not request.request_id:
            request = dataclasses.replace(request, request_id=_new_id())
        waiter = await self._enqueue(request, deadline, recheck_at)
        if waiter is None:
            return AcquireResult(None, REASON_SHUTTING_DOWN)
        return waiter

    async def grace_ended(self, waiter: Waiter) -> bool:
        """Called at `waiter.wake_at` without an answer: whether to keep waiting.

        True only at the end of the startup grace when the selector is now known (or a lease came
        meanwhile); False at the deadline, or when no registered device matches yet.
        """
        if waiter.recheck_at is None or time.monotonic() < waiter.recheck_at:
            return False
        waiter.recheck_at = None
        # Dispatch goes on while the store answers; a lease granted meanwhile wins.
        unknown = await self._still_unregistered(waiter.request)
        return not unknown or waiter.lease is not None

    async def finish(self, waiter: Waiter) -> AcquireResult:
        """Take an answered or timed-out waiter out of the queue and answer it."""
        lease, closed, superseded = await self._drop(waiter)
        if lease is not None:
            return self._granted(lease)
        if superseded:
            return AcquireResult(None, REASON_SUPERSEDED)
        return AcquireResult(
            None, REASON_SHUTTING_DOWN if closed else await self._no_device(waiter.request)
        )

    async def abandon(self, waiter: Waiter) -> AcquireResult:
        """Drop the waiter of a client that left: out of the queue at once, and a lease granted to
        it in the race released (the device goes to the next waiter)."""
        lease, _, _ = await self._drop(waiter)
        if lease is not None:
            await self.release(lease.lease_id)
        return AcquireResult(None, REASON_CANCELLED)

    async def _drop(self, waiter: Waiter) -> tuple[Lease | None, bool, bool]:
        """Remove `waiter` here and (unless granted, closed or superseded) from the store's queue;
        returns its lease, whether the pool closed, whether it was superseded.

        Out of the local queue and woken before the first await: a grant for it that a running
        dispatch is still waiting for is then released by that dispatch (see _dispatch_once).
        """
        lease, closed, superseded = self._unqueue(waiter)
        if lease is None and not closed and not superseded:
            await self._store.dequeue(waiter.request.request_id)
            await self._announce_queue_change()
        return lease, closed, superseded

    def _unqueue(self, waiter: Waiter) -> tuple[Lease | None, bool, bool]:
        """Take `waiter` out of the local queue and wake it; returns what _drop returns."""
        self._queue.remove(waiter)
        waiter.wake()
        return waiter.lease, self._closed, waiter.superseded

    async def renew(self, lease_id: str, lease_ttl_s: float = 0.0) -> Lease:
        """Extend a lease by `lease_ttl_s` (0 = default) from now, with a fresh token.

        Raises:
            LeaseLost: the lease is unknown or ended; its message is the reason.
        """
        validation.lease_id(lease_id)
        validation.non_negative_seconds("lease_ttl_s", lease_ttl_s)
        try:
            return await self._store.renew(
                lease_id, self._clock(), self._ttl(lease_ttl_s), self._issue_token
            )
        except LeaseLost:
            await self._dispatch()  # the renew may have ended an expired lease and freed its device
            raise

    async def release(self, lease_id: str) -> ReleaseResult:
        """End a lease; released=False with a reason when it was unknown or already ended."""
        validation.lease_id(lease_id)
        try:
            lease = await self._store.release(lease_id, self._clock())
        except LeaseLost as lost:
            await self._dispatch()
            return ReleaseResult(False, lost.reason)
        _LOG.debug("lease %s on %s released", lease_id, lease.device.device_id)
        if self._wanted_here(lease.device):
            await self._dispatch()
        return ReleaseResult(True)

    def _wanted_here(self, device: DeviceSpec) -> bool:
        """Whether a waiter of this process could take `device` (others learn of it through
        store.watch): 16 clients releasing a free key's devices do not dispatch 500 waiters of
        a busy one."""
        if not self._queue.may_want(device.key):
            return False
        return any(waiter.request.matches(device) for waiter in self._queue)

    async def list_devices(self, key: str = "") -> list[DeviceStatus]:
        """Every device with `key` ("" = all) with its state and the queued requests (of every
        replica) it could serve."""
        now = self._clock()
        records = await self._store.devices(key)
        shapes = await self._store.queued_shapes(now) if records else {}
        return listing.statuses(records, shapes, now)

    async def list_page(
        self, key: str = "", page_size: int = 0, page_token: str = ""
    ) -> DevicePage:
        """One page of `list_devices`: at most `page_size` devices (0 = the default) after the
        `page_token` a previous page returned ("" = from the first).

        Raises:
            InvalidArgument: a negative page_size or a page_token too long to be one.
        """
        size = listing.page_size(page_size)
        after = listing.check_page_token(page_token)
        now = self._clock()
        records = await self._store.devices(key, after, size + 1)
        shapes = await self._store.queued_shapes(now) if records else {}
        return DevicePage(
            listing.statuses(records[:size], shapes, now),
            listing.next_page_token(records, size),
        )

    async def reap(self) -> ExpiryReport:
        """Expire silent agents, lapsed leases, long-lost devices and abandoned queue entries;
        refresh this process's queue entries; then offer free devices to waiters."""
        now = self._clock()
        # Refresh first, so the sweep never drops a live waiter's entry.
        entries = [(waiter.ticket, waiter.request) for waiter in self._queue]
        if entries:
            await self._store.keep_queued(entries, now, self.config.queued_request_ttl_s)
        # (1e12 s, not inf: the Redis store's Lua reads the number from a string)
        agent_timeout_s = self.config.agent_timeout_s if now >= self._silence_judged_from else 1e12
        report = await self._store.expire(now, agent_timeout_s, self.config.lost_device_retention_s)
        for agent_id in report.expired_agents:
            _LOG.warning("agent %s stopped heartbeating; its devices are LOST", agent_id)
        if report.pruned_devices:
            _LOG.info("forgot devices lost for too long: %s", ", ".join(report.pruned_devices))
        if report.changed or entries:
            # With waiters, dispatch on every sweep: the bounded poll behind store.watch.
            await self._dispatch()
        return report

    @property
    def waiting(self) -> int:
        """Number of Acquire requests waiting in this process."""
        return len(self._queue)

    async def close(self) -> None:
        """Refuse new Acquires and answer waiting ones with REASON_SHUTTING_DOWN; the store stays
        open and keeps their queue entries until they expire, for clients to re-attach elsewhere."""
        self._closed = True
        for waiter in self._queue:
            waiter.wake()

    def _ttl(self, requested_s: float) -> float:
        if requested_s <= 0:
            return self.config.default_lease_ttl_s
        return min(requested_s, self.config.max_lease_ttl_s)

    async def _grant(self, request: LeaseRequest, waiter: Waiter | None = None) -> Lease | None:
        return await self._store.grant(
            request,
            self._new_lease_id(),
            self._clock(),
            self._ttl(request.lease_ttl_s),
            self._issue_token,
            waiter.ticket if waiter is not None else None,
        )

    def _granted(self, lease: Lease) -> AcquireResult:
        _LOG.debug("lease %s on %s to %r", lease.lease_id, lease.device.device_id, lease.user)
        return AcquireResult(lease)

    async def _enqueue(
        self, request: LeaseRequest, deadline: float, recheck_at: float | None
    ) -> Waiter | None:
        """Put `request` in the store's queue and in the local one; None once closed."""
        ticket = await self._store.enqueue(request, self._clock(), self.config.queued_request_ttl_s)
        if self._closed:
            return None
        waiter = Waiter(request, ticket, deadline, recheck_at)
        previous = self._queue.find(ticket.request_id)
        if previous is not None:
            previous.superseded = True
            self._queue.remove(previous)
            previous.wake()
        self._queue.push(waiter)
        await self._dispatch()
        return waiter

    def _on_store_change(self, freed_key: str | None = None) -> None:
        if self._closed:
            return
        if freed_key is not None and not self._queue.may_want(freed_key):
            return  # a device no waiter here could take
        self._spawn(self._dispatch())

    async def _announce_queue_change(self) -> None:
        """A request left the queue: waiters it blocked (here) may now be served."""
        await self._dispatch()

    async def _dispatch(self) -> None:
        """Offer free devices to the waiters; one dispatch at a time, the others do not wait.

        Every release, register and store event asks for a dispatch, and each costs the store a
        grant attempt per waiting shape (a round trip to Redis). Asked while one runs, a dispatch
        only marks the pool dirty and returns: the running one goes round again. So callers never
        queue behind each other's round trips, and a burst of releases costs a few dispatches, not
        one each. The dispatch runs in a task of its own: its caller waits for it, but cancelling
        the caller (its client left) does not cut a grant in half.
        """
        if self._dispatch_task is not None:
            self._dispatch_again = True
            return
        task = asyncio.create_task(self._dispatch_rounds())
        self._dispatch_task = task
        task.add_done_callback(_retrieve)
        await asyncio.shield(task)

    async def _dispatch_rounds(self) -> None:
        try:
            while True:
                self._dispatch_again = False
                await self._dispatch_once()
                if not self._dispatch_again:
                    return
        finally:
            self._dispatch_task = None

    async def _dispatch_once(self) -> None:
        if not len(self._queue):
            return
        failed: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        try:
            for waiter in self._queue:
                if waiter.future.done():
                    continue  # answered meanwhile (dropped, superseded, the pool closed)
                request = waiter.request
                # A request like one that just failed, and later in the queue, fails too.
                shape = (request.key, tuple(sorted(request.tag_selector.items())))
                if shape in failed:
                    continue
                lease = await self._grant(request, waiter)
                if lease is None:
                    failed.add(shape)
                    continue
                if waiter.future.done():
                    # Its call ended while the grant was on its way: the device goes back.
                    await self._give_back(lease)
                    continue
                waiter.lease = lease
                self._queue.remove(waiter)
                waiter.wake()
        except StoreUnavailable as error:
            # The next reap dispatches again; the caller's own transition already happened.
            _LOG.warning("dispatch stopped: %s", error)

    async def _give_back(self, lease: Lease) -> None:
        """Release a lease granted to a waiter that left, and go round once more."""
        with contextlib.suppress(LeaseLost):
            await self._store.release(lease.lease_id, self._clock())
        self._dispatch_again = True

    async def _no_device(self, request: LeaseRequest) -> str:
        """Why `request` got no device. Live devices are looked at first; LOST ones (a pool may
        hold thousands of a dead rack's) only when no live device matches."""
        live_records = await self._store.live_devices(request.key)
        live = sum(1 for r in live_records if request.matches(r.spec))
        if live:
            return f"all {live} matching devices busy"
        lost = sum(1 for r in await self._store.devices(request.key) if request.matches(r.spec))
        if lost:
            return f"no live device matches {_wanted(request)}: all {lost} matching devices lost"
        return _no_registered(request)

    async def _unregistered(self, request: LeaseRequest) -> str:
        """The NO_DEVICE reason when no known device (in any state) matches `request`, else "".
        LOST devices are looked at only when no live device matches."""
        if any(request.matches(r.spec) for r in await self._store.live_devices(request.key)):
            return ""
        if any(request.matches(r.spec) for r in await self._store.devices(request.key)):
            return ""
        return _no_registered(request)

    async def _still_unregistered(self, request: LeaseRequest) -> bool:
        """Whether a waiter's selector is still unknown. A store that cannot answer counts as
        known (keep waiting): raising here would leave the waiter behind in the local queue."""
        try:
            return bool(await self._unregistered(request))
        except StoreUnavailable as error:
            _LOG.warning("could not check registrations for %s: %s", request.request_id, error)
            return False

    async def queue_depths(self) -> dict[str, int]:
        """Queued Acquire requests of every replica per requested key ("" = any key / tags only)."""
        depths: dict[str, int] = {}
        for _, request in await self._store.queued(self._clock()):
            depths[request.key] = depths.get(request.key, 0) + 1
        return depths

    async def _to_the_end(
        self,
        coroutine: Coroutine[Any, Any, _T],
        undo: Callable[[_T], Coroutine[Any, Any, Any]],
    ) -> _T:
        """Await `coroutine`; if the caller is cancelled meanwhile, it still runs to its end in
        a task of its own, and `undo` gets its result then (a lease or waiter nobody will take)."""
        task = asyncio.ensure_future(coroutine)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(functools.partial(self._undo_when_done, undo))
            raise

    def _undo_when_done(
        self, undo: Callable[[_T], Coroutine[Any, Any, Any]], task: asyncio.Future[_T]
    ) -> None:
        if not task.cancelled() and task.exception() is None:
            self._spawn(undo(task.result()))

    async def _undo_start(self, started: AcquireResult | Waiter) -> None:
        """start_acquire finished for a client that had left: drop its waiter or lease."""
        if isinstance(started, Waiter):
            await self.abandon(started)
        elif started.lease is not None:
            await self.release(started.lease.lease_id)

    async def _undo_finish(self, result: AcquireResult) -> None:
        if result.lease is not None:
            await self.release(result.lease.lease_id)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run `coroutine` in the background (a reference kept until it ends); errors are logged."""
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Log what a background task raised (StoreUnavailable as a warning), so nothing is lost."""
    if task.cancelled():
        return
    error = task.exception()
    if isinstance(error, StoreUnavailable):
        _LOG.warning("background store call failed: %s", error)
    elif error is not None:
        _LOG.error("background pool call failed", exc_info=error)

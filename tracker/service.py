"""The Tracker gRPC servicer (grpc.aio): unpack with serde, call the DevicePool, map errors to codes.

InvalidArgument    -> INVALID_ARGUMENT with the message naming the field
LeaseLost          -> Renew: status DEVICE_LOST with the reason (a result, not an RPC error)
StoreUnavailable   -> UNAVAILABLE with the reason; clients retry (Acquire with the same request)
shutting down      -> Acquire: UNAVAILABLE "tracker shutting down", so the client retries
anything else      -> INTERNAL, logged with its traceback; the server keeps serving

The pool is synchronous; `PoolCalls` decides where its calls run. A waiting Acquire holds no
thread: it awaits its waiter's future. When its client leaves, gRPC cancels the handler: the waiter
is dropped at once, and a lease granted to it in the race is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import grpc

from protos import tracker_pb2_grpc
from protos.ratelimit import RateLimitedLog
from tracker import serde
from tracker.config import TrackerConfig
from tracker.errors import InvalidArgument, LeaseLost, StoreUnavailable
from tracker.model import AcquireResult, LeaseRequest
from tracker.pool import REASON_SHUTTING_DOWN, DevicePool
from tracker.waitqueue import Waiter

_LOG = logging.getLogger(__name__)
# Rejected calls cost a few log lines per method and window, however many arrive.
_REJECTED = RateLimitedLog(_LOG)

# An Acquire gives up this long before the client's deadline, so the client gets NO_DEVICE with a
# reason instead of a bare DEADLINE_EXCEEDED.
_REPLY_MARGIN_S = 0.1

_T = TypeVar("_T")
_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


class _ShuttingDown(Exception):
    """This tracker is stopping; the call is answered UNAVAILABLE so the client retries."""


class AcquireObserver(Protocol):
    """Told how long each Acquire waited and whether it got a lease (tracker.metrics)."""

    def observe_acquire(self, wait_s: float, granted: bool) -> None: ...


class PoolCalls:
    """Runs the pool's synchronous calls for the servicer, inline or on bounded thread pools.

    With `inline` (a store that never blocks: memory takes only short in-process locks) agents'
    and clients' calls run on the event loop, which saves the thread hop. Otherwise (redis does
    network I/O) agents' calls run on `config.agent_workers` threads of their own, so no flood of
    client calls can delay a heartbeat, and clients' calls on `config.client_workers` threads.
    Listings run on the client threads with either store: they cost CPU in proportion to devices
    times queued requests, which must not stall the loop.
    """

    def __init__(self, config: TrackerConfig, inline: bool) -> None:
        self._inline = inline
        self._agent: ThreadPoolExecutor | None = None
        if not inline:
            self._agent = ThreadPoolExecutor(
                config.agent_workers, thread_name_prefix="kiln-tracker-agent"
            )
        self._client = ThreadPoolExecutor(
            config.client_workers, thread_name_prefix="kiln-tracker-client"
        )

    async def agent(self, call: Callable[..., _T], *args: Any) -> _T:
        """`call(*args)` for an agent's RPC."""
        return await self._run(self._agent, call, args)

    async def client(
        self, call: Callable[..., _T], *args: Any, undo: Callable[[_T], Any] | None = None
    ) -> _T:
        """`call(*args)` for a client's RPC; if the RPC is cancelled while the call runs on a
        thread, `undo` gets its result once it is there (in the background)."""
        return await self._run(None if self._inline else self._client, call, args, undo)

    async def listing(self, call: Callable[..., _T], *args: Any) -> _T:
        """`call(*args)` for a listing, always on a client thread."""
        return await self._run(self._client, call, args)

    def background(self, call: Callable[..., Any], *args: Any) -> None:
        """`call(*args)` without waiting for it; an error is logged."""
        if not self._inline:
            with contextlib.suppress(RuntimeError):  # shut down: run it here instead
                self._client.submit(_logged, call, *args)
                return
        _logged(call, *args)

    def shutdown(self) -> None:
        """Wait for running calls to end and drop queued ones. Idempotent."""
        for executor in (self._agent, self._client):
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)

    async def _run(
        self,
        executor: ThreadPoolExecutor | None,
        call: Callable[..., _T],
        args: tuple[Any, ...],
        undo: Callable[[_T], Any] | None = None,
    ) -> _T:
        if executor is None:
            return call(*args)
        future = asyncio.get_running_loop().run_in_executor(executor, call, *args)
        if undo is None:
            return await future
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(functools.partial(self._undo_when_done, undo))
            raise

    def _undo_when_done(self, undo: Callable[[_T], Any], future: asyncio.Future[_T]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.background(undo, future.result())


def _logged(call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except Exception:
        _LOG.exception("%s failed", getattr(call, "__name__", call))


def _guarded(method: _Method) -> _Method:
    """Turn domain errors into gRPC status codes and keep unexpected ones from escaping raw."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: TrackerService, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except InvalidArgument as error:
            _REJECTED.log(name, logging.INFO, "%s rejected: %s", name, error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except StoreUnavailable as error:
            _REJECTED.log(f"{name} unavailable", logging.WARNING, "%s unavailable: %s", name, error)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"tracker store unavailable: {error}")
        except _ShuttingDown as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        except Exception as error:
            _LOG.exception("%s failed", name)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"{name} failed: {type(error).__name__}: {error}"
            )

    return wrapper  # type: ignore[return-value]


class TrackerService(tracker_pb2_grpc.TrackerServicer):
    """Serves the Tracker RPCs of protos/tracker.proto from one DevicePool."""

    def __init__(
        self, pool: DevicePool, calls: PoolCalls, observer: AcquireObserver | None = None
    ) -> None:
        self._pool = pool
        self._calls = calls
        self._observer = observer

    @_guarded
    async def Register(self, request: Any, context: Any) -> Any:
        registered = await self._calls.agent(self._pool.register, *serde.register_args(request))
        return serde.register_response(registered)

    @_guarded
    async def Heartbeat(self, request: Any, context: Any) -> Any:
        known = await self._calls.agent(self._pool.heartbeat, request.agent_id)
        return serde.heartbeat_response(known)

    @_guarded
    async def Deregister(self, request: Any, context: Any) -> Any:
        removed = await self._calls.agent(self._pool.deregister, request.agent_id)
        return serde.deregister_response(removed)

    @_guarded
    async def Acquire(self, request: Any, context: Any) -> Any:
        started = time.monotonic()
        lease_request = serde.lease_request_from_proto(request)
        try:
            result = await self._acquire(lease_request, _time_remaining(context))
        except asyncio.CancelledError:  # the client left
            self._observe(started, granted=False)
            raise
        self._observe(started, result.lease is not None)
        if result.lease is None and result.reason == REASON_SHUTTING_DOWN:
            # Not "no device": this tracker is going away. UNAVAILABLE tells the client to retry
            # (with the same request_id, which keeps its place in a durable store's queue).
            raise _ShuttingDown(REASON_SHUTTING_DOWN)
        return serde.acquire_response(result)

    @_guarded
    async def Renew(self, request: Any, context: Any) -> Any:
        try:
            lease = await self._calls.client(
                self._pool.renew, request.lease_id, request.lease_ttl_s
            )
        except LeaseLost as lost:
            return serde.renew_lost(lost.reason)
        return serde.renew_response(lease)

    @_guarded
    async def Release(self, request: Any, context: Any) -> Any:
        result = await self._calls.client(self._pool.release, request.lease_id)
        return serde.release_response(result)

    @_guarded
    async def ListDevices(self, request: Any, context: Any) -> Any:
        page = await self._calls.listing(
            self._pool.list_page, request.key, request.page_size, request.page_token
        )
        return serde.list_devices_response(page)

    async def _acquire(
        self, request: LeaseRequest, client_time_remaining_s: float | None
    ) -> AcquireResult:
        started = await self._calls.client(
            self._pool.start_acquire, request, client_time_remaining_s, undo=self._undo_start
        )
        if isinstance(started, AcquireResult):
            return started
        try:
            await self._wait(started)
        except asyncio.CancelledError:
            self._calls.background(self._pool.abandon, started)
            raise
        return await self._calls.client(self._pool.finish, started, undo=self._undo_finish)

    async def _wait(self, waiter: Waiter) -> None:
        """Until the waiter is woken, its deadline passes, or the startup grace ends with its
        selector still unknown."""
        woken = asyncio.wrap_future(waiter.future)
        try:
            while True:
                timeout_s = waiter.wake_at - time.monotonic()
                if timeout_s > 0:
                    done, _ = await asyncio.wait((woken,), timeout=timeout_s)
                    if done:
                        return
                if not await self._calls.client(self._pool.grace_ended, waiter):
                    return
        finally:
            woken.cancel()

    def _undo_start(self, started: AcquireResult | Waiter) -> None:
        """start_acquire finished for a client that had left: drop its waiter or lease."""
        if isinstance(started, Waiter):
            self._pool.abandon(started)
        elif started.lease is not None:
            self._pool.release(started.lease.lease_id)

    def _undo_finish(self, result: AcquireResult) -> None:
        if result.lease is not None:
            self._pool.release(result.lease.lease_id)

    def _observe(self, started: float, granted: bool) -> None:
        if self._observer is not None:
            self._observer.observe_acquire(time.monotonic() - started, granted)


def _time_remaining(context: Any) -> float | None:
    """Seconds left before the client's deadline, less the reply margin; None without one."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return float(remaining) - _REPLY_MARGIN_S

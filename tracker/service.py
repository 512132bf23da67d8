"""The Tracker gRPC servicer (grpc.aio): unpack with serde, call the DevicePool, map errors to codes.

InvalidArgument    -> INVALID_ARGUMENT with the message naming the field
LeaseLost          -> Renew: status DEVICE_LOST with the reason (a result, not an RPC error)
StoreUnavailable   -> UNAVAILABLE with the reason; clients retry (Acquire with the same request)
shutting down      -> Acquire: UNAVAILABLE "tracker shutting down", so the client retries
anything else      -> INTERNAL, logged with its traceback; the server keeps serving

Every handler awaits the pool on the event loop, and the pool awaits its store there too (see
tracker.pool): no call hops to a thread, so none waits for a worker or for the GIL behind others.
A waiting Acquire is a suspended coroutine. When its client leaves, gRPC cancels the handler: the
waiter is dropped at once, and a lease granted to it in the race is released.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc

from protos import tracker_pb2_grpc
from protos.ratelimit import RateLimitedLog
from tracker import serde
from tracker.errors import InvalidArgument, LeaseLost, StoreUnavailable
from tracker.pool import REASON_SHUTTING_DOWN, DevicePool

_LOG = logging.getLogger(__name__)
# Rejected calls cost a few log lines per method and window, however many arrive.
_REJECTED = RateLimitedLog(_LOG)

# An Acquire gives up this long before the client's deadline, so the client gets NO_DEVICE with a
# reason instead of a bare DEADLINE_EXCEEDED.
_REPLY_MARGIN_S = 0.1

_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


class _ShuttingDown(Exception):
    """This tracker is stopping; the call is answered UNAVAILABLE so the client retries."""


class AcquireObserver(Protocol):
    """Told how long each Acquire waited and whether it got a lease (tracker.metrics)."""

    def observe_acquire(self, wait_s: float, granted: bool) -> None: ...


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

    def __init__(self, pool: DevicePool, observer: AcquireObserver | None = None) -> None:
        self._pool = pool
        self._observer = observer

    @_guarded
    async def Register(self, request: Any, context: Any) -> Any:
        registered = await self._pool.register(*serde.register_args(request))
        return serde.register_response(registered)

    @_guarded
    async def Heartbeat(self, request: Any, context: Any) -> Any:
        known = await self._pool.heartbeat(request.agent_id)
        return serde.heartbeat_response(known)

    @_guarded
    async def Deregister(self, request: Any, context: Any) -> Any:
        removed = await self._pool.deregister(request.agent_id)
        return serde.deregister_response(removed)

    @_guarded
    async def Acquire(self, request: Any, context: Any) -> Any:
        started = time.monotonic()
        lease_request = serde.lease_request_from_proto(request)
        try:
            result = await self._pool.acquire(lease_request, _time_remaining(context))
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
            lease = await self._pool.renew(request.lease_id, request.lease_ttl_s)
        except LeaseLost as lost:
            return serde.renew_lost(lost.reason)
        return serde.renew_response(lease)

    @_guarded
    async def Release(self, request: Any, context: Any) -> Any:
        result = await self._pool.release(request.lease_id)
        return serde.release_response(result)

    @_guarded
    async def ListDevices(self, request: Any, context: Any) -> Any:
        page = await self._pool.list_page(request.key, request.page_size, request.page_token)
        return serde.list_devices_response(page)

    def _observe(self, started: float, granted: bool) -> None:
        if self._observer is not None:
            self._observer.observe_acquire(time.monotonic() - started, granted)


def _time_remaining(context: Any) -> float | None:
    """Seconds left before the client's deadline, less the reply margin; None without one."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return float(remaining) - _REPLY_MARGIN_S

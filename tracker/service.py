"""The Tracker gRPC servicer: unpack with serde, call the DevicePool, map errors to status codes.

InvalidArgument    -> INVALID_ARGUMENT with the message naming the field
LeaseLost          -> Renew: status DEVICE_LOST with the reason (a result, not an RPC error)
StoreUnavailable   -> UNAVAILABLE with the reason; clients retry (Acquire with the same request)
shutting down      -> Acquire: UNAVAILABLE "tracker shutting down", so the client retries
anything else      -> INTERNAL, logged with its traceback; the server keeps serving
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import grpc

from protos import tracker_pb2_grpc
from tracker import serde
from tracker.errors import InvalidArgument, LeaseLost, StoreUnavailable
from tracker.pool import REASON_SHUTTING_DOWN, DevicePool

_LOG = logging.getLogger(__name__)

# An Acquire gives up this long before the client's deadline, so the client gets NO_DEVICE with a
# reason instead of a bare DEADLINE_EXCEEDED.
_REPLY_MARGIN_S = 0.1

_Method = TypeVar("_Method", bound=Callable[..., Any])


class _ShuttingDown(Exception):
    """This tracker is stopping; the call is answered UNAVAILABLE so the client retries."""


class AcquireObserver(Protocol):
    """Told how long each Acquire waited and whether it got a lease (tracker.metrics)."""

    def observe_acquire(self, wait_s: float, granted: bool) -> None: ...


def _guarded(method: _Method) -> _Method:
    """Turn domain errors into gRPC status codes and keep unexpected ones from escaping raw."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: TrackerService, request: Any, context: Any) -> Any:
        try:
            return method(self, request, context)
        except InvalidArgument as error:
            _LOG.info("%s rejected: %s", name, error)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except StoreUnavailable as error:
            _LOG.warning("%s unavailable: %s", name, error)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"tracker store unavailable: {error}")
        except _ShuttingDown as error:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        except Exception as error:
            _LOG.exception("%s failed", name)
            context.abort(
                grpc.StatusCode.INTERNAL, f"{name} failed: {type(error).__name__}: {error}"
            )

    return wrapper  # type: ignore[return-value]


class TrackerService(tracker_pb2_grpc.TrackerServicer):
    """Serves the Tracker RPCs of protos/tracker.proto from one DevicePool."""

    def __init__(self, pool: DevicePool, observer: AcquireObserver | None = None) -> None:
        self._pool = pool
        self._observer = observer

    @_guarded
    def Register(self, request: Any, context: Any) -> Any:
        interval_s = self._pool.register(*serde.register_args(request))
        return serde.register_response(interval_s)

    @_guarded
    def Heartbeat(self, request: Any, context: Any) -> Any:
        return serde.heartbeat_response(self._pool.heartbeat(request.agent_id))

    @_guarded
    def Acquire(self, request: Any, context: Any) -> Any:
        cancelled = threading.Event()

        def on_rpc_done() -> None:
            # Fires on cancel, deadline and normal completion alike; after completion it is a no-op.
            cancelled.set()
            self._pool.wake()

        if not context.add_callback(on_rpc_done):
            cancelled.set()  # the RPC already ended
        started = time.monotonic()
        result = self._pool.acquire(
            serde.lease_request_from_proto(request),
            cancelled=cancelled,
            client_time_remaining_s=_time_remaining(context),
        )
        if self._observer is not None:
            self._observer.observe_acquire(time.monotonic() - started, result.lease is not None)
        if result.lease is None and result.reason == REASON_SHUTTING_DOWN:
            # Not "no device": this tracker is going away. UNAVAILABLE tells the client to retry
            # (with the same request_id, which keeps its place in a durable store's queue).
            raise _ShuttingDown(REASON_SHUTTING_DOWN)
        return serde.acquire_response(result)

    @_guarded
    def Renew(self, request: Any, context: Any) -> Any:
        try:
            lease = self._pool.renew(request.lease_id, request.lease_ttl_s)
        except LeaseLost as lost:
            return serde.renew_lost(lost.reason)
        return serde.renew_response(lease)

    @_guarded
    def Release(self, request: Any, context: Any) -> Any:
        return serde.release_response(self._pool.release(request.lease_id))

    @_guarded
    def ListDevices(self, request: Any, context: Any) -> Any:
        return serde.list_devices_response(self._pool.list_devices(request.key))


def _time_remaining(context: Any) -> float | None:
    """Seconds left before the client's deadline, less the reply margin; None without one."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return float(remaining) - _REPLY_MARGIN_S

"""The Tracker gRPC servicer: unpack with serde, call the DevicePool, map errors to status codes.

InvalidArgument    -> INVALID_ARGUMENT with the message naming the field
LeaseLost          -> Renew: status DEVICE_LOST with the reason (a result, not an RPC error)
anything else      -> INTERNAL, logged with its traceback; the server keeps serving
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from protos import tracker_pb2_grpc
from tracker import serde
from tracker.errors import InvalidArgument, LeaseLost
from tracker.pool import DevicePool

_LOG = logging.getLogger(__name__)

# An Acquire gives up this long before the client's deadline, so the client gets NO_DEVICE with a
# reason instead of a bare DEADLINE_EXCEEDED.
_REPLY_MARGIN_S = 0.1

_Method = TypeVar("_Method", bound=Callable[..., Any])


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
        except Exception as error:
            _LOG.exception("%s failed", name)
            context.abort(
                grpc.StatusCode.INTERNAL, f"{name} failed: {type(error).__name__}: {error}"
            )

    return wrapper  # type: ignore[return-value]


class TrackerService(tracker_pb2_grpc.TrackerServicer):
    """Serves the Tracker RPCs of protos/tracker.proto from one DevicePool."""

    def __init__(self, pool: DevicePool) -> None:
        self._pool = pool

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
        result = self._pool.acquire(
            serde.lease_request_from_proto(request),
            cancelled=cancelled,
            client_time_remaining_s=context.time_remaining() - _REPLY_MARGIN_S,
        )
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

"""The gRPC servicer: unpack a request, call the agent, map its errors to status codes."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from device_agent import serde
from device_agent.agent import Agent
from device_agent.errors import (
    AgentError,
    ArtifactTooLargeError,
    HashMismatchError,
    InvalidRequestError,
    TruncatedUploadError,
    UnknownDeviceError,
)
from protos import agent_pb2, agent_pb2_grpc, common_pb2

_LOG = logging.getLogger(__name__)

_CODES: tuple[tuple[type[AgentError], grpc.StatusCode], ...] = (
    (UnknownDeviceError, grpc.StatusCode.NOT_FOUND),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (ArtifactTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (HashMismatchError, grpc.StatusCode.DATA_LOSS),
    (TruncatedUploadError, grpc.StatusCode.DATA_LOSS),
)

_F = TypeVar("_F", bound=Callable[..., Any])


def _mapped(method: _F) -> _F:
    """Turn the agent's errors into the RPC's status code and message."""

    @functools.wraps(method)
    def wrapper(self: AgentServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except AgentError as e:
            code = next((c for t, c in _CODES if isinstance(e, t)), grpc.StatusCode.INTERNAL)
            context.abort(code, str(e))

    return wrapper  # type: ignore[return-value]


def _cancel_event(context: grpc.ServicerContext) -> threading.Event:
    """An event set when the RPC ends, so a cancelled client stops its measurement."""
    event = threading.Event()
    context.add_callback(event.set)
    return event


class AgentServicer(agent_pb2_grpc.AgentServicer):
    """kiln.v1.Agent over an `Agent`."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    @_mapped
    def Upload(
        self, request_iterator: Iterator[agent_pb2.UploadChunk], context: grpc.ServicerContext
    ) -> agent_pb2.UploadResponse:
        first = next(request_iterator, None)
        if first is None or not first.HasField("meta"):
            raise InvalidRequestError("the first upload chunk must carry the ArtifactMeta")
        pending = self._agent.begin_upload(serde.meta_from_pb(first.meta))
        stored = None
        try:
            pending.write(first.data)
            for chunk in request_iterator:
                pending.write(chunk.data)
            stored = pending.commit()
        except grpc.RpcError:
            # The client cancelled or vanished mid-stream; nobody is left to read an answer.
            _LOG.info("upload of %s cut short by the client; nothing stored", first.meta.sha256)
            return agent_pb2.UploadResponse()
        finally:
            if stored is None:
                # Rejected, or the client went away mid-stream: keep nothing.
                pending.abort()
        return agent_pb2.UploadResponse(
            sha256=stored.meta.sha256, size_bytes=stored.meta.size_bytes
        )

    @_mapped
    def Has(
        self, request: agent_pb2.HasRequest, context: grpc.ServicerContext
    ) -> agent_pb2.HasResponse:
        return agent_pb2.HasResponse(present=self._agent.has(request.sha256))

    @_mapped
    def Measure(
        self, request: agent_pb2.MeasureRequest, context: grpc.ServicerContext
    ) -> common_pb2.MeasureResult:
        result = self._agent.measure(serde.measure_request_from_pb(request), _cancel_event(context))
        return serde.measure_result_to_pb(result)

    @_mapped
    def Run(
        self, request: agent_pb2.RunRequest, context: grpc.ServicerContext
    ) -> agent_pb2.RunResponse:
        result = self._agent.run(serde.run_request_from_pb(request), _cancel_event(context))
        return serde.run_result_to_pb(result)

    @_mapped
    def Info(
        self, request: agent_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> agent_pb2.InfoResponse:
        return serde.info_to_pb(self._agent.info())

"""Strict request decoding: bytes that are not a valid request get INVALID_ARGUMENT with the reason.

gRPC Python decodes a request before the servicer runs; when that fails it answers a bare INTERNAL
"Exception deserializing request!" and keeps ~16-19 KB per call. Both daemons serve with grpc.aio,
and `AsyncStrictDecoding` (after their token check) takes the decoding over for every kind of
handler, streaming ones and the health service included: a malformed message is the client's
error (INVALID_ARGUMENT, naming the method and what the protobuf parser said), never reaches the
servicer, and costs nothing that stays.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio

from protos.ratelimit import RateLimitedLog

_LOG = logging.getLogger(__name__)


class Malformed:
    """What a safe deserializer returns for bytes that are not a valid message."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def safe_deserializer(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`decode` that returns a Malformed instead of raising, so gRPC never sees a decode error."""

    def safe(raw: bytes) -> Any:
        try:
            return decode(raw)
        except Exception as error:
            return Malformed(f"{type(error).__name__}: {error}")

    return safe


class AsyncStrictDecoding(grpc.aio.ServerInterceptor):
    """The asyncio servers' strict decoding, for every kind of handler (streaming ones included).

    grpcio keeps ~16-19 KB per call whose request it cannot decode. Here the deserializer never
    raises: it returns a Malformed, and the wrapped behavior aborts the call with INVALID_ARGUMENT
    naming the method, before the servicer sees anything. Rejections are logged rate-limited.
    """

    def __init__(self, log: logging.Logger = _LOG) -> None:
        self._log = RateLimitedLog(log)

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        """Wrap handlers that have a request deserializer; pass the others on."""
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        safe = safe_deserializer(handler.request_deserializer)
        if handler.unary_unary is not None:
            return handler._replace(
                request_deserializer=safe, unary_unary=self._unary(method, handler.unary_unary)
            )
        if handler.unary_stream is not None:
            return handler._replace(
                request_deserializer=safe, unary_stream=self._unary(method, handler.unary_stream)
            )
        if handler.stream_unary is not None:
            return handler._replace(
                request_deserializer=safe, stream_unary=self._stream(method, handler.stream_unary)
            )
        return handler._replace(
            request_deserializer=safe, stream_stream=self._stream(method, handler.stream_stream)
        )

    async def _reject(self, method: str, malformed: Malformed, context: Any) -> None:
        self._log.log(
            method,
            logging.INFO,
            "malformed %s request from %s: %s",
            method,
            context.peer(),
            malformed.reason,
        )
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"malformed request to {method}: {malformed.reason}"
        )

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def decoded(request: Any, context: Any) -> Any:
            if isinstance(request, Malformed):
                await self._reject(method, request, context)
            return await _settled(behavior(request, context), context)

        return decoded

    def _stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def decoded(requests: Any, context: Any) -> Any:
            async def checked() -> AsyncIterator[Any]:
                async for request in requests:
                    if isinstance(request, Malformed):
                        await self._reject(method, request, context)
                    yield request

            return await _settled(behavior(checked(), context), context)

        return decoded


async def _settled(outcome: Any, context: Any) -> Any:
    """The response of a handler's call: awaited when a coroutine, written out when a stream."""
    if hasattr(outcome, "__aiter__"):
        async for response in outcome:
            await context.write(response)
        return None
    if inspect.isawaitable(outcome):
        return await outcome
    return outcome

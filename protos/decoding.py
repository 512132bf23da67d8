"""Strict request decoding: bytes that are not a valid request get INVALID_ARGUMENT with the reason.

gRPC Python decodes a request before the servicer runs and answers a decode failure with a bare
INTERNAL "Exception deserializing request!". This interceptor takes the decoding over for unary
calls, so a malformed message is the client's error (INVALID_ARGUMENT, naming the method and what
the protobuf parser said) and never reaches the servicer. Both daemons use it (tracker and
agent), after their token check.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

_LOG = logging.getLogger(__name__)


class StrictDecoding(grpc.ServerInterceptor):
    """Decodes unary requests itself and rejects undecodable ones with INVALID_ARGUMENT."""

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        """Wrap unary-unary handlers that have a request deserializer; pass the others on."""
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        decode = handler.request_deserializer
        behavior = handler.unary_unary

        def decoded(raw: bytes, context: Any) -> Any:
            try:
                request = decode(raw)
            except Exception as error:
                _LOG.info("malformed %s request from %s: %s", method, context.peer(), error)
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"malformed request to {method}: {type(error).__name__}: {error}",
                )
            return behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            decoded, response_serializer=handler.response_serializer
        )

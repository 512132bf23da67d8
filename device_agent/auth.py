"""Bearer-token auth for the agent's gRPC server.

With pool secrets, every call to `kiln.v1.Agent` (Upload, Has, Measure, Run, Info) must carry
`authorization: Bearer <token>` (see protos.auth) of the `client` or `admin` role. A missing or
unknown token is answered UNAUTHENTICATED; a known token of another role (the `agent` token, say)
PERMISSION_DENIED. Rejections are logged with the method, the peer and the role, never the token.
The standard health service is exempt so a deploy script can probe an agent without a token.
Measure and Run are checked a second time, inside the agent, for the lease (see `leases`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from protos.auth import PoolSecrets, Role, token_from_metadata

_LOG = logging.getLogger(__name__)

_AGENT_SERVICE = "/kiln.v1.Agent/"
_EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)
_ALLOWED = frozenset({Role.CLIENT, Role.ADMIN})


class AgentAuthInterceptor(grpc.ServerInterceptor):
    """Lets through calls whose bearer token is the client's or the admin's."""

    def __init__(self, secrets: PoolSecrets) -> None:
        self._secrets = secrets

    def verdict(self, method: str, metadata: object) -> tuple[grpc.StatusCode, str] | None:
        """None when the call may proceed, else (code, message for the caller)."""
        if method.startswith(_EXEMPT_PREFIXES):
            return None
        token = token_from_metadata(metadata)
        if token is None:
            return grpc.StatusCode.UNAUTHENTICATED, "missing bearer token"
        role = self._secrets.role_of(token)
        if role is None:
            return grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token"
        if role in _ALLOWED and method.startswith(_AGENT_SERVICE):
            return None
        if role is Role.ADMIN:
            return None
        return (
            grpc.StatusCode.PERMISSION_DENIED,
            f"role '{role.value}' may not call {method} (needs admin or client)",
        )

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        """Pass allowed calls on; answer the others with a handler that logs and aborts."""
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        verdict = self.verdict(method, handler_call_details.invocation_metadata)
        if verdict is None:
            return handler
        code, message = verdict

        def reject(request: Any, context: grpc.ServicerContext) -> Any:
            _LOG.warning("rejected %s from %s: %s: %s", method, context.peer(), code.name, message)
            context.abort(code, message)

        return _handler_like(handler, reject)


def _handler_like(handler: Any, behavior: Callable[[Any, Any], Any]) -> Any:
    """A handler of the same streaming kind as `handler` that runs `behavior`."""
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(behavior)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(behavior)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(behavior)
    return grpc.stream_stream_rpc_method_handler(behavior)

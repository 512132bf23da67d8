"""Bearer-token auth for the tracker's gRPC server: one interceptor, one table of roles per method.

Every call must carry `authorization: Bearer <token>` (see protos.auth) whose role may make it:

    agent   Register, Heartbeat
    client  Acquire, Renew, Release, ListDevices
    admin   everything, including methods this table does not list

The standard health service (`/grpc.health.v1.Health/*`) is exempt, so load balancers and
`deploy/` can probe a tracker without a token. A missing or unknown token is answered
UNAUTHENTICATED, a known token of the wrong role PERMISSION_DENIED; both are logged with the
method, the peer and the role, never the token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from protos.auth import PoolSecrets, Role, token_from_metadata

_LOG = logging.getLogger(__name__)

_TRACKER = "/kiln.v1.Tracker/"
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)

TRACKER_METHOD_ROLES: Mapping[str, frozenset[Role]] = {
    **{_TRACKER + name: frozenset({Role.AGENT, Role.ADMIN}) for name in ("Register", "Heartbeat")},
    **{
        _TRACKER + name: frozenset({Role.CLIENT, Role.ADMIN})
        for name in ("Acquire", "Renew", "Release", "ListDevices")
    },
}
"""Roles allowed per full method name; a method not listed is admin-only."""

RejectHook = Callable[[str, grpc.StatusCode], None]
"""Called with (method, code) for every rejected call; metrics count them."""


class AuthInterceptor(grpc.ServerInterceptor):
    """Rejects calls whose bearer token is missing, unknown or of a role the method does not allow.

    Args:
        secrets: the pool secrets; their role tokens are the only ones accepted.
        method_roles: full method name -> roles allowed; unlisted methods are admin-only.
        on_reject: called with (method, code) for each rejected call.
    """

    def __init__(
        self,
        secrets: PoolSecrets,
        method_roles: Mapping[str, frozenset[Role]] = TRACKER_METHOD_ROLES,
        on_reject: RejectHook | None = None,
    ) -> None:
        self._secrets = secrets
        self._method_roles = method_roles
        self._on_reject = on_reject

    def check(
        self, method: str, metadata: object
    ) -> tuple[grpc.StatusCode, str, Role | None] | None:
        """None when the call may proceed, else (code, message for the caller, role found)."""
        if method.startswith(EXEMPT_PREFIXES):
            return None
        token = token_from_metadata(metadata)
        if token is None:
            return grpc.StatusCode.UNAUTHENTICATED, "missing bearer token", None
        role = self._secrets.role_of(token)
        if role is None:
            return grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token", None
        allowed = self._method_roles.get(method, frozenset({Role.ADMIN}))
        if role in allowed:
            return None
        wanted = " or ".join(sorted(r.value for r in allowed))
        return (
            grpc.StatusCode.PERMISSION_DENIED,
            f"role '{role.value}' may not call {method} (needs {wanted})",
            role,
        )

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        """Pass allowed calls on; answer the others with a handler that logs and aborts."""
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        verdict = self.check(method, handler_call_details.invocation_metadata)
        if verdict is None:
            return handler
        code, message, role = verdict
        if self._on_reject is not None:
            self._on_reject(method, code)

        def reject(request: Any, context: Any) -> Any:
            _LOG.warning(
                "rejected %s from %s: %s: %s (role %s)",
                method,
                context.peer(),
                code.name,
                message,
                role.value if role else "none",
            )
            context.abort(code, message)

        return _handler_like(handler, reject)


def _handler_like(handler: Any, behavior: Callable[[Any, Any], Any]) -> Any:
    """A handler of the same streaming kind as `handler` that runs `behavior` on the raw request."""
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(behavior)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(behavior)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(behavior)
    return grpc.stream_stream_rpc_method_handler(behavior)

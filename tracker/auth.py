"""Who may call which tracker method (enforced by protos.auth.AsyncAuthInterceptor):

    agent   Register, Heartbeat, Deregister
    client  Acquire, Renew, Release, ListDevices
    admin   everything, including methods this table does not list

The standard health service needs no token, so load balancers and `deploy/` can probe a tracker.
"""

from __future__ import annotations

import logging

from protos.auth import (
    AsyncAuthInterceptor,
    MethodRoles,
    PoolSecrets,
    RejectHook,
    Role,
)

_TRACKER = "/kiln.v1.Tracker/"

TRACKER_METHOD_ROLES: MethodRoles = {
    **{
        _TRACKER + name: frozenset({Role.AGENT, Role.ADMIN})
        for name in ("Register", "Heartbeat", "Deregister")
    },
    **{
        _TRACKER + name: frozenset({Role.CLIENT, Role.ADMIN})
        for name in ("Acquire", "Renew", "Release", "ListDevices")
    },
}


def async_tracker_interceptor(
    secrets: PoolSecrets, on_reject: RejectHook | None = None
) -> AsyncAuthInterceptor:
    """The grpc.aio server's auth interceptor over `secrets`; `on_reject` counts rejections."""
    return AsyncAuthInterceptor(
        secrets, TRACKER_METHOD_ROLES, on_reject, logging.getLogger(__name__)
    )

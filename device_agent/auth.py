"""Who may call the agent (enforced by protos.auth.AsyncAuthInterceptor).

With pool secrets, every call to `kiln.v1.Agent` (Upload, Has, Measure, Run, Info) needs the
`client` or `admin` token; the `agent` token is refused (PERMISSION_DENIED), a missing or unknown
one UNAUTHENTICATED. The standard health service is exempt so a deploy script can probe an agent.
Measure and Run are checked a second time, inside the agent, for the lease (see `leases`).
"""

from __future__ import annotations

import logging

from protos.auth import AsyncAuthInterceptor, MethodRoles, PoolSecrets, Role

AGENT_METHOD_ROLES: MethodRoles = {
    "/kiln.v1.Agent/" + name: frozenset({Role.CLIENT, Role.ADMIN})
    for name in ("Upload", "Has", "Measure", "Run", "Info")
}


def async_agent_interceptor(secrets: PoolSecrets) -> AsyncAuthInterceptor:
    """The agent's auth interceptor over `secrets`, for its grpc.aio server."""
    return AsyncAuthInterceptor(secrets, AGENT_METHOD_ROLES, log=logging.getLogger(__name__))

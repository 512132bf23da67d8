"""How a pool's members prove who they are on the wire: role tokens, the lease key, and TLS.

**Pool secrets file** (`--token-file`), one `name = value` per line, `#` comments:

    agent = <token>       # kiln-agent -> tracker (Register, Heartbeat, Deregister)
    client = <token>      # kiln -> tracker (Acquire, Renew, Release, ListDevices) and -> agents
    admin = <token>       # everything a client and an agent may do, and admin RPCs
    lease_key = <hex>     # HMAC key for lease fencing tokens (protos.fencing)

Each process reads the entries it needs: a tracker needs all four, an agent needs `agent`,
`client` (to check uploads) and `lease_key`, a workstation needs `client`. `write_secrets` makes a
new file with random values and mode 0600.

**Calls** carry `authorization: Bearer <token>` metadata. A server answers UNAUTHENTICATED when the
token is missing or unknown and PERMISSION_DENIED when its role may not make that call.

Servers enforce this with `AsyncAuthInterceptor` and a table of the roles allowed per method (the
tracker's and the agent's tables live in their packages). The standard health service is exempt.

**TLS**: servers take a certificate and key (and a client CA for mutual TLS); clients take the CA
that signed the server's certificate (and their own certificate and key for mutual TLS).
"""

from __future__ import annotations

import enum
import logging
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from protos.ratelimit import RateLimitedLog

_LOG = logging.getLogger(__name__)

METADATA_KEY = "authorization"
_BEARER = "Bearer "


class Role(enum.StrEnum):
    """Who a token belongs to."""

    AGENT = "agent"
    CLIENT = "client"
    ADMIN = "admin"


class SecretsError(ValueError):
    """A pool secrets file is missing, unreadable or malformed; the message names file and line."""


@dataclass(frozen=True)
class PoolSecrets:
    """The contents of a pool secrets file."""

    tokens: Mapping[Role, str] = field(default_factory=dict)
    lease_key: bytes | None = None

    def role_of(self, token: str) -> Role | None:
        """The role whose token this is, or None (constant time per comparison)."""
        found = None
        for role, expected in self.tokens.items():
            if secrets.compare_digest(expected.encode(), token.encode()):
                found = role
        return found

    def token(self, role: Role) -> str:
        """The token of `role`.

        Raises:
            SecretsError: the file has no entry for it.
        """
        try:
            return self.tokens[role]
        except KeyError:
            raise SecretsError(f"pool secrets have no '{role.value}' token") from None

    def require_lease_key(self) -> bytes:
        """The lease key.

        Raises:
            SecretsError: the file has no lease_key.
        """
        if self.lease_key is None:
            raise SecretsError("pool secrets have no 'lease_key'")
        return self.lease_key


def parse_secrets(text: str, source: str = "<secrets>") -> PoolSecrets:
    """Parse the secrets file format above.

    Raises:
        SecretsError: naming `source` and the line.
    """
    tokens: dict[Role, str] = {}
    lease_key: bytes | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, value = (part.strip() for part in line.partition("="))
        where = f"{source}:{number}"
        if not sep or not value:
            raise SecretsError(f"{where}: want 'name = value', got {raw.strip()!r}")
        if name == "lease_key":
            try:
                lease_key = bytes.fromhex(value)
            except ValueError:
                raise SecretsError(f"{where}: lease_key must be hex") from None
            if len(lease_key) < 16:
                raise SecretsError(f"{where}: lease_key must be at least 16 bytes (32 hex digits)")
            continue
        try:
            role = Role(name)
        except ValueError:
            known = ", ".join([r.value for r in Role] + ["lease_key"])
            raise SecretsError(f"{where}: unknown entry {name!r} (known: {known})") from None
        if len(value) < 16:
            raise SecretsError(f"{where}: the {name} token must be at least 16 characters")
        tokens[role] = value
    return PoolSecrets(tokens, lease_key)


def load_secrets(path: str | os.PathLike[str]) -> PoolSecrets:
    """Read and parse a pool secrets file.

    Raises:
        SecretsError: the file cannot be read or is malformed.
    """
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise SecretsError(f"cannot read pool secrets {path}: {error.strerror}") from None
    return parse_secrets(text, str(path))


def write_secrets(path: str | os.PathLike[str]) -> PoolSecrets:
    """Create a new secrets file with random tokens and lease key, mode 0600; refuse to overwrite.

    Raises:
        SecretsError: the file exists or cannot be written.
    """
    body = "".join(f"{role.value} = {secrets.token_urlsafe(32)}\n" for role in Role)
    body += f"lease_key = {secrets.token_hex(32)}\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise SecretsError(f"cannot create pool secrets {path}: {error.strerror}") from None
    with os.fdopen(fd, "w") as handle:
        handle.write("# Kiln pool secrets: keep private; share agent/client/lease_key as needed\n")
        handle.write(body)
    return parse_secrets(body, str(path))


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata to send with a call made with `token` (empty without one)."""
    return ((METADATA_KEY, _BEARER + token),) if token else ()


def token_from_metadata(metadata: object) -> str | None:
    """The bearer token in a call's invocation metadata, or None."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == METADATA_KEY and isinstance(value, str) and value.startswith(_BEARER):
            return value[len(_BEARER) :]
    return None


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for one end of a TLS connection; all None means plaintext."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None  # server: client CA (mutual TLS); client: CA of the server's cert

    @property
    def enabled(self) -> bool:
        """True when any file is set."""
        return any((self.cert, self.key, self.ca))


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise SecretsError(f"cannot read TLS {what} {path}: {error.strerror}") from None


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """Server TLS credentials; with `tls.ca`, clients must present a certificate it signed.

    Raises:
        SecretsError: cert or key missing or unreadable.
    """
    if not (tls.cert and tls.key):
        raise SecretsError("a TLS server needs both --tls-cert and --tls-key")
    pair = [(_read(tls.key, "key"), _read(tls.cert, "certificate"))]
    if tls.ca:
        return grpc.ssl_server_credentials(
            pair, root_certificates=_read(tls.ca, "client CA"), require_client_auth=True
        )
    return grpc.ssl_server_credentials(pair)


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """Client TLS credentials: trust `tls.ca` (system roots when None), present cert+key if set.

    Raises:
        SecretsError: a file is unreadable, or only one of cert/key is set.
    """
    if bool(tls.cert) != bool(tls.key):
        raise SecretsError("a TLS client certificate needs both --tls-cert and --tls-key")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca, "CA") if tls.ca else None,
        private_key=_read(tls.key, "key") if tls.key else None,
        certificate_chain=_read(tls.cert, "certificate") if tls.cert else None,
    )


def open_channel(
    address: str, tls: TlsFiles | None = None, options: list[tuple[str, object]] | None = None
) -> grpc.Channel:
    """A channel to `address`: TLS when `tls` is enabled, plaintext otherwise."""
    if tls is not None and tls.enabled:
        return grpc.secure_channel(address, channel_credentials(tls), options=options)
    return grpc.insecure_channel(address, options=options)


EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)
"""Methods any caller may use without a token: health probes from load balancers and deploy/."""

MethodRoles = Mapping[str, frozenset[Role]]
"""Full method name ("/kiln.v1.Tracker/Acquire") -> roles allowed; unlisted methods: admin only."""

RejectHook = Callable[[str, grpc.StatusCode], None]
"""Called with (method, code) for every rejected call, e.g. to count it."""


class RoleCheck:
    """Decides whether a call's bearer token may call its method.

    A missing or unknown token is UNAUTHENTICATED, a known token of a role the method does not
    allow PERMISSION_DENIED; the health service is exempt.

    Args:
        secrets: the pool secrets; their role tokens are the only ones accepted.
        method_roles: roles allowed per full method name; unlisted methods are admin-only.
    """

    def __init__(self, secrets: PoolSecrets, method_roles: MethodRoles) -> None:
        self._secrets = secrets
        self._method_roles = method_roles

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
        if role in allowed or role is Role.ADMIN:
            return None
        wanted = " or ".join(sorted(r.value for r in allowed | {Role.ADMIN}))
        return (
            grpc.StatusCode.PERMISSION_DENIED,
            f"role '{role.value}' may not call {method} (needs {wanted})",
            role,
        )


def _handler_like(handler: Any, behavior: Callable[[Any, Any], Any]) -> Any:
    """A handler of the same streaming kind as `handler` that runs `behavior` on the raw request."""
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(behavior)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(behavior)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(behavior)
    return grpc.stream_stream_rpc_method_handler(behavior)


class AsyncAuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls that `RoleCheck` refuses, for the grpc.aio servers.

    Each rejection is logged (rate-limited) with the method, the peer and the role, never the
    token, and reported to `on_reject` as (method, code). A rejected call never has its request
    decoded: the rejecting handler takes raw bytes.
    """

    def __init__(
        self,
        secrets: PoolSecrets,
        method_roles: MethodRoles,
        on_reject: RejectHook | None = None,
        log: logging.Logger = _LOG,
    ) -> None:
        self._checks = RoleCheck(secrets, method_roles)
        self._log = RateLimitedLog(log)
        self._on_reject = on_reject

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        """Pass allowed calls on; answer the others with a handler that logs and aborts."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        verdict = self._checks.check(method, handler_call_details.invocation_metadata)
        if verdict is None:
            return handler
        code, message, role = verdict
        if self._on_reject is not None:
            self._on_reject(method, code)

        async def reject(request: Any, context: Any) -> Any:
            self._log.log(
                f"{method} {code.name}",
                logging.WARNING,
                "rejected %s from %s: %s: %s (role %s)",
                method,
                context.peer(),
                code.name,
                message,
                role.value if role else "none",
            )
            await context.abort(code, message)

        return _handler_like(handler, reject)

"""The durable store: all state in Redis, every transition one Lua script (tracker/store/redis_lua).

Several tracker processes (replicas, or one tracker across restarts) may share one Redis: grants
are atomic in Redis, the wait queue is a Redis hash, and a change that may let another replica's
waiter in (a device freed, a request leaving the queue) is published on `<prefix>events`, which
`watch` listens to. The pool also re-dispatches on every reap, so a missed message delays a grant
by at most one reap interval.

Every call is awaited on the tracker's event loop through redis-py's asyncio client: a call
waiting for Redis's answer is a suspended coroutine, not a thread, and concurrent calls share a
bounded pool of connections (a call waits for a free one rather than opening more). The scripts
are registered on that client (EVALSHA, loaded again after a Redis restart) and the watcher is a
task on the same loop.

A Redis that cannot be reached raises StoreUnavailable naming the URL and the cause; the tracker
keeps serving and the servicer answers UNAVAILABLE. A lost connection is retried once (redis-py
`Retry`), so a pooled connection that died with a Redis restart is replaced transparently. A retry
re-runs a script whose reply was lost: grant and renew are then harmless (the first lease ends by
TTL; a renew extends twice), a release answers released=false with "lease released", a deregister
answers removed=0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from protos.redis_url import RedisUrl, parse_redis_url
from tracker.errors import InvalidArgument, LeaseLost, StoreUnavailable, UnknownStore
from tracker.model import (
    Deregistered,
    DeviceRecord,
    DeviceSpec,
    DeviceState,
    ExpiryReport,
    Lease,
    LeaseRequest,
    QueueTicket,
    Registration,
)
from tracker.store import base, redis_lua
from tracker.tokens import TokenIssuer

_LOG = logging.getLogger(__name__)

DEFAULT_PREFIX = "kiln:"
# A Redis that does not answer within this long counts as unreachable for this call.
_SOCKET_TIMEOUT_S = 5.0
_CONNECT_TIMEOUT_S = 2.0
# Connections to Redis per store. Redis runs one command at a time, so more would not answer
# sooner; 500 Acquires arriving together wait for a connection (at most _SOCKET_TIMEOUT_S).
_MAX_CONNECTIONS = 32
# The watcher's longest wait for a message: each wait pings a connection idle for longer than
# health_check_interval, so a connection that died silently is replaced within about this long.
_WATCH_IDLE_S = 10.0
# Pause of the watcher after a lost connection, before it reconnects.
_WATCH_RETRY_S = 0.5

_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


def _unavailable(method: _Method) -> _Method:
    """Turn redis connection errors into StoreUnavailable naming the server."""

    @functools.wraps(method)
    async def wrapper(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise StoreUnavailable(f"redis store {self.url} unreachable: {error}") from error

    return wrapper  # type: ignore[return-value]


def _spec_json(spec: DeviceSpec) -> str:
    return json.dumps(
        {
            "device_id": spec.device_id,
            "key": spec.key,
            "tags": dict(spec.tags),
            "agent_address": spec.agent_address,
            "backend": spec.backend,
        },
        separators=(",", ":"),
    )


def _spec(text: str | bytes) -> DeviceSpec:
    return _spec_of(json.loads(text))


def _spec_of(fields: dict[str, Any]) -> DeviceSpec:
    return DeviceSpec(
        device_id=fields["device_id"],
        key=fields["key"],
        tags=fields["tags"] or {},  # Lua's cjson writes an empty table as {} either way
        agent_address=fields["agent_address"],
        backend=fields["backend"],
    )


def _request_json(request: LeaseRequest) -> str:
    return json.dumps(
        {
            "key": request.key,
            "tags": dict(request.tag_selector),
            "priority": request.priority,
            "user": request.user,
            "timeout_s": request.timeout_s,
            "lease_ttl_s": request.lease_ttl_s,
            "request_id": request.request_id,
        },
        separators=(",", ":"),
    )


def _request(text: str) -> LeaseRequest:
    fields = json.loads(text)
    return LeaseRequest(
        key=fields["key"],
        tag_selector=fields["tags"] or {},
        priority=fields["priority"],
        user=fields["user"],
        timeout_s=fields["timeout_s"],
        lease_ttl_s=fields["lease_ttl_s"],
        request_id=fields["request_id"],
    )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_url(url: str) -> RedisUrl:
    """Parse a store URL (see protos.redis_url); the prefix defaults to DEFAULT_PREFIX.

    Raises:
        UnknownStore: another scheme, no host or socket path, a bad port or db; the message names
            the URL without its password.
    """
    try:
        return parse_redis_url(url, default_prefix=DEFAULT_PREFIX)
    except ValueError as error:
        raise UnknownStore(f"store {error}") from None


class RedisStore(base.TrackerStore):
    """TrackerStore in Redis; see the module docstring for the guarantees across processes."""

    def __init__(self, url: str, client: redis.asyncio.Redis | None = None) -> None:
        """Connect lazily to the store at `url` (see parse_url); the first call's event loop
        is the one every later call must run on.

        Args:
            client: an existing asyncio client to use instead of one made from the URL (tests).

        Raises:
            UnknownStore: the URL is malformed.
        """
        parsed = parse_url(url)
        self.prefix = parsed.prefix
        self.url = parsed.shown  # without the password: it names the store in errors and logs
        if client is None:
            connections = redis.asyncio.BlockingConnectionPool.from_url(
                parsed.client_url,
                max_connections=_MAX_CONNECTIONS,
                timeout=_SOCKET_TIMEOUT_S,  # the wait for a free connection
                decode_responses=True,
                socket_timeout=_SOCKET_TIMEOUT_S,
                socket_connect_timeout=_CONNECT_TIMEOUT_S,
                retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 1),
                health_check_interval=10,
            )
            client = redis.asyncio.Redis.from_pool(connections)
        self._redis: Any = client
        scripts = {
            "register": redis_lua.REGISTER,
            "heartbeat": redis_lua.HEARTBEAT,
            "deregister": redis_lua.DEREGISTER,
            "grant": redis_lua.GRANT,
            "renew_or_release": redis_lua.RENEW_OR_RELEASE,
            "expire": redis_lua.EXPIRE,
            "devices": redis_lua.DEVICES,
            "live_devices": redis_lua.LIVE_DEVICES,
            "devices_by_id": redis_lua.DEVICES_BY_ID,
            "queued_shapes": redis_lua.QUEUED_SHAPES,
            "enqueue": redis_lua.ENQUEUE,
            "dequeue": redis_lua.DEQUEUE,
        }
        self._scripts = {name: self._redis.register_script(code) for name, code in scripts.items()}
        self._watcher: asyncio.Task[None] | None = None
        self._specs = _SpecCache()

    async def _run(self, name: str, *args: str | int) -> Any:
        return await self._scripts[name](args=[self.prefix, *args])

    @_unavailable
    async def ping(self) -> None:
        """Check that Redis answers.

        Raises:
            StoreUnavailable: it does not.
        """
        await self._redis.ping()

    @_unavailable
    async def register(self, registration: Registration, now_unix: float) -> tuple[str, ...]:
        devices = [
            {"id": spec.device_id, "key": spec.key, "spec": _spec_json(spec)}
            for spec in registration.devices
        ]
        reply = await self._run(
            "register",
            registration.agent_id,
            registration.agent_address,
            repr(now_unix),
            json.dumps(devices, separators=(",", ":")),
        )
        if reply[0] == "taken":
            _, index, device_id, owner = reply
            raise InvalidArgument(
                f"devices[{index}].device_id {device_id!r} is registered by live agent {owner!r}"
            )
        return tuple(reply[1:])

    @_unavailable
    async def heartbeat(self, agent_id: str, now_unix: float) -> bool:
        return bool(await self._run("heartbeat", agent_id, repr(now_unix)))

    @_unavailable
    async def deregister(self, agent_id: str) -> Deregistered:
        removed, ended = await self._run("deregister", agent_id)
        return Deregistered(tuple(removed), tuple(ended))

    @_unavailable
    async def grant(
        self,
        request: LeaseRequest,
        lease_id: str,
        now_unix: float,
        ttl_s: float,
        issue_token: TokenIssuer,
        ticket: QueueTicket | None = None,
    ) -> Lease | None:
        expires_at_unix = now_unix + ttl_s
        reply = await self._run(
            "grant",
            json.dumps({"key": request.key, "tags": dict(request.tag_selector)}),
            lease_id,
            repr(now_unix),
            repr(expires_at_unix),
            int(now_unix * 1_000_000),
            request.user,
            ticket.request_id if ticket else "",
            ticket.priority if ticket else 0,
            ticket.seq if ticket else 0,
            request.priority,
        )
        if not reply:
            return None
        device_id, spec_text, fence_text = reply
        fence = int(fence_text)
        token = issue_token(lease_id, device_id, fence, expires_at_unix)
        return Lease(lease_id, _spec(spec_text), expires_at_unix, token, request.user, fence)

    @_unavailable
    async def renew(
        self, lease_id: str, now_unix: float, ttl_s: float, issue_token: TokenIssuer
    ) -> Lease:
        expires_at_unix = now_unix + ttl_s
        lease = self._lease_reply(
            await self._run("renew_or_release", lease_id, repr(now_unix), repr(expires_at_unix)),
            lease_id,
        )
        token = issue_token(lease_id, lease.device.device_id, lease.fence, expires_at_unix)
        return Lease(lease_id, lease.device, expires_at_unix, token, lease.user, lease.fence)

    @_unavailable
    async def release(self, lease_id: str, now_unix: float) -> Lease:
        return self._lease_reply(
            await self._run("renew_or_release", lease_id, repr(now_unix), ""), lease_id
        )

    @staticmethod
    def _lease_reply(reply: list[str], lease_id: str) -> Lease:
        if reply[0] == "lost":
            raise LeaseLost(reply[1])
        _, _, spec_text, fence, user, expires = reply
        return Lease(lease_id, _spec(spec_text), float(expires), "", user, int(fence))

    @_unavailable
    async def expire(
        self,
        now_unix: float,
        agent_timeout_s: float,
        lost_device_retention_s: float = math.inf,
    ) -> ExpiryReport:
        retention = "-1" if math.isinf(lost_device_retention_s) else repr(lost_device_retention_s)
        reply = await self._run("expire", repr(now_unix), repr(agent_timeout_s), retention)
        agents, lost, ended, pruned, dropped = (tuple(part) for part in reply)
        return ExpiryReport(agents, lost, ended, pruned, dropped)

    @_unavailable
    async def devices(self, key: str = "", after: str = "", limit: int = 0) -> list[DeviceRecord]:
        reply = await self._run("devices", key, f"({after}" if after else "-", limit)
        return self._specs.records(reply)

    @_unavailable
    async def devices_by_id(self, device_ids: Sequence[str]) -> list[DeviceRecord]:
        return self._specs.records(await self._run("devices_by_id", json.dumps(list(device_ids))))

    @_unavailable
    async def live_devices(self, key: str = "") -> list[DeviceRecord]:
        return self._specs.records(await self._run("live_devices", key))

    @_unavailable
    async def enqueue(self, request: LeaseRequest, now_unix: float, ttl_s: float) -> QueueTicket:
        if not request.request_id:
            raise InvalidArgument("request_id must not be empty to queue a request")
        priority, seq = await self._run(
            "enqueue",
            request.request_id,
            _request_json(request),
            request.priority,
            repr(now_unix),
            repr(now_unix + ttl_s),
        )
        return QueueTicket(request.request_id, int(priority), int(seq))

    @_unavailable
    async def keep_queued(
        self,
        entries: Sequence[tuple[QueueTicket, LeaseRequest]],
        now_unix: float,
        ttl_s: float,
    ) -> None:
        expires = repr(now_unix + ttl_s)
        mapping = {
            ticket.request_id: json.dumps(
                {"r": _request_json(request), "p": ticket.priority, "s": ticket.seq, "x": expires},
                separators=(",", ":"),
            )
            for ticket, request in entries
        }
        if mapping:
            # Entries and their key index in one round trip (see redis_lua: P qk:<key>).
            pipe = self._redis.pipeline(transaction=True)
            pipe.hset(self.prefix + "q", mapping=mapping)
            for ticket, request in entries:
                pipe.sadd(f"{self.prefix}qk:{request.key}", ticket.request_id)
            await pipe.execute()

    @_unavailable
    async def dequeue(self, request_id: str) -> None:
        await self._run("dequeue", request_id)

    @_unavailable
    async def queued(self, now_unix: float) -> list[tuple[QueueTicket, LeaseRequest]]:
        live = []
        for request_id, text in (await self._redis.hgetall(self.prefix + "q")).items():
            entry = json.loads(text)
            if float(entry["x"]) > now_unix:
                ticket = QueueTicket(_text(request_id), int(entry["p"]), int(entry["s"]))
                live.append((ticket, _request(entry["r"])))
        live.sort(key=lambda item: item[0].order)
        return live

    @_unavailable
    async def queued_shapes(self, now_unix: float) -> dict[base.Shape, int]:
        counts: dict[base.Shape, int] = {}
        for key, tags, count in json.loads(await self._run("queued_shapes", repr(now_unix))):
            # cjson writes an empty selector as {} ... or [] when it decoded it as an array
            shape = (str(key), tuple(sorted(dict(tags or {}).items())))
            counts[shape] = counts.get(shape, 0) + int(count)
        return counts

    async def watch(self, on_change: Callable[[str | None], None]) -> None:
        """Listen on `<prefix>events` in a task of this loop and call `on_change` per message."""
        if self._watcher is not None:
            raise RuntimeError("RedisStore.watch may be called once")
        self._watcher = asyncio.create_task(self._watch(on_change), name="kiln-store-watch")

    async def _watch(self, on_change: Callable[[str | None], None]) -> None:
        """Until cancelled: subscribe, then call `on_change` per message; reconnect on errors."""
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.prefix + "events")
                on_change(None)  # messages may have been missed while not subscribed
                while True:
                    message = await pubsub.get_message(timeout=_WATCH_IDLE_S)
                    if message is not None and message.get("type") == "message":
                        data = _text(message.get("data", ""))
                        on_change(data[len("freed:") :] if data.startswith("freed:") else None)
            except (redis.ConnectionError, redis.TimeoutError) as error:
                _LOG.warning("store watch: redis %s unreachable (%s); retrying", self.url, error)
            except Exception:
                _LOG.exception("store watch failed; retrying")
            finally:
                with contextlib.suppress(Exception):  # a dead connection may fail to close
                    await pubsub.aclose()
            await asyncio.sleep(_WATCH_RETRY_S)

    async def close(self) -> None:
        """Stop the watcher and close the connections."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self._redis.aclose()


class _SpecCache:
    """DeviceSpecs by the JSON text Redis stores for them, so that listing 1,000 devices ten times
    a second decodes each spec once rather than on every page. A re-registered device with other
    fields has another text; the cache is emptied when it outgrows MAX_SPECS."""

    MAX_SPECS = 16384

    def __init__(self) -> None:
        self._specs: dict[str, DeviceSpec] = {}

    def spec(self, text: str) -> DeviceSpec:
        spec = self._specs.get(text)
        if spec is None:
            if len(self._specs) >= self.MAX_SPECS:
                self._specs.clear()
            spec = self._specs[text] = _spec(text)
        return spec

    def records(self, reply: str) -> list[DeviceRecord]:
        """The DeviceRecords of a device_rows reply (see redis_lua)."""
        states = _STATES
        return [
            DeviceRecord(self.spec(text), states[state], holder, float(heartbeat), int(fence))
            for text, state, heartbeat, holder, fence in json.loads(reply)
        ]


_STATES = {state.value: state for state in DeviceState}

"""create_server(): a started grpc.aio server with its DevicePool and Reaper, for the CLI and tests.

The server runs on an asyncio loop of its own thread (protos.aio_loop.LoopThread), and so do the
pool, its store and the reaper: a waiting Acquire is a suspended coroutine, not a parked thread,
and a store call waits for Redis without a thread of its own. `create_server` and `stop` stay
synchronous.
Besides the Tracker service it carries: the standard gRPC health service (SERVING while up,
NOT_SERVING from the start of a graceful stop), bearer-token auth when pool secrets are given
(tracker.auth), strict request decoding (protos.decoding), TLS or mutual TLS when TLS files are
given, and optionally a Prometheus endpoint (tracker.metrics).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from protos import tracker_pb2_grpc
from protos.aio_loop import LoopThread, bind_port
from protos.auth import PoolSecrets, TlsFiles, server_credentials
from protos.decoding import AsyncStrictDecoding
from tracker.auth import async_tracker_interceptor
from tracker.config import TrackerConfig
from tracker.pool import DevicePool
from tracker.reaper import Reaper
from tracker.service import TrackerService
from tracker.store import TrackerStore, open_store
from tracker.tokens import hmac_issuer

if TYPE_CHECKING:
    from tracker.metrics import TrackerMetrics

_LOG = logging.getLogger(__name__)

_T = TypeVar("_T")

_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
TRACKER_SERVICE_NAME = "kiln.v1.Tracker"
# Bounds on the loop-side steps of a stop, beyond the grace the caller gives in-flight calls.
_STEP_TIMEOUT_S = 5.0


class ServingTracker(NamedTuple):
    """A running tracker; unpacks as (server, port, pool, reaper, host, health, metrics, ...)."""

    server: Any  # grpc.aio.Server, served on `loop`
    port: int
    pool: DevicePool
    reaper: Reaper
    host: str
    health: Any = None  # grpc_health.v1.health.aio.HealthServicer, on `loop`
    metrics: TrackerMetrics | None = None
    metrics_port: int = 0
    loop: LoopThread | None = None
    store: TrackerStore | None = None

    @property
    def address(self) -> str:
        """host:port a client on this machine can dial."""
        return f"{_dialable(self.host)}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """http://host:port/metrics, or "" when metrics are off."""
        if self.metrics is None:
            return ""
        return f"http://{_dialable(self.host)}:{self.metrics_port}/metrics"

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        """Run `coroutine` (one of the pool's, say) on the tracker's loop and return its result:
        how synchronous code (tests, an embedding process) calls the pool.

        Raises:
            TimeoutError: it ran past `timeout_s`; it is cancelled.
        """
        assert self.loop is not None, "create_server() sets the loop"
        return self.loop.call(coroutine, timeout_s)

    def stop(self, grace_s: float = 2.0) -> None:
        """Report NOT_SERVING, answer waiting Acquires, stop the reaper, then the server.

        In-flight calls get `grace_s` to finish; then the store's connections and the loop's
        thread end, and the metrics endpoint stops last. Idempotent.
        """
        loop = self.loop
        if loop is not None and loop.alive:
            if self.health is not None:
                loop.call(self.health.enter_graceful_shutdown(), _STEP_TIMEOUT_S)
            loop.call(self.pool.close(), _STEP_TIMEOUT_S)
            loop.call(self.reaper.stop(), _STEP_TIMEOUT_S)
            try:
                loop.call(self.server.stop(grace_s), grace_s + _STEP_TIMEOUT_S)
            except TimeoutError:
                _LOG.warning("the server did not stop within %.1f s", grace_s + _STEP_TIMEOUT_S)
            if self.store is not None:
                _close_store(loop, self.store)
            loop.stop()
        if self.metrics is not None:
            self.metrics.close()


def _close_store(loop: LoopThread, store: TrackerStore) -> None:
    """Close `store` on `loop`, where its connections live; a failure is logged."""
    try:
        loop.call(store.close(), _STEP_TIMEOUT_S)
    except Exception:
        _LOG.exception("closing the store failed")


def _dialable(host: str) -> str:
    return "127.0.0.1" if host in _WILDCARD_HOSTS else host


def create_server(
    listen: str = "127.0.0.1:0",
    config: TrackerConfig | None = None,
    *,
    secrets: PoolSecrets | None = None,
    tls: TlsFiles | None = None,
    metrics_port: int | None = None,
) -> ServingTracker:
    """Bind `listen` (port 0 picks a free one), start serving and start the reaper.

    Args:
        secrets: pool secrets; when given, every call needs a token of an allowed role, and lease
            tokens are signed with their lease_key.
        tls: server certificate and key (and client CA for mutual TLS); None = plaintext.
        metrics_port: serve Prometheus /metrics on the listen host at this port (0 = pick one);
            None = no metrics endpoint.

    Raises:
        UnknownStore: config.store names no implementation.
        OSError: `listen` or the metrics port could not be bound.
        protos.auth.SecretsError: a TLS file is missing or unreadable.
    """
    config = config or TrackerConfig()
    host = listen.rsplit(":", 1)[0]
    credentials = server_credentials(tls) if tls is not None and tls.enabled else None
    # With the pool's lease key agents verify lease tokens without calling the tracker; without
    # one the pool signs with a key of its own that no agent knows.
    issuer = hmac_issuer(secrets.lease_key) if secrets and secrets.lease_key else None
    store = open_store(config.store)
    pool = DevicePool(store, config, issue_token=issuer)
    loop = LoopThread("kiln-tracker-loop")
    metrics = None
    if metrics_port is not None:
        from tracker.metrics import TrackerMetrics  # prometheus-client only when asked for

        metrics = TrackerMetrics(pool, functools.partial(loop.call, timeout_s=_STEP_TIMEOUT_S))
    interceptors: list[Any] = []
    if secrets is not None:
        interceptors.append(
            async_tracker_interceptor(
                secrets, on_reject=metrics.observe_rejection if metrics else None
            )
        )
    interceptors.append(AsyncStrictDecoding())
    service = TrackerService(pool, metrics)
    reaper = Reaper(
        pool, config.reap_interval_s, on_report=metrics.observe_expiry if metrics else None
    )
    try:
        server, port, health = loop.call(
            _serve(listen, config, interceptors, service, credentials, pool), _STEP_TIMEOUT_S
        )
    except BaseException:
        _close_store(loop, store)
        loop.stop()
        raise
    serving = ServingTracker(server, port, pool, reaper, host, health, None, 0, loop, store)
    if metrics is not None:
        assert metrics_port is not None
        try:
            bound_metrics_port = metrics.serve(_metrics_host(host), metrics_port)
        except OSError as error:
            serving.stop(0.0)
            raise OSError(f"cannot serve metrics on {host}:{metrics_port}: {error}") from error
        serving = serving._replace(metrics=metrics, metrics_port=bound_metrics_port)
    loop.call(_start_reaper(reaper), _STEP_TIMEOUT_S)
    _LOG.info(
        "tracker serving on %s:%d (store %s, %s, %s)",
        host,
        port,
        config.store,
        "token auth" if secrets is not None else "NO auth",
        "TLS" if credentials is not None else "plaintext",
    )
    if metrics is not None:
        _LOG.info("metrics at %s", serving.metrics_url)
    return serving


async def _serve(
    listen: str,
    config: TrackerConfig,
    interceptors: list[Any],
    service: TrackerService,
    credentials: Any,
    pool: DevicePool,
) -> tuple[Any, int, Any]:
    """Start the pool, bind and start the aio server on the running loop; returns (server, port,
    health).

    Raises:
        OSError: `listen` could not be bound.
    """
    await pool.start()
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
            # gRPC sets SO_REUSEPORT by default: a second tracker on a taken port would then bind
            # too and split the pool's state. Fail the bind instead.
            ("grpc.so_reuseport", 0),
        ],
    )
    tracker_pb2_grpc.add_TrackerServicer_to_server(service, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        port = bind_port(server, listen, credentials)
    except OSError:
        await server.stop(None)
        raise
    await server.start()
    for name in ("", TRACKER_SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health


async def _start_reaper(reaper: Reaper) -> None:
    reaper.start()


def _metrics_host(host: str) -> str:
    """The address the metrics HTTP server binds: the listen host, bracket-free for IPv6."""
    if host in ("", "[::]"):
        return "::" if host else "0.0.0.0"
    return host.strip("[]")

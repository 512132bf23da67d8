"""create_server(): a started gRPC server with its DevicePool and Reaper, for the CLI and tests.

The server carries, besides the Tracker service: the standard gRPC health service (SERVING while
up, NOT_SERVING from the start of a graceful stop), bearer-token auth when pool secrets are given
(tracker.auth), strict request decoding (protos.decoding), TLS or mutual TLS when TLS files are
given, and optionally a Prometheus endpoint (tracker.metrics).
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protos import tracker_pb2_grpc
from protos.auth import PoolSecrets, TlsFiles, server_credentials
from protos.decoding import StrictDecoding
from tracker.auth import tracker_interceptor
from tracker.config import TrackerConfig
from tracker.pool import DevicePool
from tracker.reaper import Reaper
from tracker.service import TrackerService
from tracker.store import open_store
from tracker.tokens import hmac_issuer

if TYPE_CHECKING:
    from tracker.metrics import TrackerMetrics

_LOG = logging.getLogger(__name__)

_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
TRACKER_SERVICE_NAME = "kiln.v1.Tracker"


class ServingTracker(NamedTuple):
    """A running tracker; unpacks as (server, port, pool, reaper, host, health, metrics, ...)."""

    server: Any  # grpc.Server
    port: int
    pool: DevicePool
    reaper: Reaper
    host: str
    health: Any = None  # grpc_health.v1.health.HealthServicer
    metrics: TrackerMetrics | None = None
    metrics_port: int = 0

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

    def stop(self, grace_s: float = 2.0) -> None:
        """Report NOT_SERVING, answer waiting Acquires, stop the reaper, then the server.

        In-flight calls get `grace_s` to finish; the metrics endpoint stops last.
        """
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        self.pool.close()
        self.reaper.stop()
        self.server.stop(grace=grace_s).wait(grace_s + 1.0)
        if self.metrics is not None:
            self.metrics.close()


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
    pool = DevicePool(open_store(config.store), config, issue_token=issuer)
    metrics = None
    if metrics_port is not None:
        from tracker.metrics import TrackerMetrics  # prometheus-client only when asked for

        metrics = TrackerMetrics(pool)
    interceptors: list[Any] = []
    if secrets is not None:
        interceptors.append(
            tracker_interceptor(secrets, on_reject=metrics.observe_rejection if metrics else None)
        )
    interceptors.append(StrictDecoding())
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="tracker"),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
            # gRPC sets SO_REUSEPORT by default: a second tracker on a taken port would then bind
            # too and split the pool's state. Fail the bind instead.
            ("grpc.so_reuseport", 0),
        ],
    )
    tracker_pb2_grpc.add_TrackerServicer_to_server(TrackerService(pool, metrics), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        if credentials is not None:
            port = server.add_secure_port(listen, credentials)
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as error:
        raise OSError(f"cannot listen on {listen}: {error}") from error
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    bound_metrics_port = 0
    if metrics is not None:
        assert metrics_port is not None
        try:
            bound_metrics_port = metrics.serve(_metrics_host(host), metrics_port)
        except OSError as error:
            raise OSError(f"cannot serve metrics on {host}:{metrics_port}: {error}") from error
    server.start()
    for service in ("", TRACKER_SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    reaper = Reaper(
        pool, config.reap_interval_s, on_report=metrics.observe_expiry if metrics else None
    )
    reaper.start()
    _LOG.info(
        "tracker serving on %s:%d (store %s, %s, %s)",
        host,
        port,
        config.store,
        "token auth" if secrets is not None else "NO auth",
        "TLS" if credentials is not None else "plaintext",
    )
    serving = ServingTracker(
        server, port, pool, reaper, host, health_servicer, metrics, bound_metrics_port
    )
    if metrics is not None:
        _LOG.info("metrics at %s", serving.metrics_url)
    return serving


def _metrics_host(host: str) -> str:
    """The address the metrics HTTP server binds: the listen host, bracket-free for IPv6."""
    if host in ("", "[::]"):
        return "::" if host else "0.0.0.0"
    return host.strip("[]")

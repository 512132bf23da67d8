"""Build and stop a serving agent: gRPC server, core, and tracker registration together.

The server is a grpc.aio server on an event loop of its own (`protos.aio_loop.LoopThread`), so a
request waiting for its device is a suspended coroutine, not a parked thread (see `service`). It
carries the Agent service, behind the bearer-token interceptor when the config has pool secrets
and the strict decoding interceptor, and the standard gRPC health service (SERVING while up,
exempt from auth). With `config.tls` set it listens with TLS (mutual TLS when a client CA is
given). With `metrics_port` it also serves Prometheus /metrics over HTTP on the listen host
(`device_agent.metrics`; prometheus_client is imported only then). `create_server` and
`AgentServer` are synchronous, for the CLI and the tests.

`AgentServer.stop()` is the graceful stop (SIGTERM, SIGINT, the end of a `with`): the registrar
stops heartbeating and deregisters the devices before the RPC server stops, so the tracker hands
out no new lease on them while in-flight calls finish.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from types import TracebackType
from typing import TYPE_CHECKING

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from device_agent import serde
from device_agent.agent import Agent, agent_version
from device_agent.auth import async_agent_interceptor
from device_agent.config import AgentConfig
from device_agent.leases import LeaseVerifier
from device_agent.registration import Registrar
from device_agent.service import AgentServicer
from protos import agent_pb2_grpc
from protos.aio_loop import LoopThread, bind_port
from protos.auth import Role, server_credentials
from protos.decoding import AsyncStrictDecoding

if TYPE_CHECKING:
    from device_agent.metrics import AgentMetrics

_LOG = logging.getLogger(__name__)
# Run carries whole tensors both ways; gRPC's 4 MiB default would cap them. Uploads stream in
# chunks and are bounded by max_artifact_bytes, not by this.
_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    # gRPC sets SO_REUSEPORT by default: a second agent on a taken port would bind too and
    # take half the connections (and the other's leases' calls). Fail the bind instead.
    ("grpc.so_reuseport", 0),
]
# How long stop() waits beyond the grace period for the server, then for the loop's thread.
_STOP_SLACK_S = 5.0
_WILDCARD_HOSTS = ("", "0.0.0.0", "[::]", "::")


class AgentServer:
    """A serving agent; `stop()` ends registration, the RPC server, the executors, the threads.

    `metrics_url` is "http://host:port/metrics" when it serves metrics, else "".
    """

    def __init__(
        self,
        loop: LoopThread,
        server: grpc.aio.Server,
        agent: Agent,
        servicer: AgentServicer,
        registrar: Registrar | None,
        health_servicer: health.aio.HealthServicer,
        metrics: AgentMetrics | None = None,
        metrics_url: str = "",
    ) -> None:
        self.agent = agent
        self.registrar = registrar
        self.metrics_url = metrics_url
        self._metrics = metrics
        self._loop = loop
        self._server: grpc.aio.Server | None = server
        self._servicer = servicer
        self._health = health_servicer
        self._stopped = False
        self._terminated = threading.Event()

    def stop(self, grace_s: float | None = None) -> None:
        """Stop everything; in-flight RPCs get `grace_s` (default config.stop_grace_s). Idempotent.

        First the devices leave the tracker (`Registrar.stop`: heartbeats end, then one Deregister
        bounded by config.rpc_timeout_s); the metrics endpoint stops last. Afterwards no thread of
        the agent's is left: the loop's, the job pool's, the executors' log readers, the
        registrar's and the metrics server's have ended.
        """
        if self._stopped:
            return
        self._stopped = True
        grace = self.agent.config.stop_grace_s if grace_s is None else grace_s
        timeout_s = grace + _STOP_SLACK_S
        self._loop.call(self._health.enter_graceful_shutdown(), timeout_s)
        if self.registrar is not None:
            self.registrar.stop()
        assert self._server is not None
        # The server's stop waits out the grace period; closing the executors meanwhile ends a job
        # in flight (its answer comes at once) instead of letting it hold the whole grace period.
        stopping = asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop.loop)
        self.agent.close()
        try:
            stopping.result(timeout_s)
        except TimeoutError:
            _LOG.warning("the RPC server did not stop within %.1f s", timeout_s)
        self._servicer.close()  # prompt: the executors are closed, so no job is left running
        self._loop.stop(_STOP_SLACK_S)
        self._server = None  # grpc's own poller thread ends with the last aio server object
        if self._metrics is not None:
            self._metrics.close()
        self._terminated.set()
        _LOG.info("agent %s stopped", self.agent.agent_id)

    def wait(self, timeout_s: float) -> bool:
        """Block until the server terminates or `timeout_s` passes; True when it terminated."""
        return self._terminated.wait(timeout_s)

    def __enter__(self) -> AgentServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def create_server(
    listen: str = "127.0.0.1:0",
    config: AgentConfig | None = None,
    lease_verifier: LeaseVerifier | None = None,
    metrics_port: int | None = None,
) -> tuple[AgentServer, int, Agent]:
    """Bind `listen`, start serving, and register with the tracker when one is configured.

    Args:
        metrics_port: serve Prometheus /metrics on the listen host at this port (0 = pick one);
            None = no metrics endpoint (and prometheus_client is not imported).

    Returns:
        (server, port, agent): `port` is the bound port (the real one when `listen` ends in :0);
        devices advertise `config.advertise_host:port`.

    Raises:
        protos.auth.SecretsError: unreadable TLS files, or secrets without a needed entry.
        ValueError, RuntimeError: a bad backend or pinning (see `Agent`).
        OSError: nothing could be bound at `listen`, or at the metrics port.
        ImportError: `metrics_port` is given and prometheus_client is not installed.
    """
    config = config or AgentConfig()
    agent_token = None
    if config.secrets is not None:
        config.secrets.require_lease_key()
        config.secrets.token(Role.CLIENT)
        if config.tracker_address:
            agent_token = config.secrets.token(Role.AGENT)
    credentials = server_credentials(config.tls) if config.tls.enabled else None
    loop = LoopThread("kiln-agent-loop")
    try:
        server, port = loop.call(_bind(listen, config, credentials))
    except BaseException:
        loop.stop()
        raise
    address = f"{config.advertise_host}:{port}"
    agent = servicer = metrics = None
    metrics_url = ""
    try:
        agent = Agent(config, address, lease_verifier)
        servicer = AgentServicer(agent)
        health_servicer = loop.call(_serve(server, servicer))
        if metrics_port is not None:
            metrics, metrics_url = _serve_metrics(agent, listen, metrics_port)
    except BaseException:
        loop.call(server.stop(None))
        if agent is not None:
            agent.close()
        if servicer is not None:
            servicer.close()
        loop.stop()
        raise
    registrar = None
    if config.tracker_address:
        registrar = Registrar(
            config.tracker_address,
            lambda: serde.register_request(agent.agent_id, address, agent.devices),
            lambda: serde.heartbeat_request(agent.agent_id),
            config.rpc_timeout_s,
            config.reregister_backoff_initial_s,
            config.reregister_backoff_cap_s,
            token=agent_token,
            tls=config.tracker_tls,
            on_fence_floors=agent.end_leases_below,
            deregister_request=lambda: serde.deregister_request(agent.agent_id),
        )
        registrar.start()
    _LOG.info(
        "agent %s serving %d %s device(s) on %s",
        agent.agent_id,
        len(agent.devices),
        config.backend,
        address,
    )
    if metrics_url:
        _LOG.info("metrics at %s", metrics_url)
    serving = AgentServer(
        loop, server, agent, servicer, registrar, health_servicer, metrics, metrics_url
    )
    return serving, port, agent


def _serve_metrics(agent: Agent, listen: str, port: int) -> tuple[AgentMetrics, str]:
    """Serve `agent`'s metrics on the host of `listen`; returns them and their URL.

    Raises:
        ImportError: prometheus_client is not installed.
        OSError: the port could not be bound.
    """
    from device_agent.metrics import AgentMetrics  # prometheus-client only when asked for

    host = listen.rpartition(":")[0]
    metrics = AgentMetrics(agent, agent_version())
    try:
        bound = metrics.serve(_bind_host(host), port)
    except OSError as e:
        raise OSError(f"cannot serve metrics on {host}:{port}: {e}") from e
    url_host = agent.config.advertise_host if host in _WILDCARD_HOSTS else host
    return metrics, f"http://{url_host}:{bound}/metrics"


def _bind_host(host: str) -> str:
    """The address the metrics HTTP server binds: the listen host, bracket-free for IPv6."""
    if host in ("", "0.0.0.0"):
        return "0.0.0.0"
    if host in ("[::]", "::"):
        return "::"
    return host.strip("[]")


async def _bind(
    listen: str, config: AgentConfig, credentials: grpc.ServerCredentials | None
) -> tuple[grpc.aio.Server, int]:
    """An unstarted aio server bound to `listen` (made on the loop it will serve on)."""
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if config.secrets is not None:
        interceptors.append(async_agent_interceptor(config.secrets))
    interceptors.append(AsyncStrictDecoding())  # malformed bytes: INVALID_ARGUMENT, not INTERNAL
    server = grpc.aio.server(interceptors=interceptors, options=_OPTIONS)
    return server, bind_port(server, listen, credentials)


async def _serve(server: grpc.aio.Server, servicer: AgentServicer) -> health.aio.HealthServicer:
    """Add the services to `server` and start it; returns its health servicer."""
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", "kiln.v1.Agent"):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    await server.start()
    return health_servicer

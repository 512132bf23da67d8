"""Build and stop a serving agent: gRPC server, core, and tracker registration together.

The server carries the Agent service, behind the bearer-token interceptor when the config has pool
secrets, and the standard gRPC health service (SERVING while up, exempt from auth). With
`config.tls` set it listens with TLS (mutual TLS when a client CA is given).
"""

from __future__ import annotations

import logging
from concurrent import futures
from types import TracebackType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from device_agent import serde
from device_agent.agent import Agent
from device_agent.auth import agent_interceptor
from device_agent.config import AgentConfig
from device_agent.leases import LeaseVerifier
from device_agent.registration import Registrar
from device_agent.service import AgentServicer
from protos import agent_pb2_grpc
from protos.auth import Role, server_credentials
from protos.decoding import StrictDecoding

_LOG = logging.getLogger(__name__)
# Run carries whole tensors both ways; gRPC's 4 MiB default would cap them. Uploads stream in
# chunks and are bounded by max_artifact_bytes, not by this.
_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class AgentServer:
    """A serving agent; `stop()` ends registration, the RPC server and the executors, in that order."""

    def __init__(
        self,
        server: grpc.Server,
        agent: Agent,
        registrar: Registrar | None,
        health_servicer: health.HealthServicer | None = None,
    ) -> None:
        self.grpc_server = server
        self.agent = agent
        self.registrar = registrar
        self.health = health_servicer
        self._stopped = False

    def stop(self, grace_s: float | None = None) -> None:
        """Stop everything; in-flight RPCs get `grace_s` (default config.stop_grace_s). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.agent.config.stop_grace_s if grace_s is None else grace_s
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        if self.registrar is not None:
            self.registrar.stop()
        # stop() only starts the grace period; closing the executors right away ends a measurement
        # in flight (it answers DEVICE_LOST) instead of letting it hold the whole grace period.
        done = self.grpc_server.stop(grace)
        self.agent.close()
        done.wait(timeout=grace + 5.0)
        _LOG.info("agent %s stopped", self.agent.agent_id)

    def wait(self, timeout_s: float) -> bool:
        """Block until the server terminates or `timeout_s` passes; True when it terminated."""
        return bool(self.grpc_server.wait_for_termination(timeout=timeout_s))

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
) -> tuple[AgentServer, int, Agent]:
    """Bind `listen`, start serving, and register with the tracker when one is configured.

    Returns:
        (server, port, agent): `port` is the bound port (the real one when `listen` ends in :0);
        devices advertise `config.advertise_host:port`.

    Raises:
        protos.auth.SecretsError: unreadable TLS files, or secrets without a needed entry.
        ValueError, RuntimeError: a bad backend or pinning (see `Agent`).
        OSError: nothing could be bound at `listen`.
    """
    config = config or AgentConfig()
    agent_token = None
    if config.secrets is not None:
        config.secrets.require_lease_key()
        config.secrets.token(Role.CLIENT)
        if config.tracker_address:
            agent_token = config.secrets.token(Role.AGENT)
    interceptors: list[grpc.ServerInterceptor] = (
        [] if config.secrets is None else [agent_interceptor(config.secrets)]
    )
    interceptors.append(StrictDecoding())  # malformed bytes: INVALID_ARGUMENT, not INTERNAL
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4 + 2 * config.devices),
        interceptors=interceptors,
        options=[
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            # gRPC sets SO_REUSEPORT by default: a second agent on a taken port would bind too and
            # take half the connections (and the other's leases' calls). Fail the bind instead.
            ("grpc.so_reuseport", 0),
        ],
    )
    try:
        if config.tls.enabled:
            port = server.add_secure_port(listen, server_credentials(config.tls))
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as error:
        raise OSError(f"cannot listen on {listen}: {error}") from error
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    address = f"{config.advertise_host}:{port}"
    agent = Agent(config, address, lease_verifier)
    agent_pb2_grpc.add_AgentServicer_to_server(AgentServicer(agent), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", "kiln.v1.Agent"):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    server.start()
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
        )
        registrar.start()
    _LOG.info(
        "agent %s serving %d %s device(s) on %s",
        agent.agent_id,
        config.devices,
        config.backend,
        address,
    )
    return AgentServer(server, agent, registrar, health_servicer), port, agent

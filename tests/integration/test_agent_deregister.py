"""A graceful stop deregisters: the agent against a recording tracker on 127.0.0.1.

The contract side of `Registrar.stop()`: heartbeats end first, then one Deregister with the agent's
id and `agent` token; a tracker that does not answer holds the stop for one RPC deadline at most,
and costs one warning. The real tracker's side is in tests/system/test_agent_lifecycle.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from device_agent.config import AgentConfig
from device_agent.server import create_server
from protos import tracker_pb2, tracker_pb2_grpc
from protos.auth import Role, token_from_metadata, write_secrets

HEARTBEAT_S = 0.05
WAIT_S = 20.0  # bound on every wait below; none should come near it


class RecordingTracker(tracker_pb2_grpc.TrackerServicer):
    """Records each agent call in order, with the token it carried."""

    def __init__(self, answer_deregister: bool = True) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, str | None]] = []  # (method, agent id, token)
        self.answer_deregister = answer_deregister
        self.release = threading.Event()  # ends a Deregister that is not answered

    def _note(self, method: str, agent_id: str, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.calls.append(
                (method, agent_id, token_from_metadata(context.invocation_metadata()))
            )

    def methods(self) -> list[str]:
        with self.lock:
            return [method for method, _, _ in self.calls]

    def Register(
        self, request: tracker_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.RegisterResponse:
        self._note("Register", request.agent_id, context)
        return tracker_pb2.RegisterResponse(heartbeat_interval_s=HEARTBEAT_S)

    def Heartbeat(
        self, request: tracker_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.HeartbeatResponse:
        self._note("Heartbeat", request.agent_id, context)
        return tracker_pb2.HeartbeatResponse(known=True)

    def Deregister(
        self, request: tracker_pb2.DeregisterRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.DeregisterResponse:
        self._note("Deregister", request.agent_id, context)
        if not self.answer_deregister:
            self.release.wait(WAIT_S)
        return tracker_pb2.DeregisterResponse(removed=2)


def serve(tracker: RecordingTracker) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    tracker_pb2_grpc.add_TrackerServicer_to_server(tracker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def test_a_graceful_stop_deregisters_once_after_the_last_heartbeat(tmp_path: Path) -> None:
    secrets = write_secrets(tmp_path / "pool.secrets")
    tracker = RecordingTracker()
    tracker_server, port = serve(tracker)
    try:
        config = AgentConfig(
            backend="null",
            devices=2,
            key="k",
            cache_dir=str(tmp_path / "cache"),
            tracker_address=f"127.0.0.1:{port}",
            secrets=secrets,
        )
        server, _, agent = create_server("127.0.0.1:0", config)
        with server:
            wait_until(lambda: tracker.methods().count("Heartbeat") >= 3)
        methods = tracker.methods()
        time.sleep(5 * HEARTBEAT_S)  # a heartbeat after the stop would land meanwhile
        with tracker.lock:
            calls = list(tracker.calls)
    finally:
        tracker_server.stop(None)
    assert [c[0] for c in calls] == methods, "called the tracker after stop() returned"
    assert methods.count("Deregister") == 1 and methods[-1] == "Deregister", methods
    _, agent_id, token = calls[-1]
    assert agent_id == agent.agent_id
    assert token == secrets.token(Role.AGENT)


def test_a_tracker_that_never_answers_deregister_holds_the_stop_one_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = RecordingTracker(answer_deregister=False)
    tracker_server, port = serve(tracker)
    try:
        config = AgentConfig(
            backend="null",
            key="k",
            cache_dir=str(tmp_path / "cache"),
            tracker_address=f"127.0.0.1:{port}",
            rpc_timeout_s=0.5,
        )
        server, _, _ = create_server("127.0.0.1:0", config)
        wait_until(lambda: "Heartbeat" in tracker.methods())
        stopping = threading.Thread(target=server.stop)
        with caplog.at_level(logging.WARNING, logger="device_agent.registration"):
            stopping.start()
            stopping.join(WAIT_S)  # without the deadline it would wait for `release`
            assert not stopping.is_alive(), "stop() waited on the tracker's answer"
    finally:
        tracker.release.set()
        tracker_server.stop(None)
    assert tracker.methods().count("Deregister") == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "could not deregister" in warnings[0], warnings


def test_an_unreachable_tracker_costs_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = RecordingTracker()
    tracker_server, port = serve(tracker)
    config = AgentConfig(
        backend="null",
        key="k",
        cache_dir=str(tmp_path / "cache"),
        tracker_address=f"127.0.0.1:{port}",
        rpc_timeout_s=1.0,
        reregister_backoff_cap_s=0.2,
    )
    server, _, _ = create_server("127.0.0.1:0", config)
    try:
        wait_until(lambda: "Heartbeat" in tracker.methods())
    finally:
        tracker_server.stop(None)
    with caplog.at_level(logging.WARNING, logger="device_agent.registration"):
        server.stop()
    deregistering = [r for r in caplog.records if "deregister" in r.getMessage()]
    assert len(deregistering) == 1 and deregistering[0].levelno == logging.WARNING
    assert "Deregister" not in tracker.methods()

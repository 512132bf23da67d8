"""The agent registers its devices with a tracker, heartbeats, and registers again when forgotten."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from device_agent.config import AgentConfig
from device_agent.server import create_server
from protos import hostinfo, tracker_pb2, tracker_pb2_grpc
from tracker import server as tracker_server
from tracker.config import TrackerConfig

PROJECT_ROOT = Path(__file__).resolve().parents[2]

HEARTBEAT_S = 0.05


class FakeTracker(tracker_pb2_grpc.TrackerServicer):
    """Records Register and Heartbeat calls; answers known=false to the first heartbeat."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registers: list[tracker_pb2.RegisterRequest] = []
        self.heartbeats: list[int] = []  # how many registrations preceded each heartbeat

    def Register(
        self, request: tracker_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.RegisterResponse:
        with self.lock:
            self.registers.append(request)
        return tracker_pb2.RegisterResponse(heartbeat_interval_s=HEARTBEAT_S)

    def Heartbeat(
        self, request: tracker_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.HeartbeatResponse:
        with self.lock:
            self.heartbeats.append(len(self.registers))
            return tracker_pb2.HeartbeatResponse(known=len(self.heartbeats) > 1)


def serve_tracker(tracker: FakeTracker, port: int = 0) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    tracker_pb2_grpc.add_TrackerServicer_to_server(tracker, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def tracker() -> Iterator[tuple[FakeTracker, int]]:
    fake = FakeTracker()
    server, port = serve_tracker(fake)
    yield fake, port
    server.stop(None)


def test_registers_heartbeats_and_reregisters_when_forgotten(
    tracker: tuple[FakeTracker, int], tmp_path: Path
) -> None:
    fake, port = tracker
    config = AgentConfig(
        backend="null",
        devices=2,
        key="k",
        tags={"board": "b"},
        agent_id="reg-agent",
        tracker_address=f"127.0.0.1:{port}",
        cache_dir=str(tmp_path),
    )
    server, agent_port, _ = create_server("127.0.0.1:0", config)
    with server:
        # Heartbeat 1 is answered known=false, so registration 2 follows; then heartbeats resume.
        assert wait_until(lambda: len(fake.registers) >= 2 and fake.heartbeats[-1:] == [2])
    first = fake.registers[0]
    assert first.agent_id == "reg-agent"
    assert first.agent_address == f"127.0.0.1:{agent_port}"
    assert [d.device_id for d in first.devices] == ["reg-agent/0", "reg-agent/1"]
    assert all(d.tags["board"] == "b" and d.tags["arch"] and d.key == "k" for d in first.devices)
    assert fake.heartbeats[0] == 1
    count = len(fake.registers) + len(fake.heartbeats)
    time.sleep(5 * HEARTBEAT_S)
    assert len(fake.registers) + len(fake.heartbeats) == count, "still calling after stop()"


def test_keeps_trying_until_the_tracker_appears(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = AgentConfig(
        backend="null",
        tracker_address=f"127.0.0.1:{port}",
        cache_dir=str(tmp_path),
        rpc_timeout_s=0.5,
        reregister_backoff_cap_s=0.2,
    )
    server, _, _ = create_server("127.0.0.1:0", config)
    with server:
        time.sleep(0.5)  # several failed attempts
        fake = FakeTracker()
        tracker_server, _ = serve_tracker(fake, port)
        try:
            assert wait_until(lambda: len(fake.registers) >= 1)
        finally:
            tracker_server.stop(None)


def spawn_agent(tmp_path: Path, tracker: str, name: str, *args: str) -> subprocess.Popen[bytes]:
    """`python -m device_agent` registering with `tracker` as agent `name`; stopped by the caller."""
    with open(tmp_path / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "device_agent", "--tracker", tracker, "--agent-id", name,
             "--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path / name), *args],
            cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def test_real_agents_register_backend_and_cpu_feature_tags(tmp_path: Path) -> None:
    serving = tracker_server.create_server("127.0.0.1:0", TrackerConfig(heartbeat_interval_s=0.5))
    procs = [
        spawn_agent(tmp_path, serving.address, "cpu-agent", "--backend", "cpu", "--key", "k",
                    "--tag", "board=b"),
        spawn_agent(tmp_path, serving.address, "null-agent", "--backend", "null", "--key", "k",
                    "--tag", "features=neon"),
    ]  # fmt: skip
    try:
        with grpc.insecure_channel(serving.address) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)

            def registered() -> dict[str, dict[str, str]]:
                listed = stub.ListDevices(tracker_pb2.ListDevicesRequest(key="k"), timeout=10)
                return {d.spec.device_id: dict(d.spec.tags) for d in listed.devices}

            def logs() -> str:
                return "\n".join(p.read_text() for p in sorted(tmp_path.glob("*.log")))

            assert wait_until(lambda: len(registered()) == 2, timeout_s=60), logs()
            tags = registered()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        serving.stop(grace_s=0.5)
    cpu = tags["cpu-agent/0"]
    assert cpu["backend"] == "cpu" and cpu["board"] == "b" and cpu["arch"]
    assert cpu["features"] == hostinfo.cpu_tags()["features"]
    assert cpu["cpu"] == hostinfo.cpu_tags()["cpu"]
    if cpu["arch"] == "x86_64":
        assert {"sse4_2", "avx2"} & set(cpu["features"].split(","))  # any x86 host of this decade
    # The null backend adds only `backend`; the user's --tag overrides what the agent would say.
    assert tags["null-agent/0"] == {"arch": cpu["arch"], "backend": "null", "features": "neon"}

"""Restarting a real `kiln-tracker` over a real redis-server while real `kiln-agent`s keep running.

The pool is secured (token file, so leases carry HMAC tokens signed with the pool's lease key) and
heartbeats every 0.5 s. The tracker listens on a fixed port that the test picked, so agents and
clients find the restarted tracker at the address they already know.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos import common_pb2, fencing, tracker_pb2, tracker_pb2_grpc
from protos.auth import PoolSecrets, Role, call_metadata, write_secrets
from tracker.testing import RedisServer, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 0.5
START_TIMEOUT_S = 30.0
WAIT_TIMEOUT_S = 30.0
RPC_TIMEOUT_S = 10.0
OUTAGE_S = 120.0  # the "stop the tracker for 120 s"


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float = WAIT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout_s} s"
        time.sleep(0.05)


class RedisPool:
    """A tracker over Redis and agents, each a child process of this test, stopped by pid."""

    def __init__(self, workdir: Path, redis_url: str) -> None:
        self.workdir = workdir
        self.redis_url = redis_url
        self.secrets_path = workdir / "pool.secrets"
        self.secrets: PoolSecrets = write_secrets(self.secrets_path)
        self.address = f"127.0.0.1:{free_port()}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts = 0

    def spawn(self, name: str, args: list[str]) -> str:
        ready = self.workdir / f"{name}.ready"
        ready.unlink(missing_ok=True)
        with open(self.workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, *args, "--ready-file", str(ready)],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{self.log(name)}"
            assert time.monotonic() < deadline, f"{name} never became ready:\n{self.log(name)}"
            time.sleep(0.02)
        return ready.read_text().splitlines()[0]

    def start_tracker(self) -> None:
        self.starts += 1
        self.spawn(
            "tracker",
            ["-m", "tracker", "--listen", self.address, "--store", self.redis_url,
             "--heartbeat-interval-s", str(HEARTBEAT_S), "--lease-ttl-s", "30",
             "--token-file", str(self.secrets_path)],
        )  # fmt: skip

    def stop_tracker(self) -> None:
        proc = self.procs["tracker"]
        proc.send_signal(signal.SIGTERM)
        proc.wait(RPC_TIMEOUT_S)
        assert proc.returncode == 0, self.log("tracker")

    def start_agent(self, name: str, key: str, devices: int) -> None:
        self.spawn(
            name,
            ["-m", "device_agent", "--tracker", self.address, "--key", key, "--backend", "null",
             "--devices", str(devices), "--listen", "127.0.0.1:0", "--agent-id", name,
             "--token-file", str(self.secrets_path), "--cache-dir", str(self.workdir / name)],
        )  # fmt: skip

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def call(self, channel: grpc.Channel, method: str, request: Any, role: Role) -> Any:
        stub = tracker_pb2_grpc.TrackerStub(channel)
        return getattr(stub, method)(
            request, timeout=RPC_TIMEOUT_S, metadata=call_metadata(self.secrets.token(role))
        )

    def devices(self, channel: grpc.Channel) -> dict[str, Any]:
        listed = self.call(channel, "ListDevices", tracker_pb2.ListDevicesRequest(), Role.ADMIN)
        return {d.spec.device_id: d for d in listed.devices}

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[RedisPool]:
    with RedisServer(tmp_path / "redis") as server:
        pool = RedisPool(tmp_path, server.url(prefix="restart:"))
        try:
            pool.start_tracker()
            pool.start_agent("agent-a", "x86", 2)
            pool.start_agent("agent-b", "solo", 1)
            yield pool
        finally:
            pool.stop()


def all_alive(pool: RedisPool, channel: grpc.Channel, expected: set[str]) -> bool:
    try:
        devices = pool.devices(channel)
    except grpc.RpcError:
        return False
    return set(devices) == expected and all(
        d.state != tracker_pb2.LOST and d.heartbeat_age_s < 4 * HEARTBEAT_S
        for d in devices.values()
    )


DEVICES = {"agent-a/0", "agent-a/1", "agent-b/0"}


def acquire(pool: RedisPool, channel: grpc.Channel, key: str, **fields: Any) -> Any:
    request = tracker_pb2.AcquireRequest(key=key, user="alice", lease_ttl_s=30, **fields)
    return pool.call(channel, "Acquire", request, Role.CLIENT)


def test_restart_keeps_leases_registrations_and_queued_requests(pool: RedisPool) -> None:
    lease_key = pool.secrets.require_lease_key()
    with grpc.insecure_channel(pool.address) as channel:
        wait_until("pool registered", lambda: all_alive(pool, channel, DEVICES))
        held = acquire(pool, channel, "x86")
        solo = acquire(pool, channel, "solo")
        assert held.status == solo.status == common_pb2.OK
        fencing.verify(lease_key, held.lease.token, held.lease.lease_id, "agent-a/0", time.time())
        # A second client waits for the solo device with its own request id...
        waiting = tracker_pb2_grpc.TrackerStub(channel).Acquire.future(
            tracker_pb2.AcquireRequest(key="solo", timeout_s=60.0, request_id="req-7"),
            timeout=RPC_TIMEOUT_S + 60.0,
            metadata=call_metadata(pool.secrets.token(Role.CLIENT)),
        )
        wait_until("request queued", lambda: pool.devices(channel)["agent-b/0"].queue_depth == 1)
        pool.stop_tracker()
        error = waiting.exception(timeout=RPC_TIMEOUT_S)
        assert isinstance(error, grpc.RpcError)
        assert error.code() == grpc.StatusCode.UNAVAILABLE  # ...cut off by the restart
        pool.start_tracker()

        renew = pool.call(
            channel, "Renew", tracker_pb2.RenewRequest(lease_id=held.lease.lease_id), Role.CLIENT
        )
        assert renew.status == common_pb2.OK, renew.reason
        assert renew.lease.device.device_id == "agent-a/0"
        assert renew.lease.fence == held.lease.fence
        claims = fencing.verify(
            lease_key, renew.lease.token, held.lease.lease_id, "agent-a/0", time.time()
        )
        assert (
            claims.expires_at_ms
            > fencing.verify(
                lease_key, held.lease.token, held.lease.lease_id, "agent-a/0", time.time()
            ).expires_at_ms
        )
        wait_until("pool whole after restart", lambda: all_alive(pool, channel, DEVICES))
        devices = pool.devices(channel)
        assert devices["agent-a/0"].state == tracker_pb2.LEASED
        assert devices["agent-b/0"].state == tracker_pb2.LEASED
        assert devices["agent-a/1"].state == tracker_pb2.FREE
        assert "registered with tracker" in pool.log("agent-a")

        # The cut-off client retries with its request id, and gets the device once it is free.
        retry = tracker_pb2_grpc.TrackerStub(channel).Acquire.future(
            tracker_pb2.AcquireRequest(key="solo", timeout_s=20.0, request_id="req-7"),
            timeout=RPC_TIMEOUT_S + 20.0,
            metadata=call_metadata(pool.secrets.token(Role.CLIENT)),
        )
        wait_until("retry queued", lambda: pool.devices(channel)["agent-b/0"].queue_depth == 1)
        released = pool.call(
            channel,
            "Release",
            tracker_pb2.ReleaseRequest(lease_id=solo.lease.lease_id),
            Role.CLIENT,
        )
        assert released.released
        granted = retry.result(timeout=RPC_TIMEOUT_S + 20.0)
        assert granted.status == common_pb2.OK and granted.lease.device.device_id == "agent-b/0"
        assert granted.lease.fence > solo.lease.fence


@pytest.mark.slow
def test_tracker_down_for_120_s_heals_by_itself(pool: RedisPool) -> None:
    with grpc.insecure_channel(pool.address) as channel:
        wait_until("pool registered", lambda: all_alive(pool, channel, DEVICES))
        held = acquire(pool, channel, "x86")
        assert held.status == common_pb2.OK
        pool.stop_tracker()
        time.sleep(OUTAGE_S)
        for name in ("agent-a", "agent-b"):
            assert pool.procs[name].poll() is None, pool.log(name)
        pool.start_tracker()
        # Agents re-register by themselves (backoff capped at 5 s); bounded wait after restart.
        wait_until("pool whole after the outage", lambda: all_alive(pool, channel, DEVICES))
        renew = pool.call(
            channel, "Renew", tracker_pb2.RenewRequest(lease_id=held.lease.lease_id), Role.CLIENT
        )
        # The 30 s lease lapsed during the outage, or ended with the agent's expiry.
        assert renew.status == common_pb2.DEVICE_LOST
        assert renew.reason in ("lease expired", "device lost: agent stopped heartbeating")
        devices = pool.devices(channel)
        assert {d.state for d in devices.values()} == {tracker_pb2.FREE}
        again = acquire(pool, channel, "x86")
        assert again.status == common_pb2.OK and again.lease.fence > held.lease.fence
        assert os.path.exists(pool.workdir / "tracker.log")

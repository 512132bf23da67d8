"""Faults and bad input against real `kiln-tracker` and `kiln-agent` processes on 127.0.0.1.

Every pool here is secured with a pool secrets file (token auth on tracker and agents), heartbeats
every 0.4 s, so a silent agent is expired within 0.8 s. Each test ends by listing the pool as admin
and asserting it is consistent. Restart and Redis faults are in the store's own tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc
from protos.auth import PoolSecrets, Role, call_metadata, write_secrets

REPO_ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 0.4
START_TIMEOUT_S = 30.0
WAIT_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 10.0


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float = WAIT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout_s} s"
        time.sleep(0.02)


@dataclass
class Pool:
    """A secured tracker with agents, all child processes of this test, stopped by pid."""

    workdir: Path
    secrets: PoolSecrets
    secrets_path: Path
    tracker: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spawn(self, name: str, args: list[str]) -> str:
        """Start `python <args> --ready-file F`; return the first line it writes there."""
        ready = self.workdir / f"{name}.ready"
        with open(self.workdir / f"{name}.log", "wb") as log:
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
        self.tracker = self.spawn(
            "tracker",
            ["-m", "tracker", "--listen", "127.0.0.1:0", "--heartbeat-interval-s", str(HEARTBEAT_S),
             "--token-file", str(self.secrets_path)],
        )  # fmt: skip

    def start_agent(self, name: str, key: str = "x86") -> str:
        return self.spawn(
            name,
            ["-m", "device_agent", "--tracker", self.tracker, "--key", key, "--backend", "null",
             "--listen", "127.0.0.1:0", "--agent-id", name, "--token-file", str(self.secrets_path),
             "--cache-dir", str(self.workdir / f"{name}-cache")],
        )  # fmt: skip

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stub(self, channel: grpc.Channel) -> Any:
        return tracker_pb2_grpc.TrackerStub(channel)

    def md(self, role: Role) -> tuple[tuple[str, str], ...]:
        return call_metadata(self.secrets.token(role))

    def devices(self, channel: grpc.Channel) -> dict[str, Any]:
        """Device id -> DeviceStatus, listed as admin."""
        response = self.stub(channel).ListDevices(
            tracker_pb2.ListDevicesRequest(), timeout=RPC_TIMEOUT_S, metadata=self.md(Role.ADMIN)
        )
        return {d.spec.device_id: d for d in response.devices}

    def acquire(self, channel: grpc.Channel, user: str, timeout_s: float = 0.0) -> Any:
        return self.stub(channel).Acquire(
            tracker_pb2.AcquireRequest(key="x86", user=user, timeout_s=timeout_s),
            timeout=timeout_s + RPC_TIMEOUT_S,
            metadata=self.md(Role.CLIENT),
        )

    def renew(self, channel: grpc.Channel, lease_id: str) -> Any:
        return self.stub(channel).Renew(
            tracker_pb2.RenewRequest(lease_id=lease_id),
            timeout=RPC_TIMEOUT_S,
            metadata=self.md(Role.CLIENT),
        )

    def release(self, channel: grpc.Channel, lease_id: str) -> Any:
        return self.stub(channel).Release(
            tracker_pb2.ReleaseRequest(lease_id=lease_id),
            timeout=RPC_TIMEOUT_S,
            metadata=self.md(Role.CLIENT),
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    secrets_path = tmp_path / "pool.secrets"
    p = Pool(tmp_path, write_secrets(secrets_path), secrets_path)
    try:
        p.start_tracker()
        yield p
    finally:
        p.stop()
    assert p.procs["tracker"].returncode == 0, p.log("tracker")


@pytest.fixture
def channel(pool: Pool) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(pool.tracker) as ch:
        yield ch


def _lost_then_renew_says_device_lost(pool: Pool, channel: grpc.Channel, lease: Any) -> None:
    device_id = lease.device.device_id
    wait_until(
        f"{device_id} LOST", lambda: pool.devices(channel)[device_id].state == tracker_pb2.LOST
    )
    renew = pool.renew(channel, lease.lease_id)
    assert (renew.status, renew.reason) == (
        common_pb2.DEVICE_LOST,
        "device lost: agent stopped heartbeating",
    )
    again = pool.acquire(channel, "bob")
    assert again.status == common_pb2.NO_DEVICE
    assert "all 1 matching devices lost" in again.reason


def test_killed_agent_goes_lost_and_its_lease_holder_learns_device_lost(
    pool: Pool, channel: grpc.Channel
) -> None:
    pool.start_agent("doomed")
    wait_until("agent registered", lambda: len(pool.devices(channel)) == 1)
    lease = pool.acquire(channel, "alice").lease
    assert lease.device.device_id == "doomed/0"
    pool.procs["doomed"].kill()
    pool.procs["doomed"].wait(10)
    _lost_then_renew_says_device_lost(pool, channel, lease)
    [device] = pool.devices(channel).values()
    assert (device.state, device.lease_holder) == (tracker_pb2.LOST, "")
    assert "agent doomed stopped heartbeating" in pool.log("tracker")


def test_frozen_agent_goes_lost_and_comes_back_free_when_thawed(
    pool: Pool, channel: grpc.Channel
) -> None:
    pool.start_agent("frozen")
    wait_until("agent registered", lambda: len(pool.devices(channel)) == 1)
    lease = pool.acquire(channel, "alice").lease
    os.kill(pool.procs["frozen"].pid, signal.SIGSTOP)
    try:
        _lost_then_renew_says_device_lost(pool, channel, lease)
    finally:
        os.kill(pool.procs["frozen"].pid, signal.SIGCONT)
    wait_until(
        "thawed agent re-registered",
        lambda: pool.devices(channel)["frozen/0"].state == tracker_pb2.FREE,
    )
    assert "forgot this agent; registering again" in pool.log("frozen")
    # the tracker lists the device FREE as soon as it holds the registration; the agent logs
    # its success after the answer reaches it, a moment later
    wait_until(
        "the agent logged its second registration",
        lambda: pool.log("frozen").count("registered with tracker") >= 2,
    )
    fresh = pool.acquire(channel, "bob")
    assert fresh.status == common_pb2.OK and fresh.lease.device.device_id == "frozen/0"
    assert fresh.lease.lease_id != lease.lease_id
    device = pool.devices(channel)["frozen/0"]
    assert (device.state, device.lease_holder, device.queue_depth) == (tracker_pb2.LEASED, "bob", 0)


_QUEUED_CLIENT = """
import sys, grpc
from protos import tracker_pb2, tracker_pb2_grpc
from protos.auth import call_metadata
address, token = sys.argv[1], sys.argv[2]
with grpc.insecure_channel(address) as channel:
    tracker_pb2_grpc.TrackerStub(channel).Acquire(
        tracker_pb2.AcquireRequest(key="x86", user="doomed-client", timeout_s=120),
        timeout=120, metadata=call_metadata(token))
"""


def test_a_client_that_dies_while_queued_leaves_the_queue(
    pool: Pool, channel: grpc.Channel
) -> None:
    pool.start_agent("a1")
    wait_until("agent registered", lambda: len(pool.devices(channel)) == 1)
    held = pool.acquire(channel, "holder").lease
    client = subprocess.Popen(
        [sys.executable, "-c", _QUEUED_CLIENT, pool.tracker, pool.secrets.token(Role.CLIENT)],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until("client queued", lambda: pool.devices(channel)["a1/0"].queue_depth == 1)
        waiter = pool.stub(channel).Acquire.future(
            tracker_pb2.AcquireRequest(key="x86", user="next-in-line", timeout_s=60),
            timeout=60 + RPC_TIMEOUT_S,
            metadata=pool.md(Role.CLIENT),
        )
        wait_until("second waiter queued", lambda: pool.devices(channel)["a1/0"].queue_depth == 2)
        client.kill()
        client.wait(10)
        wait_until("dead client dropped", lambda: pool.devices(channel)["a1/0"].queue_depth == 1)
        assert pool.release(channel, held.lease_id).released
        granted = waiter.result(timeout=RPC_TIMEOUT_S)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)
    assert granted.status == common_pb2.OK and granted.lease.user == "next-in-line"
    device = pool.devices(channel)["a1/0"]
    assert (device.state, device.lease_holder, device.queue_depth) == (
        tracker_pb2.LEASED,
        "next-in-line",
        0,
    )


def test_malformed_and_oversized_messages_are_refused_and_the_tracker_stays_up(
    pool: Pool, channel: grpc.Channel
) -> None:
    pool.start_agent("a1")
    wait_until("agent registered", lambda: len(pool.devices(channel)) == 1)
    agent_md = pool.md(Role.AGENT)
    raw_register = channel.unary_unary("/kiln.v1.Tracker/Register")
    raw_acquire = channel.unary_unary("/kiln.v1.Tracker/Acquire")
    for method, raw in (("Register", raw_register), ("Acquire", raw_acquire)):
        md = agent_md if method == "Register" else pool.md(Role.CLIENT)
        with pytest.raises(grpc.RpcError) as malformed:
            raw(b"\x0a\xff\x01garbage", timeout=RPC_TIMEOUT_S, metadata=md)
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"malformed request to /kiln.v1.Tracker/{method}" in malformed.value.details()
    huge = common_pb2.DeviceSpec(key="x86", tags={"blob": "x" * (5 * 1024 * 1024)})
    with pytest.raises(grpc.RpcError) as oversized:
        pool.stub(channel).Register(
            tracker_pb2.RegisterRequest(agent_id="huge", devices=[huge]),
            timeout=RPC_TIMEOUT_S,
            metadata=agent_md,
        )
    assert oversized.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert pool.procs["tracker"].poll() is None
    [device] = pool.devices(channel).values()
    assert (device.spec.device_id, device.state) == ("a1/0", tracker_pb2.FREE)
    assert pool.acquire(channel, "after").status == common_pb2.OK


def test_unknown_and_double_released_leases_say_why(pool: Pool, channel: grpc.Channel) -> None:
    pool.start_agent("a1")
    wait_until("agent registered", lambda: len(pool.devices(channel)) == 1)
    unknown = pool.release(channel, "no-such-lease")
    assert (unknown.released, unknown.reason) == (False, "unknown lease")
    renew = pool.renew(channel, "no-such-lease")
    assert (renew.status, renew.reason) == (common_pb2.DEVICE_LOST, "unknown lease")
    lease = pool.acquire(channel, "alice").lease
    assert pool.release(channel, lease.lease_id).released
    twice = pool.release(channel, lease.lease_id)
    assert (twice.released, twice.reason) == (False, "lease released")
    [device] = pool.devices(channel).values()
    assert (device.state, device.lease_holder) == (tracker_pb2.FREE, "")


def test_fake_agent_without_or_with_a_client_token_registers_nothing(
    pool: Pool, channel: grpc.Channel
) -> None:
    stub = pool.stub(channel)
    fake = tracker_pb2.RegisterRequest(
        agent_id="fake",
        agent_address="127.0.0.1:9",
        devices=[common_pb2.DeviceSpec(key="x86", backend="null")],
    )
    with pytest.raises(grpc.RpcError) as no_token:
        stub.Register(fake, timeout=RPC_TIMEOUT_S)
    assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as client_token:
        stub.Register(fake, timeout=RPC_TIMEOUT_S, metadata=pool.md(Role.CLIENT))
    assert client_token.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as heartbeat:
        stub.Heartbeat(tracker_pb2.HeartbeatRequest(agent_id="fake"), timeout=RPC_TIMEOUT_S)
    assert heartbeat.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert pool.devices(channel) == {}
    log = pool.log("tracker")
    assert "rejected /kiln.v1.Tracker/Register from ipv4:127.0.0.1" in log
    assert "UNAUTHENTICATED: missing bearer token (role none)" in log
    assert "PERMISSION_DENIED: role 'client' may not call /kiln.v1.Tracker/Register" in log
    assert pool.secrets.token(Role.CLIENT) not in log

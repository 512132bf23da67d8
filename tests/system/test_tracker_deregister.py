"""Devices that leave cleanly: Deregister on a real tracker, and LOST devices pruned after
`kiln-tracker --lost-retention-s`.

An agent stopping gracefully calls Deregister: its devices leave ListDevices at once, the lease a
client holds on one of them is answered DEVICE_LOST on Renew, and when the agent registers again
its fence floors and new leases stay above every fence issued before. Real gRPC on 127.0.0.1
with token auth, against the memory store and a real redis-server; every wait bounded.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc
from protos.auth import PoolSecrets, Role, call_metadata, write_secrets
from tracker.config import TrackerConfig
from tracker.server import ServingTracker, create_server
from tracker.testing import RedisServer

RPC_S = 10.0
WAIT_S = 15.0  # bound on every poll below; none should come near it
KEY = "dereg"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> PoolSecrets:
    return write_secrets(tmp_path_factory.mktemp("secrets") / "pool.secrets")


@pytest.fixture(params=["memory", "redis"])
def tracker(
    request: pytest.FixtureRequest, secrets: PoolSecrets, redis_server: RedisServer
) -> Iterator[ServingTracker]:
    store = "memory"
    if request.param == "redis":
        store = redis_server.url(prefix=f"dereg-{uuid.uuid4().hex[:12]}:")
    config = TrackerConfig(heartbeat_interval_s=5.0, startup_grace_s=0.0, store=store)
    serving = create_server("127.0.0.1:0", config, secrets=secrets)
    try:
        yield serving
    finally:
        serving.stop(grace_s=0.5)


@pytest.fixture
def stub(tracker: ServingTracker) -> Iterator[tracker_pb2_grpc.TrackerStub]:
    with grpc.insecure_channel(tracker.address) as channel:
        yield tracker_pb2_grpc.TrackerStub(channel)


def register(
    stub: tracker_pb2_grpc.TrackerStub, secrets: PoolSecrets, agent_id: str, devices: int
) -> tracker_pb2.RegisterResponse:
    reply: tracker_pb2.RegisterResponse = stub.Register(
        tracker_pb2.RegisterRequest(
            agent_id=agent_id,
            agent_address="127.0.0.1:7000",
            devices=[common_pb2.DeviceSpec(key=KEY) for _ in range(devices)],
        ),
        timeout=RPC_S,
        metadata=call_metadata(secrets.token(Role.AGENT)),
    )
    return reply


def deregister(
    stub: tracker_pb2_grpc.TrackerStub, agent_id: str, token: str | None
) -> tracker_pb2.DeregisterResponse:
    reply: tracker_pb2.DeregisterResponse = stub.Deregister(
        tracker_pb2.DeregisterRequest(agent_id=agent_id),
        timeout=RPC_S,
        metadata=call_metadata(token),
    )
    return reply


def acquire(stub: tracker_pb2_grpc.TrackerStub, secrets: PoolSecrets) -> tracker_pb2.Lease:
    reply = stub.Acquire(
        tracker_pb2.AcquireRequest(key=KEY, user="carol", lease_ttl_s=60.0),
        timeout=RPC_S,
        metadata=call_metadata(secrets.token(Role.CLIENT)),
    )
    assert reply.status == common_pb2.OK, reply.reason
    lease: tracker_pb2.Lease = reply.lease
    return lease


def listed(stub: tracker_pb2_grpc.TrackerStub, token: str) -> dict[str, int]:
    """device id -> state of every device the tracker lists."""
    reply = stub.ListDevices(
        tracker_pb2.ListDevicesRequest(), timeout=RPC_S, metadata=call_metadata(token)
    )
    return {d.spec.device_id: d.state for d in reply.devices}


def test_a_deregistered_agent_leaves_and_comes_back_with_higher_fences(
    stub: tracker_pb2_grpc.TrackerStub, secrets: PoolSecrets
) -> None:
    client = secrets.token(Role.CLIENT)
    register(stub, secrets, "host-a", 2)
    register(stub, secrets, "host-b", 1)
    old = acquire(stub, secrets)
    assert old.device.device_id == "host-a/0"

    assert deregister(stub, "host-a", secrets.token(Role.AGENT)).removed == 2
    assert listed(stub, client) == {"host-b/0": tracker_pb2.FREE}
    renew = stub.Renew(
        tracker_pb2.RenewRequest(lease_id=old.lease_id),
        timeout=RPC_S,
        metadata=call_metadata(client),
    )
    assert (renew.status, renew.reason) == (
        common_pb2.DEVICE_LOST,
        "device lost: agent deregistered",
    )
    release = stub.Release(
        tracker_pb2.ReleaseRequest(lease_id=old.lease_id),
        timeout=RPC_S,
        metadata=call_metadata(client),
    )
    assert (release.released, release.reason) == (False, "device lost: agent deregistered")

    again = register(stub, secrets, "host-a", 2)
    assert set(again.fence_floors) == {"host-a/0", "host-a/1"}
    assert all(floor > old.fence for floor in again.fence_floors.values())
    assert set(listed(stub, client)) == {"host-a/0", "host-a/1", "host-b/0"}
    new = acquire(stub, secrets)
    assert new.device.device_id == "host-a/0" and new.fence > old.fence

    # An agent the tracker does not know (or no longer knows) is not an error.
    assert deregister(stub, "host-gone", secrets.token(Role.AGENT)).removed == 0
    # The admin may deregister any agent.
    assert deregister(stub, "host-b", secrets.token(Role.ADMIN)).removed == 1
    assert set(listed(stub, client)) == {"host-a/0", "host-a/1"}


@pytest.mark.parametrize(
    ("role", "code"),
    [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        ("not-a-pool-token", grpc.StatusCode.UNAUTHENTICATED),
        (Role.CLIENT, grpc.StatusCode.PERMISSION_DENIED),
    ],
)
def test_deregister_without_the_agent_role_is_refused(
    stub: tracker_pb2_grpc.TrackerStub,
    secrets: PoolSecrets,
    role: Role | str | None,
    code: grpc.StatusCode,
) -> None:
    register(stub, secrets, "host-a", 2)
    token = secrets.token(role) if isinstance(role, Role) else role
    with pytest.raises(grpc.RpcError) as refused:
        deregister(stub, "host-a", token)
    assert refused.value.code() == code
    assert set(listed(stub, secrets.token(Role.CLIENT))) == {"host-a/0", "host-a/1"}


@pytest.mark.parametrize(
    ("agent_id", "details"),
    [
        ("", "agent_id must not be empty"),
        ("host a", "agent_id must be 1 to 128 characters of letters, digits and ._:/@+-"),
        ("h" * 129, "agent_id must be 1 to 128 characters"),
    ],
)
def test_a_malformed_agent_id_is_invalid_argument(
    stub: tracker_pb2_grpc.TrackerStub, secrets: PoolSecrets, agent_id: str, details: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        deregister(stub, agent_id, secrets.token(Role.AGENT))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details in (refused.value.details() or "")


# -- --lost-retention-s on a real kiln-tracker process ------------------------------------------


def start_tracker_process(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """A `python -m tracker` child on a free port; its process and address."""
    ready = tmp_path / "ready"
    log = tmp_path / "tracker.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tracker", "--listen", "127.0.0.1:0", "--ready-file", str(ready),
             "--startup-grace-s", "0", *flags],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + WAIT_S
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait(RPC_S)
            pytest.fail(f"tracker did not start:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.02)
    return process, ready.read_text().splitlines()[0]


def listed_plain(stub: tracker_pb2_grpc.TrackerStub) -> dict[str, int]:
    """`listed` on a tracker without token auth."""
    reply = stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=RPC_S)
    return {d.spec.device_id: d.state for d in reply.devices}


def test_lost_devices_disappear_after_the_retention_the_cli_sets(tmp_path: Path) -> None:
    """Agent "silent" stops heartbeating: LOST after 0.4 s, forgotten 0.5 s later; agent "alive"
    heartbeats throughout and stays."""
    process, address = start_tracker_process(
        tmp_path, "--heartbeat-interval-s", "0.2", "--lost-retention-s", "0.5"
    )
    try:
        with grpc.insecure_channel(address) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            for agent_id in ("silent", "alive"):
                stub.Register(
                    tracker_pb2.RegisterRequest(
                        agent_id=agent_id,
                        agent_address="127.0.0.1:7000",
                        devices=[common_pb2.DeviceSpec(key=KEY)],
                    ),
                    timeout=RPC_S,
                )
            seen: list[dict[str, int]] = []
            deadline = time.monotonic() + WAIT_S
            while "silent/0" in (devices := listed_plain(stub)):
                assert time.monotonic() < deadline, f"never pruned; last listing {devices}"
                seen.append(devices)
                assert stub.Heartbeat(
                    tracker_pb2.HeartbeatRequest(agent_id="alive"), timeout=RPC_S
                ).known
                time.sleep(0.05)
            assert devices == {"alive/0": tracker_pb2.FREE}
            assert {"silent/0": tracker_pb2.LOST, "alive/0": tracker_pb2.FREE} in seen
    finally:
        process.terminate()
        process.wait(RPC_S)

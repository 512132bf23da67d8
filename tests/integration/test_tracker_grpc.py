"""The Tracker gRPC service over a real server on 127.0.0.1, port 0."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc
from tracker import listing
from tracker.config import TrackerConfig
from tracker.errors import StoreUnavailable
from tracker.server import ServingTracker, create_server
from tuner.measure.tracker_client import TrackerClient

RPC_TIMEOUT_S = 10.0  # deadline on every call; no test should come near it


@pytest.fixture
def tracker() -> Iterator[ServingTracker]:
    # No startup grace: an Acquire no registered device matches is answered at once.
    config = TrackerConfig(heartbeat_interval_s=5.0, startup_grace_s=0.0)
    serving = create_server("127.0.0.1:0", config)
    try:
        yield serving
    finally:
        serving.stop(grace_s=0.5)


@pytest.fixture
def stub(tracker: ServingTracker) -> Iterator[Any]:
    with grpc.insecure_channel(tracker.address) as channel:
        yield tracker_pb2_grpc.TrackerStub(channel)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def register(stub: Any, agent_id: str = "agent-1", n: int = 1, key: str = "x86") -> None:
    devices = [common_pb2.DeviceSpec(key=key, tags={"arch": "x86_64"}) for _ in range(n)]
    request = tracker_pb2.RegisterRequest(
        agent_id=agent_id, agent_address="127.0.0.1:7000", devices=devices
    )
    response = stub.Register(request, timeout=RPC_TIMEOUT_S)
    assert response.heartbeat_interval_s == 5.0


def acquire(stub: Any, timeout_s: float = 0.0, **fields: Any) -> Any:
    request = tracker_pb2.AcquireRequest(timeout_s=timeout_s, **fields)
    return stub.Acquire(request, timeout=RPC_TIMEOUT_S)


def test_register_acquire_release_round_trip(stub: Any) -> None:
    register(stub)
    assert stub.Heartbeat(tracker_pb2.HeartbeatRequest(agent_id="agent-1"), timeout=5).known
    response = acquire(stub, key="x86", tag_selector={"arch": "x86_64"}, user="alice")
    assert response.status == common_pb2.OK, response.reason
    lease = response.lease
    assert (lease.device.device_id, lease.device.agent_address, lease.user) == (
        "agent-1/0",
        "127.0.0.1:7000",
        "alice",
    )
    assert len(lease.lease_id) == 32 and lease.token
    assert lease.expires_at_unix > time.time()
    [status] = stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices
    assert (status.state, status.lease_holder) == (tracker_pb2.LEASED, "alice")
    # The token carries the expiry in milliseconds: let the clock pass one, so
    # the renewal's expiry (and so its token) must differ.
    time.sleep(0.005)
    renew = stub.Renew(tracker_pb2.RenewRequest(lease_id=lease.lease_id), timeout=5)
    assert renew.status == common_pb2.OK
    # A fresh token for the new expiry, same fence (k1.<fence>.<expires_ms>.<mac>).
    assert renew.lease.token != lease.token
    assert renew.lease.token.split(".")[1] == lease.token.split(".")[1]
    assert renew.lease.expires_at_unix > lease.expires_at_unix
    release = tracker_pb2.ReleaseRequest(lease_id=lease.lease_id)
    assert stub.Release(release, timeout=5).released is True
    again = stub.Release(release, timeout=5)
    assert (again.released, again.reason) == (False, "lease released")
    renew = stub.Renew(tracker_pb2.RenewRequest(lease_id=lease.lease_id), timeout=5)
    assert (renew.status, renew.reason) == (common_pb2.DEVICE_LOST, "lease released")
    [status] = stub.ListDevices(tracker_pb2.ListDevicesRequest(key="x86"), timeout=5).devices
    assert status.state == tracker_pb2.FREE


def test_unknown_agent_heartbeat_is_not_known(stub: Any) -> None:
    assert not stub.Heartbeat(tracker_pb2.HeartbeatRequest(agent_id="ghost"), timeout=5).known


def test_busy_device_gives_no_device_within_the_deadline(stub: Any) -> None:
    register(stub)
    assert acquire(stub, key="x86").status == common_pb2.OK
    response = acquire(stub, timeout_s=0.2, key="x86")
    assert (response.status, response.reason) == (
        common_pb2.NO_DEVICE,
        "all 1 matching devices busy",
    )
    response = acquire(stub, key="arm")
    assert response.reason == "no registered device matches key='arm' tags={}"


@pytest.mark.parametrize(
    ("selector", "reason"),
    [
        ({"key": "arm"}, "no registered device matches key='arm' tags={}"),
        (
            {"key": "x86", "tag_selector": {"arch": "aarch64"}},
            "no registered device matches key='x86' tags={'arch': 'aarch64'}",
        ),
    ],
)
def test_unregistered_selector_gets_no_device_at_once(
    stub: Any, tracker: ServingTracker, selector: dict[str, Any], reason: str
) -> None:
    register(stub)
    future = stub.Acquire.future(
        tracker_pb2.AcquireRequest(timeout_s=60, **selector), timeout=60 + RPC_TIMEOUT_S
    )
    # Before fail-fast the tracker queued this request and answered only at its 60 s deadline.
    response = future.result(timeout=RPC_TIMEOUT_S)
    assert (response.status, response.reason) == (common_pb2.NO_DEVICE, reason)
    assert tracker.pool.waiting == 0
    [status] = stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices
    assert status.queue_depth == 0


def test_waiting_acquire_is_granted_on_release(stub: Any, tracker: ServingTracker) -> None:
    register(stub)
    held = acquire(stub, key="x86").lease
    future = stub.Acquire.future(
        tracker_pb2.AcquireRequest(key="x86", timeout_s=RPC_TIMEOUT_S, user="bob"),
        timeout=RPC_TIMEOUT_S,
    )
    wait_until(
        lambda: (
            stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices[0].queue_depth
            == 1
        )
    )
    stub.Release(tracker_pb2.ReleaseRequest(lease_id=held.lease_id), timeout=5)
    response = future.result(timeout=RPC_TIMEOUT_S)
    assert response.status == common_pb2.OK
    assert (response.lease.user, response.lease.device.device_id) == ("bob", "agent-1/0")
    assert tracker.pool.waiting == 0


def test_client_deadline_bounds_the_wait(stub: Any, tracker: ServingTracker) -> None:
    register(stub)
    acquire(stub, key="x86")
    request = tracker_pb2.AcquireRequest(key="x86", timeout_s=60)
    response = stub.Acquire(request, timeout=1.0)
    assert (response.status, response.reason) == (
        common_pb2.NO_DEVICE,
        "all 1 matching devices busy",
    )
    assert tracker.pool.waiting == 0


def test_cancelled_client_leaves_the_queue(stub: Any, tracker: ServingTracker) -> None:
    register(stub)
    acquire(stub, key="x86")
    future = stub.Acquire.future(
        tracker_pb2.AcquireRequest(key="x86", timeout_s=60), timeout=RPC_TIMEOUT_S
    )
    wait_until(lambda: tracker.pool.waiting == 1)
    future.cancel()
    wait_until(lambda: tracker.pool.waiting == 0)


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"agent_id": "", "devices": [{"key": "x86"}]}, "agent_id"),
        ({"agent_id": "a", "devices": [{"key": "x86"}, {"key": ""}]}, "devices[1].key"),
        (
            {"agent_id": "a", "devices": [{"device_id": "d", "key": "k"}] * 2},
            "devices[1].device_id",
        ),
    ],
)
def test_invalid_register_is_invalid_argument(
    stub: Any, request_fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as error:
        stub.Register(tracker_pb2.RegisterRequest(**request_fields), timeout=5)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in error.value.details()
    assert stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices == []


def test_unexpected_error_is_internal_and_server_keeps_serving(
    stub: Any, tracker: ServingTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("store exploded")

    monkeypatch.setattr(tracker.pool, "list_page", broken)
    with pytest.raises(grpc.RpcError) as error:
        stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5)
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert "store exploded" in error.value.details()
    monkeypatch.undo()
    register(stub)
    assert len(stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices) == 1


def test_reaper_marks_silent_agent_lost_and_renew_reports_it() -> None:
    config = TrackerConfig(heartbeat_interval_s=0.1, reap_interval_s=0.05)
    serving = create_server("127.0.0.1:0", config)
    try:
        with grpc.insecure_channel(serving.address) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            device = common_pb2.DeviceSpec(key="x86")
            stub.Register(tracker_pb2.RegisterRequest(agent_id="a", devices=[device]), timeout=5)
            lease = acquire(stub, key="x86").lease
            # The agent never heartbeats, so the reaper thread must expire it on its own.
            wait_until(
                lambda: (
                    stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices[0].state
                    == tracker_pb2.LOST
                )
            )
            renew = stub.Renew(tracker_pb2.RenewRequest(lease_id=lease.lease_id), timeout=5)
            assert (renew.status, renew.reason) == (
                common_pb2.DEVICE_LOST,
                "device lost: agent stopped heartbeating",
            )
            heartbeat = stub.Heartbeat(tracker_pb2.HeartbeatRequest(agent_id="a"), timeout=5)
            assert heartbeat.known is False
    finally:
        serving.stop(grace_s=0.5)
    assert not serving.reaper.running


def test_second_tracker_on_a_taken_port_fails(tracker: ServingTracker) -> None:
    with pytest.raises(OSError, match=str(tracker.port)):
        create_server(tracker.address)


def test_malformed_bytes_are_invalid_argument_and_server_keeps_serving(
    tracker: ServingTracker, stub: Any
) -> None:
    with grpc.insecure_channel(tracker.address) as channel:
        raw_register = channel.unary_unary("/kiln.v1.Tracker/Register")
        # Field 1 (agent_id) says 255 bytes follow, but only 2 do: a truncated message.
        with pytest.raises(grpc.RpcError) as error:
            raw_register(b"\x0a\xff\x01\x02", timeout=RPC_TIMEOUT_S)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request to /kiln.v1.Tracker/Register" in error.value.details()
    assert stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices == []
    register(stub)
    assert len(stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices) == 1


def test_oversized_register_is_resource_exhausted() -> None:
    limit = 64 * 1024
    serving = create_server("127.0.0.1:0", TrackerConfig(max_message_bytes=limit))
    try:
        with grpc.insecure_channel(serving.address) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            huge = common_pb2.DeviceSpec(key="x86", tags={"blob": "x" * (2 * limit)})
            with pytest.raises(grpc.RpcError) as error:
                stub.Register(
                    tracker_pb2.RegisterRequest(agent_id="big", devices=[huge]),
                    timeout=RPC_TIMEOUT_S,
                )
            assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert str(limit) in error.value.details()
            assert stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices == []
            small = common_pb2.DeviceSpec(key="x86")
            stub.Register(tracker_pb2.RegisterRequest(agent_id="ok", devices=[small]), timeout=5)
            assert len(stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5).devices) == 1
    finally:
        serving.stop(grace_s=0.5)


def test_store_unavailable_is_unavailable_with_the_reason(
    stub: Any, tracker: ServingTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real outage of the redis store is tested with the redis store; here only the mapping.
    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("redis at 127.0.0.1:1: connection refused")

    monkeypatch.setattr(tracker.pool, "start_acquire", down)
    with pytest.raises(grpc.RpcError) as error:
        acquire(stub, key="x86")
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "redis at 127.0.0.1:1: connection refused" in error.value.details()
    monkeypatch.undo()
    register(stub)
    assert acquire(stub, key="x86").status == common_pb2.OK


def test_acquire_without_a_client_deadline_is_served(stub: Any) -> None:
    register(stub)
    response = stub.Acquire(tracker_pb2.AcquireRequest(key="x86"))  # no timeout= on purpose
    assert response.status == common_pb2.OK


def test_list_devices_pages_by_id_and_the_client_follows_every_page(
    stub: Any, tracker: ServingTracker
) -> None:
    for agent in ("a", "b", "c"):
        register(stub, agent_id=agent, n=200)
    first = stub.ListDevices(tracker_pb2.ListDevicesRequest(page_size=2), timeout=5)
    assert [d.spec.device_id for d in first.devices] == ["a/0", "a/1"]
    assert first.next_page_token == "a/1"
    second = stub.ListDevices(
        tracker_pb2.ListDevicesRequest(page_size=2, page_token=first.next_page_token), timeout=5
    )
    assert [d.spec.device_id for d in second.devices] == ["a/10", "a/100"]
    default = stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=5)
    assert len(default.devices) == listing.DEFAULT_PAGE_SIZE and default.next_page_token
    last = stub.ListDevices(
        tracker_pb2.ListDevicesRequest(page_size=1000, page_token="c/5"), timeout=5
    )
    assert last.next_page_token == ""
    with pytest.raises(grpc.RpcError) as error:
        stub.ListDevices(tracker_pb2.ListDevicesRequest(page_size=-1), timeout=5)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    client = TrackerClient(tracker.address)
    try:
        ids = [d.spec.device_id for d in client.list_devices().devices]
    finally:
        client.close()
    assert len(ids) == 600 == len(set(ids)) and ids == sorted(ids)


def test_register_answers_a_fence_floor_per_device(stub: Any) -> None:
    register(stub, n=2)
    lease = acquire(stub, key="x86").lease
    floors = stub.Register(
        tracker_pb2.RegisterRequest(
            agent_id="agent-1",
            agent_address="127.0.0.1:7000",
            devices=[common_pb2.DeviceSpec(key="x86", tags={"arch": "x86_64"})] * 2,
        ),
        timeout=5,
    ).fence_floors
    held = lease.device.device_id
    other = ({"agent-1/0", "agent-1/1"} - {held}).pop()
    # The lease that survives the re-register keeps its fence valid; the free device's floor is
    # above every fence granted on it before.
    assert floors[held] == lease.fence
    assert floors[other] > lease.fence

"""Health service and Prometheus metrics of a real tracker server on 127.0.0.1, port 0."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc
from tracker.config import TrackerConfig
from tracker.server import ServingTracker, create_server

RPC_TIMEOUT_S = 10.0
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of the endpoint, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=RPC_TIMEOUT_S) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def tracker() -> Iterator[ServingTracker]:
    config = TrackerConfig(heartbeat_interval_s=0.2, reap_interval_s=0.05)
    serving = create_server("127.0.0.1:0", config, metrics_port=0)
    try:
        yield serving
    finally:
        serving.stop(grace_s=0.5)


@pytest.fixture
def stub(tracker: ServingTracker) -> Iterator[Any]:
    with grpc.insecure_channel(tracker.address) as channel:
        yield tracker_pb2_grpc.TrackerStub(channel)


def register(stub: Any, agent_id: str, key: str, n: int) -> None:
    devices = [common_pb2.DeviceSpec(key=key) for _ in range(n)]
    stub.Register(
        tracker_pb2.RegisterRequest(agent_id=agent_id, agent_address="h:1", devices=devices),
        timeout=RPC_TIMEOUT_S,
    )


def devices_metric(samples: Samples, key: str, state: str) -> float:
    return samples[("kiln_tracker_devices", (("key", key), ("state", state)))]


def test_metrics_show_devices_queue_waits_grants_and_expiries(
    tracker: ServingTracker, stub: Any
) -> None:
    assert tracker.metrics_url.startswith("http://127.0.0.1:")
    register(stub, "arm-host", "arm", 1)
    register(stub, "x86-host", "x86", 2)
    # Keep the x86 agent alive by heartbeating it; the arm agent stays silent and is expired.
    lease = stub.Acquire(tracker_pb2.AcquireRequest(key="x86"), timeout=RPC_TIMEOUT_S).lease
    stub.Acquire(tracker_pb2.AcquireRequest(key="x86"), timeout=RPC_TIMEOUT_S)
    waiter = stub.Acquire.future(
        tracker_pb2.AcquireRequest(key="x86", timeout_s=RPC_TIMEOUT_S), timeout=RPC_TIMEOUT_S
    )

    def x86_alive_and_arm_lost() -> bool:
        stub.Heartbeat(tracker_pb2.HeartbeatRequest(agent_id="x86-host"), timeout=RPC_TIMEOUT_S)
        samples = scrape(tracker.metrics_url)
        return (
            devices_metric(samples, "arm", "lost") == 1
            and samples.get(("kiln_tracker_queue_depth", (("key", "x86"),))) == 1
        )

    wait_until(x86_alive_and_arm_lost)
    samples = scrape(tracker.metrics_url)
    assert devices_metric(samples, "x86", "leased") == 2
    assert devices_metric(samples, "x86", "free") == 0
    assert devices_metric(samples, "arm", "free") == 0
    assert samples[("kiln_tracker_agents_lost_total", ())] == 1
    assert samples[("kiln_tracker_devices_lost_total", ())] == 1
    assert samples[("kiln_tracker_lease_grants_total", ())] == 2
    assert samples[("kiln_tracker_lease_wait_seconds_count", (("outcome", "granted"),))] == 2
    assert samples[("kiln_tracker_store_up", ())] == 1

    stub.Release(tracker_pb2.ReleaseRequest(lease_id=lease.lease_id), timeout=RPC_TIMEOUT_S)
    assert waiter.result(timeout=RPC_TIMEOUT_S).status == common_pb2.OK
    samples = scrape(tracker.metrics_url)
    assert samples[("kiln_tracker_lease_grants_total", ())] == 3
    assert ("kiln_tracker_queue_depth", (("key", "x86"),)) not in samples
    # The waiter's wait is in the histogram's sum: it is at least as long as the other two.
    assert samples[("kiln_tracker_lease_wait_seconds_sum", (("outcome", "granted"),))] > 0


def test_lease_expiry_is_counted() -> None:
    config = TrackerConfig(heartbeat_interval_s=5.0, reap_interval_s=0.05, default_lease_ttl_s=0.2)
    serving = create_server("127.0.0.1:0", config, metrics_port=0)
    try:
        with grpc.insecure_channel(serving.address) as channel:
            own = tracker_pb2_grpc.TrackerStub(channel)
            register(own, "a", "x86", 1)
            response = own.Acquire(tracker_pb2.AcquireRequest(key="x86"), timeout=RPC_TIMEOUT_S)
            assert response.status == common_pb2.OK
            wait_until(
                lambda: (
                    scrape(serving.metrics_url).get(("kiln_tracker_leases_expired_total", ())) == 1
                )
            )
            assert devices_metric(scrape(serving.metrics_url), "x86", "free") == 1
    finally:
        serving.stop(grace_s=0.5)


def test_two_trackers_in_one_process_keep_their_own_metrics(tracker: ServingTracker) -> None:
    other = create_server("127.0.0.1:0", metrics_port=0)
    try:
        with grpc.insecure_channel(other.address) as channel:
            register(tracker_pb2_grpc.TrackerStub(channel), "b", "gpu", 3)
        assert devices_metric(scrape(other.metrics_url), "gpu", "free") == 3
        assert ("kiln_tracker_devices", (("key", "gpu"), ("state", "free"))) not in scrape(
            tracker.metrics_url
        )
    finally:
        other.stop(grace_s=0.5)


def test_health_is_serving_then_not_serving_during_graceful_stop() -> None:
    serving = create_server("127.0.0.1:0")
    with grpc.insecure_channel(serving.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = health.Check(
            health_pb2.HealthCheckRequest(service="kiln.v1.Tracker"), timeout=RPC_TIMEOUT_S
        )
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
        first = next(watch)
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        serving.stop(grace_s=0.5)
        seen = []
        with pytest.raises(grpc.RpcError):
            for response in watch:
                seen.append(response.status)
        assert seen == [health_pb2.HealthCheckResponse.NOT_SERVING]

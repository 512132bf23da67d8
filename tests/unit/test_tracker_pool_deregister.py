"""DevicePool.deregister: validation, leases it ends, waiters it leaves queued; fake clock, no
sockets (the store contract tests cover both stores, tests/system/test_tracker_deregister.py the
RPC)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from protos.aio_loop import LoopThread
from tracker.config import TrackerConfig
from tracker.errors import InvalidArgument, LeaseLost
from tracker.model import AcquireResult, DeviceSpec, DeviceState, Lease, LeaseRequest
from tracker.pool import DevicePool
from tracker.store.memory import MemoryStore
from tracker.testing import BlockingPool

CONFIG = TrackerConfig(heartbeat_interval_s=2.0, startup_grace_s=0.0)
WAIT_S = 5.0  # bound on every wait in these tests; none should come near it


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    loop = LoopThread("test-pool-loop")
    yield loop
    loop.stop()


@pytest.fixture
def pool(loop: LoopThread) -> Iterator[BlockingPool]:
    pool = BlockingPool(DevicePool(MemoryStore(), CONFIG, clock=FakeClock()), loop)
    yield pool
    pool.close()


def take(pool: BlockingPool, key: str) -> Lease:
    result = pool.acquire(LeaseRequest(key=key))
    assert result.lease is not None, result.reason
    return result.lease


def acquire_in_thread(
    pool: BlockingPool, request: LeaseRequest
) -> tuple[threading.Thread, list[AcquireResult]]:
    results: list[AcquireResult] = []
    thread = threading.Thread(target=lambda: results.append(pool.acquire(request)), daemon=True)
    thread.start()
    return thread, results


def wait_for_waiters(pool: BlockingPool, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while pool.waiting != count:
        assert time.monotonic() < deadline, f"never {count} waiters"
        time.sleep(0.005)


@pytest.mark.parametrize(
    ("agent_id", "message"),
    [
        ("", "agent_id must not be empty"),
        ("has space", "agent_id must be 1 to 128 characters"),
        ("x" * 129, "agent_id must be 1 to 128 characters"),
        ("a|b", "agent_id must be 1 to 128 characters"),
    ],
)
def test_a_malformed_agent_id_is_invalid(pool: BlockingPool, agent_id: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        pool.deregister(agent_id)


def test_deregister_counts_devices_logs_once_and_ends_leases(
    pool: BlockingPool, caplog: pytest.LogCaptureFixture
) -> None:
    pool.register("a", "a.local:9000", [DeviceSpec("", "k"), DeviceSpec("", "k")])
    pool.register("b", "b.local:9000", [DeviceSpec("", "j")])
    lease = take(pool, "k")
    with caplog.at_level(logging.INFO, logger="tracker.pool"):
        assert pool.deregister("a") == 2
        assert pool.deregister("a") == 0
        assert pool.deregister("never-seen") == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "tracker.pool"]
    assert lines == [
        f"agent a deregistered 2 devices, ending leases {lease.lease_id}",
        "agent a deregistered 0 devices",
        "agent never-seen deregistered 0 devices",
    ]
    assert [(s.spec.device_id, s.state) for s in pool.list_devices()] == [("b/0", DeviceState.FREE)]
    with pytest.raises(LeaseLost, match="device lost: agent deregistered"):
        pool.renew(lease.lease_id)
    assert pool.heartbeat("a") is False


def test_waiters_stay_queued_for_the_other_devices(pool: BlockingPool) -> None:
    pool.register("a", "a.local:9000", [DeviceSpec("", "k")])
    pool.register("b", "b.local:9000", [DeviceSpec("", "k")])
    take(pool, "k")
    held = take(pool, "k")
    thread, results = acquire_in_thread(pool, LeaseRequest(key="k", timeout_s=WAIT_S))
    wait_for_waiters(pool, 1)
    pool.deregister("a")
    assert pool.waiting == 1 and not results
    pool.release(held.lease_id)
    thread.join(WAIT_S)
    [result] = results
    assert result.lease is not None and result.lease.device.device_id == "b/0"


def test_a_waiter_that_now_matches_nothing_waits_out_its_deadline(pool: BlockingPool) -> None:
    pool.register("a", "a.local:9000", [DeviceSpec("", "only")])
    take(pool, "only")
    thread, results = acquire_in_thread(pool, LeaseRequest(key="only", timeout_s=0.3))
    wait_for_waiters(pool, 1)
    pool.deregister("a")
    assert pool.waiting == 1  # not answered at once: it keeps its place until its deadline
    thread.join(WAIT_S)
    [result] = results
    assert (result.lease, result.reason) == (
        None,
        "no registered device matches key='only' tags={}",
    )

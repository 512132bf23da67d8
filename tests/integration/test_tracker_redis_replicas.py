"""DevicePools over one real redis-server: replicas, cross-replica wake-ups, restarts, Redis blips.

No reaper runs in these tests unless one is started on purpose, so a waiter on one replica that
gets a device freed on another was woken by the store's pub/sub channel. Each replica's pool and
store run on a loop thread of their own, as in a tracker process (tracker.testing.BlockingPool).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from protos.aio_loop import LoopThread
from tracker import pool as pool_module
from tracker.config import TrackerConfig
from tracker.errors import StoreUnavailable
from tracker.model import AcquireResult, DeviceSpec, LeaseRequest
from tracker.pool import DevicePool
from tracker.store import open_store
from tracker.store.base import TrackerStore
from tracker.testing import Blocking, BlockingPool, RedisServer

WAIT_S = 20.0  # bound on every wait; none should come near it
CONFIG = TrackerConfig(heartbeat_interval_s=5.0, default_lease_ttl_s=30.0)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return redis_server.url(prefix=f"replicas-{uuid.uuid4().hex[:12]}:")


class Replicas:
    """DevicePools over their own RedisStore objects on one URL; closes them all."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stores: list[Blocking[TrackerStore]] = []
        self.pools: list[BlockingPool] = []
        self.loops: list[LoopThread] = []

    def start(self, config: TrackerConfig = CONFIG) -> BlockingPool:
        loop = LoopThread(f"replica-{len(self.loops)}")
        self.loops.append(loop)
        store = Blocking(open_store(self.url), loop)
        self.stores.append(store)
        pool = BlockingPool(DevicePool(store.target, config), loop)
        self.pools.append(pool)
        pool.start()
        return pool

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
        for store in self.stores:
            store.close()
        for loop in self.loops:
            loop.stop()


@pytest.fixture
def replicas(url: str) -> Iterator[Replicas]:
    group = Replicas(url)
    yield group
    group.close()


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def start_acquire(
    pool: BlockingPool, results: dict[str, AcquireResult], name: str, **request: Any
) -> threading.Thread:
    def run() -> None:
        results[name] = pool.acquire(LeaseRequest(timeout_s=WAIT_S, **request))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def register(pool: BlockingPool, agent_id: str, count: int, key: str = "k") -> None:
    pool.register(agent_id, f"{agent_id}:1", [DeviceSpec("", key) for _ in range(count)])


def queued_ids(pool: BlockingPool, store: Blocking[TrackerStore]) -> list[str]:
    return [ticket.request_id for ticket, _ in store.queued(time.time())]


def test_replicas_never_grant_one_device_twice(replicas: Replicas) -> None:
    pools = [replicas.start(), replicas.start()]
    register(pools[0], "agent", 3)
    holders: dict[str, str] = {}
    violations: list[str] = []
    results: list[bool] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        pool = pools[index % 2]
        for round_ in range(3):
            name = f"w{index}.{round_}"
            result = pool.acquire(LeaseRequest(key="k", timeout_s=WAIT_S, user=name))
            with lock:
                results.append(result.lease is not None)
            if result.lease is None:
                return
            device = result.lease.device.device_id
            with lock:
                if device in holders:
                    violations.append(f"{device}: {name} granted while {holders[device]} holds it")
                holders[device] = name
            time.sleep(0.002)
            with lock:
                if holders.get(device) == name:
                    del holders[device]
            assert pool.release(result.lease.lease_id).released

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 3)
    assert not any(thread.is_alive() for thread in threads)
    assert violations == []
    assert results == [True] * 24
    assert all(status.state.value == "free" for status in pools[1].list_devices())


def test_a_release_on_one_replica_wakes_a_waiter_on_another(replicas: Replicas) -> None:
    waiting_side, releasing_side = replicas.start(), replicas.start()
    register(releasing_side, "agent", 1)
    held = releasing_side.acquire(LeaseRequest(key="k")).lease
    assert held is not None
    results: dict[str, AcquireResult] = {}
    thread = start_acquire(waiting_side, results, "waiter", key="k", request_id="waiter")
    wait_until(lambda: waiting_side.waiting == 1)
    assert releasing_side.release(held.lease_id).released
    thread.join(WAIT_S)
    lease = results["waiter"].lease
    assert lease is not None and lease.device.device_id == "agent/0"


def test_devices_registered_on_one_replica_are_known_to_another(replicas: Replicas) -> None:
    """Fail fast reads the shared registrations: unknown selectors end at once, busy ones wait."""
    fail_fast = dataclasses.replace(CONFIG, startup_grace_s=0.0)
    registering_side, asking_side = replicas.start(fail_fast), replicas.start(fail_fast)
    register(registering_side, "agent", 1)
    held = registering_side.acquire(LeaseRequest(key="k")).lease
    assert held is not None
    results: dict[str, AcquireResult] = {}
    unknown = start_acquire(asking_side, results, "unknown", key="nope", request_id="unknown")
    unknown.join(WAIT_S / 2)  # well before its WAIT_S deadline
    assert results["unknown"].reason == "no registered device matches key='nope' tags={}"
    busy = start_acquire(asking_side, results, "busy", key="k", request_id="busy")
    wait_until(lambda: asking_side.waiting == 1)
    assert "busy" not in results
    registering_side.release(held.lease_id)
    busy.join(WAIT_S)
    assert results["busy"].lease is not None
    assert queued_ids(asking_side, replicas.stores[1]) == []


def test_priority_holds_across_replicas(replicas: Replicas) -> None:
    low_side, high_side = replicas.start(), replicas.start()
    register(low_side, "agent", 1)
    held = low_side.acquire(LeaseRequest(key="k")).lease
    assert held is not None
    results: dict[str, AcquireResult] = {}
    low = start_acquire(low_side, results, "low", key="k", priority=0, request_id="low")
    wait_until(lambda: low_side.waiting == 1)
    high = start_acquire(high_side, results, "high", key="k", priority=7, request_id="high")
    wait_until(lambda: high_side.waiting == 1)
    low_side.release(held.lease_id)  # freed on the low side, yet the high one elsewhere gets it
    high.join(WAIT_S)
    high_lease = results["high"].lease
    assert high_lease is not None and "low" not in results
    high_side.release(high_lease.lease_id)
    low.join(WAIT_S)
    assert results["low"].lease is not None


def test_queued_requests_survive_a_tracker_restart(replicas: Replicas, url: str) -> None:
    before = replicas.start()
    register(before, "agent", 1)
    held = before.acquire(LeaseRequest(key="k")).lease
    assert held is not None
    results: dict[str, AcquireResult] = {}
    first = start_acquire(before, results, "x", key="k", request_id="x")
    wait_until(lambda: before.waiting == 1)
    second = start_acquire(before, results, "y", key="k", request_id="y")
    wait_until(lambda: before.waiting == 2)
    before.close()  # the tracker stops; its queue entries stay in Redis for a while
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert results["x"].reason == pool_module.REASON_SHUTTING_DOWN
    after = replicas.start()  # a new process over the same Redis
    assert queued_ids(after, replicas.stores[-1]) == ["x", "y"]
    results.clear()
    retry_y = start_acquire(after, results, "y", key="k", request_id="y")  # y comes back first
    wait_until(lambda: after.waiting == 1)
    retry_x = start_acquire(after, results, "x", key="k", request_id="x")
    wait_until(lambda: after.waiting == 2)
    assert after.renew(held.lease_id).fence == held.fence  # the lease survived too
    after.release(held.lease_id)
    retry_x.join(WAIT_S)
    x_lease = results["x"].lease
    assert x_lease is not None and "y" not in results
    assert x_lease.fence > held.fence
    after.release(x_lease.lease_id)
    retry_y.join(WAIT_S)
    assert results["y"].lease is not None


def test_redis_outage_is_store_unavailable_and_heals(tmp_path: Path) -> None:
    with RedisServer(tmp_path, persistent=True) as server:
        group = Replicas(server.url(prefix="blip:"))
        try:
            waiting_side, releasing_side = group.start(), group.start()
            register(releasing_side, "agent", 1)
            held = releasing_side.acquire(LeaseRequest(key="k")).lease
            assert held is not None
            server.stop()
            with pytest.raises(StoreUnavailable, match=r"redis store redis://127\.0\.0\.1:\d+"):
                releasing_side.heartbeat("agent")
            with pytest.raises(StoreUnavailable):
                waiting_side.acquire(LeaseRequest(key="k"))
            server.start()
            assert releasing_side.heartbeat("agent") is True  # state persisted, connection back
            results: dict[str, AcquireResult] = {}
            thread = start_acquire(waiting_side, results, "w", key="k", request_id="w")
            wait_until(lambda: waiting_side.waiting == 1)
            releasing_side.release(held.lease_id)  # the watcher re-subscribed after the outage
            thread.join(WAIT_S)
            assert results["w"].lease is not None
        finally:
            group.close()


def test_unreachable_redis_names_the_url() -> None:
    group = Replicas("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(StoreUnavailable, match=r"127\.0\.0\.1:1"):
            register(group.start(), "agent", 1)
    finally:
        group.close()

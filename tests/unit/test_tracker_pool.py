"""DevicePool: validation, waiting, priority order, reasons, expiry; fake clock, no sockets.

The pool's methods are coroutines: the tests call them through tracker.testing.BlockingPool on one
loop thread per module, and a waiting Acquire is a thread blocked on such a call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from protos.aio_loop import LoopThread
from tracker import pool as pool_module
from tracker.config import TrackerConfig
from tracker.errors import InvalidArgument, LeaseLost
from tracker.model import AcquireResult, DeviceSpec, DeviceState, Lease, LeaseRequest
from tracker.pool import DevicePool
from tracker.store.memory import MemoryStore
from tracker.testing import Blocking, BlockingPool
from tracker.waitqueue import Waiter

# No startup grace: these pools are not restarts, so an unknown selector fails fast at once.
CONFIG = TrackerConfig(
    heartbeat_interval_s=2.0, default_lease_ttl_s=30.0, max_lease_ttl_s=60.0, startup_grace_s=0.0
)
WAIT_S = 5.0  # bound on every wait in these tests; none should come near it


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    loop = LoopThread("test-pool-loop")
    yield loop
    loop.stop()


def new_pool(
    loop: LoopThread,
    clock: FakeClock,
    store: MemoryStore | None = None,
    config: TrackerConfig = CONFIG,
) -> BlockingPool:
    return BlockingPool(DevicePool(store or MemoryStore(), config, clock=clock), loop)


@pytest.fixture
def pool(clock: FakeClock, loop: LoopThread) -> Iterator[BlockingPool]:
    pool = new_pool(loop, clock)
    yield pool
    pool.close()


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def wait_for_waiters(pool: BlockingPool, count: int) -> None:
    wait_until(lambda: pool.waiting == count)


def register(pool: BlockingPool, agent_id: str, *specs: DeviceSpec) -> None:
    pool.register(agent_id, f"{agent_id}.local:9000", specs)


def take(pool: BlockingPool, **request: Any) -> Lease:
    result = pool.acquire(LeaseRequest(**request))
    assert result.lease is not None, result.reason
    return result.lease


def start_acquire(
    pool: BlockingPool, results: list[tuple[str, AcquireResult]], name: str, **request: Any
) -> threading.Thread:
    """Acquire in a thread; on a grant, record the name and release at once."""

    def run() -> None:
        result = pool.acquire(LeaseRequest(timeout_s=WAIT_S, **request))
        results.append((name, result))
        if result.lease is not None:
            pool.release(result.lease.lease_id)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_acquire_by_key_and_tags(pool: BlockingPool) -> None:
    register(
        pool,
        "a",
        DeviceSpec("", "arm", {"board": "rk3399"}),
        DeviceSpec("", "arm", {"board": "rpi4"}),
        DeviceSpec("", "x86"),
    )
    lease = take(pool, key="arm", tag_selector={"board": "rpi4"}, user="bob")
    assert (lease.device.device_id, lease.device.agent_address, lease.user) == (
        "a/1",
        "a.local:9000",
        "bob",
    )
    assert take(pool, key="x86").device.device_id == "a/2"
    assert take(pool).device.device_id == "a/0"


def test_no_match_and_all_busy_have_distinct_reasons(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "arm", {"board": "rk3399"}), DeviceSpec("", "arm"))
    result = pool.acquire(LeaseRequest(key="arm", tag_selector={"board": "rpi4"}))
    assert result.lease is None
    assert result.reason == "no registered device matches key='arm' tags={'board': 'rpi4'}"
    take(pool, key="arm")
    take(pool, key="arm")
    result = pool.acquire(LeaseRequest(key="arm", timeout_s=0.05))
    assert (result.lease, result.reason) == (None, "all 2 matching devices busy")
    assert pool.waiting == 0


def test_lost_devices_reason(pool: BlockingPool, clock: FakeClock) -> None:
    register(pool, "a", DeviceSpec("", "arm"))
    clock.advance(CONFIG.agent_timeout_s + 1)
    pool.reap()
    result = pool.acquire(LeaseRequest(key="arm"))
    assert result.reason == "no live device matches key='arm' tags={}: all 1 matching devices lost"


def acquire_in_thread(
    pool: BlockingPool, request: LeaseRequest
) -> tuple[threading.Thread, list[AcquireResult]]:
    results: list[AcquireResult] = []
    thread = threading.Thread(target=lambda: results.append(pool.acquire(request)), daemon=True)
    thread.start()
    return thread, results


@pytest.mark.parametrize(
    ("request_fields", "reason"),
    [
        ({"key": "x86"}, "no registered device matches key='x86' tags={}"),
        (
            {"key": "arm", "tag_selector": {"board": "rpi4"}},
            "no registered device matches key='arm' tags={'board': 'rpi4'}",
        ),
        (
            {"tag_selector": {"board": "rpi4"}},
            "no registered device matches key='' tags={'board': 'rpi4'}",
        ),
        ({"key": "x86", "request_id": "r1"}, "no registered device matches key='x86' tags={}"),
    ],
)
def test_unregistered_selector_fails_at_once_despite_a_long_timeout(
    pool: BlockingPool, request_fields: dict[str, Any], reason: str
) -> None:
    register(pool, "a", DeviceSpec("", "arm", {"board": "rk3399"}))
    take(pool, key="arm")  # busy devices of other selectors do not make it wait either
    started = time.monotonic()
    # In a thread, so that the old behaviour (waiting the full 60 s) fails within WAIT_S.
    thread, results = acquire_in_thread(pool, LeaseRequest(timeout_s=60.0, **request_fields))
    thread.join(WAIT_S)
    assert not thread.is_alive(), "an unregistered selector waited for its deadline"
    assert time.monotonic() - started < 1.0
    assert (results[0].lease, results[0].reason) == (None, reason)
    assert pool.waiting == 0
    assert pool.queue_depths() == {}  # never queued, so it blocked nobody


def test_busy_devices_still_make_a_request_wait(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    held = take(pool, key="k")
    thread, results = acquire_in_thread(pool, LeaseRequest(key="k", timeout_s=60.0))
    wait_for_waiters(pool, 1)
    time.sleep(0.2)  # a fail-fast answer would have come by now
    assert results == [] and thread.is_alive()
    pool.release(held.lease_id)
    thread.join(WAIT_S)
    assert results[0].lease is not None and results[0].lease.device.device_id == "a/0"


def test_lost_devices_make_a_request_wait_for_their_agent(
    pool: BlockingPool, clock: FakeClock
) -> None:
    """A LOST device is known: its agent usually registers again under its old id."""
    register(pool, "a", DeviceSpec("", "k"))
    clock.advance(CONFIG.agent_timeout_s + 1)
    assert pool.reap().lost_devices == ("a/0",)
    thread, results = acquire_in_thread(pool, LeaseRequest(key="k", timeout_s=60.0))
    wait_for_waiters(pool, 1)
    assert results == []
    register(pool, "a", DeviceSpec("", "k"))
    thread.join(WAIT_S)
    assert results[0].lease is not None and results[0].lease.device.device_id == "a/0"


def test_within_the_startup_grace_an_unregistered_selector_waits(
    clock: FakeClock, loop: LoopThread
) -> None:
    """A restarted tracker knows no device until its agents register again."""
    pool = new_pool(loop, clock, config=dataclasses.replace(CONFIG, startup_grace_s=60.0))
    try:
        thread, results = acquire_in_thread(pool, LeaseRequest(key="k", timeout_s=WAIT_S))
        wait_for_waiters(pool, 1)
        register(pool, "a", DeviceSpec("", "k"))
        thread.join(WAIT_S)
        assert results[0].lease is not None
    finally:
        pool.close()


def test_the_startup_grace_ends_with_the_unregistered_reason(
    clock: FakeClock, loop: LoopThread
) -> None:
    pool = new_pool(loop, clock, config=dataclasses.replace(CONFIG, startup_grace_s=0.5))
    try:
        thread, results = acquire_in_thread(pool, LeaseRequest(key="k", timeout_s=60.0))
        thread.join(WAIT_S)  # answered when the grace ends, not at the 60 s deadline
        assert not thread.is_alive()
        assert results[0].reason == "no registered device matches key='k' tags={}"
        assert pool.waiting == 0 and pool.queue_depths() == {}
        later = pool.acquire(LeaseRequest(key="k", timeout_s=60.0))
        assert later.reason == "no registered device matches key='k' tags={}"
    finally:
        pool.close()


class SlowLookupStore(MemoryStore):
    """A store whose device listing for key "slow" blocks until `go` is set (a Redis round trip
    that takes its time)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.go = threading.Event()

    async def devices(self, key: str = "", after: str = "", limit: int = 0) -> list[Any]:
        if key == "slow":
            self.entered.set()
            deadline = time.monotonic() + WAIT_S
            while not self.go.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        return await super().devices(key, after, limit)


def test_the_check_at_the_end_of_the_grace_does_not_stall_other_waiters(
    clock: FakeClock, loop: LoopThread
) -> None:
    """A slow answer from the store for one waiter's selector must not hold up a grant to
    another."""
    store = SlowLookupStore()
    pool = new_pool(loop, clock, store, dataclasses.replace(CONFIG, startup_grace_s=0.3))
    try:
        register(pool, "a", DeviceSpec("", "k"))
        held = take(pool, key="k")
        slow, slow_results = acquire_in_thread(pool, LeaseRequest(key="slow", timeout_s=60.0))
        assert store.entered.wait(WAIT_S)  # the grace ended; its check is in the store now
        other, other_results = acquire_in_thread(pool, LeaseRequest(key="k", timeout_s=WAIT_S))
        wait_for_waiters(pool, 2)
        pool.release(held.lease_id)
        other.join(WAIT_S)
        assert other_results and other_results[0].lease is not None
        assert slow.is_alive()  # still in the store: the grant did not wait for it
        store.go.set()
        slow.join(WAIT_S)
        assert slow_results[0].reason == "no registered device matches key='slow' tags={}"
    finally:
        store.go.set()
        pool.close()


def test_priority_then_fifo(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    held = take(pool, key="k")
    results: list[tuple[str, AcquireResult]] = []
    threads = []
    for name, priority in [("low", 0), ("high-1", 5), ("high-2", 5), ("mid", 1)]:
        threads.append(start_acquire(pool, results, name, key="k", priority=priority))
        wait_for_waiters(pool, len(threads))
    pool.release(held.lease_id)
    for thread in threads:
        thread.join(WAIT_S)
    assert [name for name, _ in results] == ["high-1", "high-2", "mid", "low"]
    assert all(result.lease is not None for _, result in results)


def test_new_request_does_not_jump_the_queue(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    held = take(pool, key="k")
    results: list[tuple[str, AcquireResult]] = []
    waiter = start_acquire(pool, results, "waiter", key="k")
    wait_until(lambda: pool.waiting == 1)
    pool.release(held.lease_id)
    waiter.join(WAIT_S)
    assert [name for name, _ in results] == ["waiter"]


def test_waiter_is_granted_a_device_freed_by_lease_expiry(
    pool: BlockingPool, clock: FakeClock
) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    take(pool, key="k", lease_ttl_s=10)
    results: list[tuple[str, AcquireResult]] = []
    waiter = start_acquire(pool, results, "waiter", key="k")
    wait_until(lambda: pool.waiting == 1)
    for _ in range(3):  # 11 s: past the lease TTL, with the agent heartbeating throughout
        clock.advance(11 / 3)
        pool.heartbeat("a")
    assert pool.reap().ended_leases != ()
    waiter.join(WAIT_S)
    assert [(name, result.lease is not None) for name, result in results] == [("waiter", True)]


def test_cancelled_request_leaves_the_queue(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    take(pool, key="k")
    cancelled = threading.Event()
    results: list[AcquireResult] = []
    thread = threading.Thread(
        target=lambda: results.append(
            pool.acquire(LeaseRequest(key="k", timeout_s=60), cancelled=cancelled)
        )
    )
    thread.start()
    wait_until(lambda: pool.waiting == 1)
    cancelled.set()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert results[0].lease is None and results[0].reason == pool_module.REASON_CANCELLED
    assert pool.waiting == 0


def test_client_deadline_bounds_the_wait(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    take(pool, key="k")
    result = pool.acquire(LeaseRequest(key="k", timeout_s=60), client_time_remaining_s=0.0)
    assert result.reason == "all 1 matching devices busy"


def test_close_answers_waiters(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    take(pool, key="k")
    results: list[AcquireResult] = []
    thread = threading.Thread(
        target=lambda: results.append(pool.acquire(LeaseRequest(key="k", timeout_s=60)))
    )
    thread.start()
    wait_until(lambda: pool.waiting == 1)
    pool.close()
    thread.join(WAIT_S)
    assert results[0].reason == pool_module.REASON_SHUTTING_DOWN


def test_lease_expiry_frees_the_device(pool: BlockingPool, clock: FakeClock) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    lease = take(pool, key="k")
    assert lease.expires_at_unix == clock.now + CONFIG.default_lease_ttl_s
    clock.advance(CONFIG.heartbeat_interval_s)
    pool.heartbeat("a")
    assert pool.reap().ended_leases == ()
    renewed = pool.renew(lease.lease_id, 25)
    assert renewed.expires_at_unix == clock.now + 25
    for _ in range(13):  # keep the agent alive while the lease lapses
        clock.advance(CONFIG.heartbeat_interval_s)
        pool.heartbeat("a")
    assert pool.reap().ended_leases == (lease.lease_id,)
    assert [status.state for status in pool.list_devices()] == [DeviceState.FREE]
    with pytest.raises(LeaseLost, match="lease expired"):
        pool.renew(lease.lease_id)


def test_silent_agent_makes_devices_lost_and_renew_says_why(
    pool: BlockingPool, clock: FakeClock
) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    lease = take(pool, key="k", user="carol")
    [status] = pool.list_devices()
    assert (status.state, status.lease_holder) == (DeviceState.LEASED, "carol")
    clock.advance(CONFIG.agent_timeout_s + 0.5)
    assert pool.reap().expired_agents == ("a",)
    [status] = pool.list_devices()
    assert status.state is DeviceState.LOST
    assert status.heartbeat_age_s == pytest.approx(CONFIG.agent_timeout_s + 0.5)
    with pytest.raises(LeaseLost, match="device lost: agent stopped heartbeating"):
        pool.renew(lease.lease_id)
    assert pool.heartbeat("a") is False
    register(pool, "a", DeviceSpec("", "k"))
    assert [status.state for status in pool.list_devices()] == [DeviceState.FREE]


def test_release_twice_is_false_not_an_error(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    lease = take(pool)
    assert pool.release(lease.lease_id).released is True
    second = pool.release(lease.lease_id)
    assert (second.released, second.reason) == (False, "lease released")
    assert pool.release("unknown").reason == "unknown lease"


def test_ttl_defaults_and_clamps(pool: BlockingPool, clock: FakeClock) -> None:
    register(pool, "a", DeviceSpec("", "k"), DeviceSpec("", "k"))
    assert take(pool, lease_ttl_s=0).expires_at_unix == clock.now + CONFIG.default_lease_ttl_s
    assert take(pool, lease_ttl_s=1e6).expires_at_unix == clock.now + CONFIG.max_lease_ttl_s


def test_list_devices_reports_queue_depth(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"), DeviceSpec("", "other"))
    take(pool, key="k")
    cancelled = threading.Event()
    waiter = threading.Thread(
        target=lambda: pool.acquire(LeaseRequest(key="k", timeout_s=60), cancelled=cancelled)
    )
    waiter.start()
    wait_until(lambda: pool.waiting == 1)
    depths = {status.spec.device_id: status.queue_depth for status in pool.list_devices()}
    assert depths == {"a/0": 1, "a/1": 0}
    cancelled.set()
    waiter.join(WAIT_S)


@pytest.mark.parametrize(
    ("agent_id", "specs", "message"),
    [
        ("", [DeviceSpec("", "k")], "agent_id must not be empty"),
        ("a", [DeviceSpec("", "k"), DeviceSpec("", "")], r"devices\[1\]\.key must not be empty"),
        (
            "a",
            [DeviceSpec("d", "k"), DeviceSpec("d", "k")],
            r"devices\[1\]\.device_id 'd' duplicates devices\[0\]",
        ),
        (
            "a",
            [DeviceSpec("", "k", {"features": "x" * 1025})],
            r"devices\[0\]\.tags\['features'\] must be at most 1024 characters, got 1025",
        ),
        (
            "a",
            [DeviceSpec("", "k", {str(i): "" for i in range(65)})],
            r"devices\[0\]\.tags must have at most 64 tags, got 65",
        ),
        ("a", [DeviceSpec("", "k", {"": "v"})], r"devices\[0\]\.tags names must be 1 to 64"),
        ("a", [DeviceSpec("", "k", {"n" * 65: "v"})], r"devices\[0\]\.tags names must be 1 to 64"),
    ],
)
def test_invalid_register(
    pool: BlockingPool, agent_id: str, specs: list[DeviceSpec], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        pool.register(agent_id, "h:1", specs)
    assert pool.list_devices() == []


@pytest.mark.parametrize("field", ["timeout_s", "lease_ttl_s"])
def test_invalid_acquire(pool: BlockingPool, field: str) -> None:
    fields: dict[str, Any] = {field: -1.0}
    with pytest.raises(InvalidArgument, match=field):
        pool.acquire(LeaseRequest(**fields))
    with pytest.raises(InvalidArgument, match="lease_id"):
        pool.renew("")
    with pytest.raises(InvalidArgument, match="request_id must be at most 128 characters"):
        pool.acquire(LeaseRequest(request_id="r" * 129))
    with pytest.raises(InvalidArgument, match=r"tag_selector\['cpu'\] must be at most 1024"):
        pool.acquire(LeaseRequest(tag_selector={"cpu": "c" * 1025}))


def start_waiting(
    pool: BlockingPool, results: dict[str, AcquireResult], name: str, **request: Any
) -> threading.Thread:
    """Acquire in a thread and record the result under `name`, keeping any lease."""

    def run() -> None:
        results[name] = pool.acquire(LeaseRequest(timeout_s=WAIT_S, **request))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_same_request_id_takes_over_the_waiting_call(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    held = take(pool, key="k")
    results: dict[str, AcquireResult] = {}
    first = start_waiting(pool, results, "first", key="k", request_id="r1")
    wait_for_waiters(pool, 1)
    second = start_waiting(pool, results, "second", key="k", request_id="r1")
    first.join(WAIT_S)
    assert results["first"].reason == pool_module.REASON_SUPERSEDED
    wait_for_waiters(pool, 1)
    pool.release(held.lease_id)
    second.join(WAIT_S)
    assert results["second"].lease is not None


def test_queue_position_survives_a_restart_of_the_pool(clock: FakeClock, loop: LoopThread) -> None:
    """Two pools over one store in turn: the second re-attaches the first one's waiters."""
    store = Blocking(MemoryStore(), loop)
    before = new_pool(loop, clock, store.target)
    register(before, "a", DeviceSpec("", "k"))
    held = take(before, key="k")
    results: dict[str, AcquireResult] = {}
    threads = [start_waiting(before, results, name, key="k", request_id=name) for name in "xy"]
    wait_until(lambda: len(store.queued(clock.now)) == 2)
    before.close()
    for thread in threads:
        thread.join(WAIT_S)
    assert {results["x"].reason, results["y"].reason} == {pool_module.REASON_SHUTTING_DOWN}
    after = new_pool(loop, clock, store.target)
    results.clear()
    late = start_waiting(after, results, "y", key="k", request_id="y")  # y retries first
    wait_for_waiters(after, 1)
    early = start_waiting(after, results, "x", key="k", request_id="x")
    wait_for_waiters(after, 2)
    after.release(held.lease_id)
    early.join(WAIT_S)
    assert results["x"].lease is not None and "y" not in results
    after.close()
    late.join(WAIT_S)


def test_entries_of_a_dead_pool_stop_blocking_after_their_ttl(
    clock: FakeClock, loop: LoopThread
) -> None:
    store = Blocking(MemoryStore(), loop)
    dead = new_pool(loop, clock, store.target)
    register(dead, "a", DeviceSpec("", "k"))
    held = take(dead, key="k")
    results: dict[str, AcquireResult] = {}
    orphan = start_waiting(dead, results, "orphan", key="k", request_id="orphan")
    wait_until(lambda: len(store.queued(clock.now)) == 1)
    dead.close()
    orphan.join(WAIT_S)
    alive = new_pool(loop, clock, store.target)
    alive.release(held.lease_id)
    newcomer = start_waiting(alive, results, "newcomer", key="k")
    wait_for_waiters(alive, 1)
    assert "newcomer" not in results  # the orphan's place still holds the device
    clock.advance(CONFIG.queued_request_ttl_s)
    alive.heartbeat("a")
    assert alive.reap().dropped_requests == ("orphan",)
    newcomer.join(WAIT_S)
    assert results["newcomer"].lease is not None
    alive.close()


def test_reap_keeps_live_waiters_queued(pool: BlockingPool, clock: FakeClock) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    take(pool, key="k")
    results: dict[str, AcquireResult] = {}
    waiter = start_waiting(pool, results, "w", key="k", request_id="w")
    wait_for_waiters(pool, 1)
    for _ in range(4):  # well past queued_request_ttl_s, with a sweep every second
        clock.advance(CONFIG.queued_request_ttl_s / 2)
        pool.heartbeat("a")
        assert pool.reap().dropped_requests == ()
    assert [status.queue_depth for status in pool.list_devices()] == [1]
    pool.close()
    waiter.join(WAIT_S)


def test_lost_devices_are_pruned_after_the_retention(clock: FakeClock, loop: LoopThread) -> None:
    config = TrackerConfig(heartbeat_interval_s=1.0, lost_device_retention_s=60.0)
    pool = new_pool(loop, clock, config=config)
    register(pool, "a", DeviceSpec("", "k"))
    clock.advance(config.agent_timeout_s + 1)
    assert pool.reap().lost_devices == ("a/0",)
    clock.advance(60.5)
    assert pool.reap().pruned_devices == ("a/0",)
    assert pool.list_devices() == []
    result = pool.acquire(LeaseRequest(key="k"))
    assert result.reason == "no registered device matches key='k' tags={}"


def test_renew_issues_a_fresh_token_with_the_same_fence(
    pool: BlockingPool, clock: FakeClock
) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    lease = take(pool, key="k")
    clock.advance(1.0)
    renewed = pool.renew(lease.lease_id)
    assert renewed.fence == lease.fence > 0
    assert renewed.token != lease.token
    assert renewed.token.split(".")[1:3] == [
        str(lease.fence),
        str(round(renewed.expires_at_unix * 1000)),
    ]


def waiting_for(pool: BlockingPool, user: str) -> Waiter:
    """start_acquire's queued Waiter: nothing waits on it until the test looks."""
    started = pool.start_acquire(LeaseRequest(key="k", user=user, timeout_s=60))
    assert isinstance(started, Waiter), started
    return started


def test_a_queued_waiter_holds_no_thread_and_its_future_completes_on_a_grant(
    pool: BlockingPool,
) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    held = take(pool, key="k")
    waiter = waiting_for(pool, "w")
    assert not waiter.future.done() and pool.waiting == 1
    pool.release(held.lease_id)
    assert waiter.future.done()  # completed by the releasing call's dispatch
    result = pool.finish(waiter)
    assert result.lease is not None and result.lease.user == "w"
    assert pool.waiting == 0


def test_abandon_drops_the_waiter_and_releases_a_lease_granted_in_the_race(
    pool: BlockingPool,
) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    held = take(pool, key="k")
    ghost = waiting_for(pool, "ghost")
    following = waiting_for(pool, "next")
    pool.release(held.lease_id)  # granted to the ghost, whose client is already gone
    assert ghost.lease is not None
    assert pool.abandon(ghost).reason == pool_module.REASON_CANCELLED
    assert following.future.done()
    result = pool.finish(following)
    assert result.lease is not None and result.lease.user == "next"
    with pytest.raises(LeaseLost, match="lease released"):
        pool.renew(ghost.lease.lease_id)


def test_close_completes_the_futures_of_waiters(pool: BlockingPool) -> None:
    register(pool, "a", DeviceSpec("", "k"))
    take(pool, key="k")
    waiter = waiting_for(pool, "w")
    pool.close()
    assert waiter.future.done()
    assert pool.finish(waiter).reason == pool_module.REASON_SHUTTING_DOWN


class CountingStore(MemoryStore):
    """Counts full device reads (LOST devices included)."""

    def __init__(self) -> None:
        super().__init__()
        self.full_reads = 0

    async def devices(self, key: str = "", after: str = "", limit: int = 0) -> list[Any]:
        self.full_reads += 1
        return await super().devices(key, after, limit)


def test_no_device_looks_at_lost_devices_only_when_nothing_live_matches(
    clock: FakeClock, loop: LoopThread
) -> None:
    store = CountingStore()
    pool = new_pool(loop, clock, store)
    register(pool, "dead", *[DeviceSpec("", "k")] * 200)
    clock.advance(CONFIG.agent_timeout_s + 1)
    assert len(pool.reap().lost_devices) == 200
    register(pool, "live", DeviceSpec("", "k"))
    take(pool, key="k")
    store.full_reads = 0
    assert pool.acquire(LeaseRequest(key="k")).reason == "all 1 matching devices busy"
    waited = pool.acquire(LeaseRequest(key="k", timeout_s=0.05))
    assert waited.reason == "all 1 matching devices busy"
    assert store.full_reads == 0  # neither answer read the 200 LOST devices
    typo = pool.acquire(LeaseRequest(key="k", tag_selector={"board": "rk3399"}))
    assert typo.reason.startswith("no registered device matches")
    assert store.full_reads == 1
    pool.close()

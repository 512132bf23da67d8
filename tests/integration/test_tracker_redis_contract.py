"""The TrackerStore contract, run against every implementation: memory and redis (a real server).

Each redis test gets its own key prefix on one session-wide redis-server, and flushes it after.
The stores are coroutines; the tests call them through tracker.testing.Blocking, on one loop thread
per module, and concurrent callers are threads whose calls interleave on that loop.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protos import fencing
from protos.aio_loop import LoopThread
from tracker import validation
from tracker.errors import InvalidArgument, LeaseLost
from tracker.model import DeviceSpec, DeviceState, Lease, LeaseRequest, QueueTicket, Registration
from tracker.store import base, open_store
from tracker.store.base import TrackerStore
from tracker.testing import Blocking, BlockingPool, RedisServer
from tracker.tokens import hmac_issuer

T0 = 1_000_000.0
TTL_S = 30.0
AGENT_TIMEOUT_S = 4.0
QUEUE_TTL_S = 5.0
KEY = b"k" * 32
ISSUE = hmac_issuer(KEY)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server


@pytest.fixture
def store_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[str]:
    """ "memory", or a redis URL with a prefix of this test's own (deleted afterwards)."""
    if request.param == "memory":
        yield "memory"
        return
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    yield redis_server.url(prefix=prefix)
    client = redis_server.client()
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    loop = LoopThread("test-store-loop")
    yield loop
    loop.stop()


Store = Blocking[TrackerStore]


@pytest.fixture
def store(store_url: str, loop: LoopThread) -> Iterator[Store]:
    store = Blocking(open_store(store_url), loop)
    yield store
    store.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_url" in metafunc.fixturenames:
        kinds = getattr(metafunc.function, "store_kinds", ["memory", "redis"])
        metafunc.parametrize("store_url", kinds, indirect=True)


def redis_only(function: Any) -> Any:
    function.store_kinds = ["redis"]
    return function


def registration(agent_id: str, *keys: str, address: str = "10.0.0.1:9000") -> Registration:
    specs = [DeviceSpec(device_id="", key=key) for key in keys]
    return validation.registration(agent_id, address, specs)


def grant(
    store: Store,
    lease_id: str,
    now: float = T0,
    ticket: QueueTicket | None = None,
    **request: Any,
) -> Lease | None:
    return store.grant(LeaseRequest(**request), lease_id, now, TTL_S, ISSUE, ticket)


def states(store: Store) -> dict[str, DeviceState]:
    return {record.spec.device_id: record.state for record in store.devices()}


def enqueue(store: Store, request_id: str, now: float = T0, **request: Any) -> QueueTicket:
    return store.enqueue(LeaseRequest(request_id=request_id, **request), now, QUEUE_TTL_S)


def test_grant_marks_device_leased_with_a_verifiable_token(store: Store) -> None:
    store.register(registration("a", "x86"), T0)
    lease = grant(store, "L1", user="alice")
    assert lease is not None
    assert (lease.device.device_id, lease.user, lease.expires_at_unix) == (
        "a/0",
        "alice",
        T0 + TTL_S,
    )
    claims = fencing.verify(KEY, lease.token, "L1", "a/0", now_unix=T0)
    assert claims.fence == lease.fence == int(T0 * 1_000_000)
    assert claims.expires_at_ms == round((T0 + TTL_S) * 1000)
    [record] = store.devices()
    assert (record.state, record.lease_holder) == (DeviceState.LEASED, "alice")
    assert grant(store, "L2") is None


def test_grant_matches_key_and_every_selected_tag(store: Store) -> None:
    specs = [
        DeviceSpec("", "arm", {"board": "rk3399", "mem": "4g"}),
        DeviceSpec("", "arm", {"board": "rpi4", "mem": "4g"}),
    ]
    store.register(validation.registration("a", "h:1", specs), T0)
    assert grant(store, "L0", key="x86") is None
    assert grant(store, "L1", key="arm", tag_selector={"board": "rk3399", "mem": "8g"}) is None
    lease = grant(store, "L2", key="arm", tag_selector={"board": "rpi4", "mem": "4g"})
    assert lease is not None and lease.device.device_id == "a/1"
    assert lease.device.tags == {"board": "rpi4", "mem": "4g"}
    lease = grant(store, "L3", key="", tag_selector={"mem": "4g"})
    assert lease is not None and lease.device.device_id == "a/0"


def test_grant_picks_the_lowest_free_device_id(store: Store) -> None:
    store.register(validation.registration("b", "h:2", [DeviceSpec("dev-b", "k")]), T0)
    store.register(validation.registration("a", "h:1", [DeviceSpec("dev-a", "k")]), T0)
    first, second = grant(store, "L1", key="k"), grant(store, "L2", key="k")
    assert first is not None and second is not None
    assert (first.device.device_id, second.device.device_id) == ("dev-a", "dev-b")


def test_concurrent_grants_never_share_a_device(store: Store) -> None:
    store.register(registration("a", *["k"] * 4), T0)
    leases = []
    lock = threading.Lock()

    def take(index: int) -> None:
        lease = grant(store, f"L{index}", key="k")
        with lock:
            leases.append(lease)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    granted = [lease.device.device_id for lease in leases if lease is not None]
    assert sorted(granted) == ["a/0", "a/1", "a/2", "a/3"]


def test_fence_strictly_increases_across_grants_of_a_device(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    fences = []
    for index in range(3):  # same clock reading every time: the fence still grows
        lease = grant(store, f"L{index}")
        assert lease is not None
        fences.append(lease.fence)
        store.release(f"L{index}", T0)
    assert fences == [fences[0], fences[0] + 1, fences[0] + 2]
    later = grant(store, "L9", now=T0 + 1)
    assert later is not None and later.fence == int((T0 + 1) * 1_000_000)


def test_renew_extends_with_a_fresh_token_and_release_frees(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    granted = grant(store, "L1")
    assert granted is not None
    renewed = store.renew("L1", T0 + 20, 50.0, ISSUE)
    assert renewed.expires_at_unix == T0 + 70
    assert renewed.fence == granted.fence and renewed.token != granted.token
    claims = fencing.verify(KEY, renewed.token, "L1", "a/0", now_unix=T0 + 69)
    assert (claims.fence, claims.expires_at_ms) == (granted.fence, round((T0 + 70) * 1000))
    released = store.release("L1", T0 + 21)
    assert (released.lease_id, released.device.device_id, released.fence) == (
        "L1",
        "a/0",
        granted.fence,
    )
    assert states(store) == {"a/0": DeviceState.FREE}
    with pytest.raises(LeaseLost, match=base.REASON_RELEASED):
        store.release("L1", T0 + 22)
    with pytest.raises(LeaseLost, match=base.REASON_RELEASED):
        store.renew("L1", T0 + 22, 10.0, ISSUE)
    with pytest.raises(LeaseLost, match=base.REASON_UNKNOWN):
        store.renew("nope", T0, 10.0, ISSUE)


def test_renew_past_expiry_ends_the_lease_without_a_sweep(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    grant(store, "L1")
    with pytest.raises(LeaseLost, match=base.REASON_EXPIRED):
        store.renew("L1", T0 + TTL_S + 1, 10.0, ISSUE)
    assert states(store) == {"a/0": DeviceState.FREE}


def test_expire_frees_lapsed_leases(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    grant(store, "L1")
    store.heartbeat("a", T0 + TTL_S)
    assert store.expire(T0 + TTL_S - 1, AGENT_TIMEOUT_S).ended_leases == ()
    report = store.expire(T0 + TTL_S + 1, AGENT_TIMEOUT_S)
    assert report.ended_leases == ("L1",)
    assert report.expired_agents == ()
    assert states(store) == {"a/0": DeviceState.FREE}
    with pytest.raises(LeaseLost, match=base.REASON_EXPIRED):
        store.renew("L1", T0 + TTL_S + 2, 10.0, ISSUE)


def test_silent_agent_loses_devices_and_leases(store: Store) -> None:
    store.register(registration("a", "k", "k"), T0)
    grant(store, "L1")
    assert store.expire(T0 + AGENT_TIMEOUT_S, AGENT_TIMEOUT_S).expired_agents == ()
    report = store.expire(T0 + AGENT_TIMEOUT_S + 0.1, AGENT_TIMEOUT_S)
    assert report.expired_agents == ("a",)
    assert report.lost_devices == ("a/0", "a/1")
    assert report.ended_leases == ("L1",)
    assert states(store) == {"a/0": DeviceState.LOST, "a/1": DeviceState.LOST}
    assert grant(store, "L2", now=T0 + 5) is None
    with pytest.raises(LeaseLost, match=base.REASON_AGENT_SILENT):
        store.renew("L1", T0 + 5, 10.0, ISSUE)
    assert store.heartbeat("a", T0 + 5) is False
    store.register(registration("a", "k", "k"), T0 + 6)
    assert states(store) == {"a/0": DeviceState.FREE, "a/1": DeviceState.FREE}
    assert grant(store, "L3", now=T0 + 6) is not None


def test_devices_by_key_include_lost_ones_with_their_tags(store: Store) -> None:
    """The pool answers NO_DEVICE at once only when no device here matches, LOST ones included."""
    specs = [DeviceSpec("", "arm", {"board": "rpi4", "features": "neon"}), DeviceSpec("", "x86")]
    store.register(validation.registration("a", "10.0.0.1:9000", specs), T0)
    store.expire(T0 + AGENT_TIMEOUT_S + 0.1, AGENT_TIMEOUT_S)
    [record] = store.devices("arm")
    assert (record.spec.device_id, record.state) == ("a/0", DeviceState.LOST)
    assert record.spec.tags == {"board": "rpi4", "features": "neon"}
    assert store.devices("riscv") == []


def test_lost_devices_are_forgotten_after_the_retention(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    store.register(registration("b", "k"), T0 + 50)
    store.expire(T0 + 10, AGENT_TIMEOUT_S, lost_device_retention_s=100.0)
    assert states(store) == {"a/0": DeviceState.LOST, "b/0": DeviceState.FREE}
    store.heartbeat("b", T0 + 110)
    assert store.expire(T0 + 110, AGENT_TIMEOUT_S, 100.0).pruned_devices == ()
    report = store.expire(T0 + 110.5, AGENT_TIMEOUT_S, 100.0)
    assert report.pruned_devices == ("a/0",)
    assert states(store) == {"b/0": DeviceState.FREE}
    assert store.heartbeat("a", T0 + 111) is False
    store.register(registration("a", "k"), T0 + 112)
    assert states(store) == {"a/0": DeviceState.FREE, "b/0": DeviceState.FREE}


def test_heartbeat_keeps_agent_alive(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    assert store.heartbeat("a", T0 + 3) is True
    assert store.expire(T0 + 6, AGENT_TIMEOUT_S).expired_agents == ()
    assert store.heartbeat("unknown", T0) is False


def test_reregister_is_idempotent_and_keeps_leases_of_kept_devices(store: Store) -> None:
    store.register(registration("a", "k", "k"), T0)
    grant(store, "L0")
    assert store.register(registration("a", "k", "k"), T0 + 1) == ()
    assert states(store) == {"a/0": DeviceState.LEASED, "a/1": DeviceState.FREE}
    assert store.renew("L0", T0 + 2, 10.0, ISSUE).device.device_id == "a/0"
    lease = grant(store, "L1", now=T0 + 2)
    assert lease is not None and lease.device.device_id == "a/1"


def test_reregister_with_a_new_key_moves_the_device(store: Store) -> None:
    store.register(registration("a", "old"), T0)
    store.register(registration("a", "new"), T0 + 1)
    assert grant(store, "L0", key="old") is None
    assert [record.spec.device_id for record in store.devices("old")] == []
    lease = grant(store, "L1", key="new")
    assert lease is not None and lease.device.key == "new"


def test_reregister_without_a_device_ends_its_lease(store: Store) -> None:
    store.register(registration("a", "k", "k"), T0)
    store.register(validation.registration("a", "h:1", [DeviceSpec("a/1", "k")]), T0)
    grant(store, "L1")
    assert store.register(registration("a", "k"), T0 + 1) == ("L1",)
    assert states(store) == {"a/0": DeviceState.FREE}
    with pytest.raises(LeaseLost, match=base.REASON_DEVICE_DROPPED):
        store.renew("L1", T0 + 2, 10.0, ISSUE)


def test_device_id_of_another_live_agent_is_refused(store: Store) -> None:
    store.register(validation.registration("a", "h:1", [DeviceSpec("shared", "k")]), T0)
    taken = validation.registration("b", "h:2", [DeviceSpec("shared", "k")])
    with pytest.raises(InvalidArgument, match=r"devices\[0\]\.device_id 'shared'.*agent 'a'"):
        store.register(taken, T0)
    store.expire(T0 + 10, AGENT_TIMEOUT_S)
    store.register(taken, T0 + 10)
    [record] = store.devices()
    assert (record.spec.agent_address, record.state) == ("h:2", DeviceState.FREE)


def test_devices_filters_by_key(store: Store) -> None:
    store.register(registration("a", "x86", "arm"), T0)
    assert [record.spec.device_id for record in store.devices("arm")] == ["a/1"]
    assert len(store.devices()) == 2
    assert store.devices()[0].last_heartbeat_unix == T0


def test_enqueue_hands_out_ordered_tickets_and_reattaches(store: Store) -> None:
    first = enqueue(store, "r1", priority=0)
    second = enqueue(store, "r2", priority=5)
    assert first.seq < second.seq
    again = enqueue(store, "r1", now=T0 + 1, priority=9)  # a retry: keeps its original place
    assert again == first
    assert [ticket.request_id for ticket, _ in store.queued(T0 + 1)] == ["r2", "r1"]
    store.dequeue("r2")
    store.dequeue("absent")
    assert [ticket.request_id for ticket, _ in store.queued(T0 + 1)] == ["r1"]
    with pytest.raises(InvalidArgument, match="request_id"):
        store.enqueue(LeaseRequest(), T0, QUEUE_TTL_S)


def test_grant_serves_the_queue_in_order(store: Store) -> None:
    store.register(registration("a", "k", "k"), T0)
    assert grant(store, "L0", key="k") is not None
    assert grant(store, "L00", key="k") is not None
    early = enqueue(store, "early", key="k")
    late = enqueue(store, "late", key="k")
    store.release("L0", T0)  # one device free: early's, not late's nor a newcomer's
    assert grant(store, "L1", key="k") is None
    assert grant(store, "L2", ticket=late, key="k") is None
    lease = grant(store, "L3", ticket=early, key="k")
    assert lease is not None and lease.device.device_id == "a/0"
    assert [ticket.request_id for ticket, _ in store.queued(T0)] == ["late"]
    assert grant(store, "L4", ticket=late, key="k") is None  # a/1 is still leased


def test_grant_leaves_a_queued_request_only_what_it_would_not_take(store: Store) -> None:
    specs = [DeviceSpec("", "k"), DeviceSpec("", "k"), DeviceSpec("", "gpu")]
    store.register(validation.registration("a", "h:1", specs), T0)
    enqueue(store, "any", priority=1)  # claims the lowest id of all: a/0
    lease = grant(store, "L1", key="k")
    assert lease is not None and lease.device.device_id == "a/1"
    assert grant(store, "L2", key="k") is None
    lower = grant(store, "L3", key="gpu", priority=0)
    assert lower is not None and lower.device.device_id == "a/2"
    higher = grant(store, "L4", key="", priority=2)  # outranks the queued request
    assert higher is not None and higher.device.device_id == "a/0"


def test_many_waiters_on_a_busy_key_neither_block_another_key_nor_lose_their_order(
    store: Store,
) -> None:
    store.register(registration("a", "k", "k", "j"), T0)
    assert grant(store, "held0", key="k") is not None
    assert grant(store, "held1", key="k") is not None
    tickets = [enqueue(store, f"w{i}", key="k") for i in range(50)]
    other = grant(store, "J", key="j")  # 50 waiters ahead, none of which could take a/2
    assert other is not None and other.device.device_id == "a/2"
    store.release("held0", T0)
    assert grant(store, "x", ticket=tickets[1], key="k") is None  # w0's device
    store.release("held1", T0)
    assert grant(store, "y", ticket=tickets[2], key="k") is None  # w1's now
    first = grant(store, "z0", ticket=tickets[0], key="k")
    second = grant(store, "z1", ticket=tickets[1], key="k")
    assert first is not None and second is not None
    assert {first.device.device_id, second.device.device_id} == {"a/0", "a/1"}


def test_a_request_for_any_key_claims_what_earlier_requests_of_other_keys_left(
    store: Store,
) -> None:
    # gpu's request claims a/0, so the any-key request behind it claims a/1: nothing is left
    # for a newcomer on k. Skipping the gpu request as "another key" would hand it a/1.
    store.register(registration("a", "gpu", "k"), T0)
    enqueue(store, "g", key="gpu")
    enqueue(store, "any")
    assert grant(store, "K", key="k") is None
    only_k = enqueue(store, "k-late", key="k")
    assert grant(store, "K2", ticket=only_k, key="k") is None
    store.dequeue("any")
    lease = grant(store, "K3", ticket=only_k, key="k")
    assert lease is not None and lease.device.device_id == "a/1"


def test_waiters_of_other_keys_do_not_slow_or_change_a_grant(store: Store) -> None:
    store.register(registration("a", "busy", "k", "k"), T0)
    assert grant(store, "held", key="busy") is not None
    for i in range(200):
        enqueue(store, f"w{i}", key="busy")
    ahead = enqueue(store, "k-first", key="k")
    lease = grant(store, "K", key="k")  # k-first claims a/1
    assert lease is not None and lease.device.device_id == "a/2"
    first = grant(store, "K1", ticket=ahead, key="k")
    assert first is not None and first.device.device_id == "a/1"


def test_expired_queue_entries_stop_blocking_and_are_swept(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    enqueue(store, "dead-tracker", key="k")
    assert grant(store, "L1", now=T0 + 1, key="k") is None
    lease = grant(store, "L2", now=T0 + QUEUE_TTL_S, key="k")
    assert lease is not None
    assert store.expire(T0 + QUEUE_TTL_S, AGENT_TIMEOUT_S).dropped_requests == ("dead-tracker",)
    assert store.queued(T0) == []
    fresh = enqueue(store, "dead-tracker", now=T0 + 6, key="k")
    assert fresh.seq > 0 and store.queued(T0 + 6)[0][0] == fresh


def test_keep_queued_refreshes_and_recreates_entries(store: Store) -> None:
    ticket = enqueue(store, "r1", key="k")
    request = LeaseRequest(key="k", request_id="r1")
    store.keep_queued([(ticket, request)], T0 + 4, QUEUE_TTL_S)
    assert store.expire(T0 + 6, AGENT_TIMEOUT_S).dropped_requests == ()
    store.dequeue("r1")
    store.keep_queued([(ticket, request)], T0 + 7, QUEUE_TTL_S)
    assert store.queued(T0 + 7) == [(ticket, request)]


@redis_only
def test_redis_state_outlives_the_store_object(store_url: str, loop: LoopThread) -> None:
    """What a tracker restart keeps: registrations, leases, fences, queued requests."""
    first = Blocking(open_store(store_url), loop)
    first.register(registration("a", "k", "k"), T0)
    lease = grant(first, "L1", key="k")
    ticket = enqueue(first, "r1", key="k", priority=3)
    first.close()
    second = Blocking(open_store(store_url), loop)
    try:
        assert states(second) == {"a/0": DeviceState.LEASED, "a/1": DeviceState.FREE}
        assert second.heartbeat("a", T0 + 1) is True
        renewed = second.renew("L1", T0 + 1, TTL_S, ISSUE)
        assert lease is not None and renewed.fence == lease.fence
        assert enqueue(second, "r1", now=T0 + 1, key="k") == ticket
        second.release("L1", T0 + 2)
        again = grant(second, "L2", now=T0 - 100, ticket=ticket, key="k")  # clock went back
        assert again is not None and again.fence == lease.fence + 1
    finally:
        second.close()


@redis_only
def test_two_redis_store_objects_never_grant_one_device_twice(
    store_url: str, loop: LoopThread
) -> None:
    stores = [Blocking(open_store(store_url), loop) for _ in range(2)]
    stores[0].register(registration("a", *["k"] * 3), T0)
    leases: list[Lease | None] = []
    lock = threading.Lock()

    def take(index: int) -> None:
        lease = grant(stores[index % 2], f"L{index}", key="k")
        with lock:
            leases.append(lease)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    for store in stores:
        store.close()
    granted = sorted(lease.device.device_id for lease in leases if lease is not None)
    assert granted == ["a/0", "a/1", "a/2"]


@redis_only
def test_a_restarted_tracker_does_not_count_its_downtime_as_agent_silence(
    store_url: str, loop: LoopThread
) -> None:
    """The store outlives the tracker (Redis): a new pool over it gives every agent one agent
    timeout from its start before calling it silent, so a tracker down for longer than that ends
    no lease by itself; an agent still silent after it is LOST as before."""
    from tracker.config import TrackerConfig
    from tracker.pool import DevicePool

    config = TrackerConfig(heartbeat_interval_s=2.0, default_lease_ttl_s=600.0, startup_grace_s=0)
    now = [T0]
    clock = lambda: now[0]  # noqa: E731
    first_store = Blocking(open_store(store_url), loop)
    first = BlockingPool(DevicePool(first_store.target, config, clock=clock), loop)
    first.register("live", "h:1", [DeviceSpec("", "k")])
    first.register("dead", "h:2", [DeviceSpec("", "j")])
    lease = first.acquire(LeaseRequest(key="k", timeout_s=0)).lease
    assert lease is not None
    first.close()
    first_store.close()

    now[0] += 60.0  # the tracker is down for 60 s, 15 agent timeouts
    second_store = Blocking(open_store(store_url), loop)
    second = BlockingPool(DevicePool(second_store.target, config, clock=clock), loop)
    try:
        report = second.reap()
        assert report.expired_agents == () and report.ended_leases == ()
        now[0] += config.agent_timeout_s - 1.0  # still within the fresh grace
        assert second.reap().expired_agents == ()
        assert second.heartbeat("live")
        now[0] += 1.5  # past the grace: "live" beat 1.5 s ago, "dead" not since the restart
        report = second.reap()
        assert report.expired_agents == ("dead",)  # silent since the restart too
        assert lease.lease_id not in report.ended_leases
        held = {d.spec.device_id: d.state for d in second_store.devices()}
        assert held == {"live/0": DeviceState.LEASED, "dead/0": DeviceState.LOST}
    finally:
        second.close()
        second_store.close()


def test_devices_read_in_pages_by_id_with_each_lease_fence(store: Store) -> None:
    store.register(registration("a", *["k"] * 5, "j"), T0)
    lease = grant(store, "l1", key="k")
    assert lease is not None
    ids = [f"a/{i}" for i in range(5)]
    first = store.devices("k", limit=2)
    assert [r.spec.device_id for r in first] == ids[:2]
    rest = store.devices("k", after=first[-1].spec.device_id, limit=10)
    assert [r.spec.device_id for r in rest] == ids[2:]
    assert store.devices("k", after=ids[-1]) == []
    assert [r.spec.device_id for r in store.devices(after="a/4")] == ["a/5"]
    fences = {r.spec.device_id: r.fence for r in store.devices()}
    assert fences.pop(lease.device.device_id) == lease.fence > 0
    assert set(fences.values()) == {0}


@redis_only
def test_listings_decode_each_stored_spec_once_and_see_a_changed_one(store: Store) -> None:
    specs = [DeviceSpec("", "k", {"arch": "x86", "note": 'quote " and \\ slash'})] * 3
    store.register(validation.registration("a", "h:1", specs), T0)
    first, again = store.devices(), store.devices()
    assert [r.spec for r in first] == [r.spec for r in again]
    assert first[0].spec.tags == {"arch": "x86", "note": 'quote " and \\ slash'}
    assert all(a.spec is b.spec for a, b in zip(first, again, strict=True))  # the spec cache
    changed = [DeviceSpec("", "k", {"arch": "arm"})] * 3
    store.register(validation.registration("a", "h:1", changed), T0)
    assert [r.spec.tags for r in store.live_devices()] == [{"arch": "arm"}] * 3


def test_live_devices_leave_out_the_lost_ones(store: Store) -> None:
    store.register(registration("live", "k", "j"), T0)
    store.register(registration("dead", "k", "k"), T0 - 2 * AGENT_TIMEOUT_S)
    store.expire(T0, AGENT_TIMEOUT_S, 3600.0)
    assert {r.spec.device_id for r in store.live_devices()} == {"live/0", "live/1"}
    [record] = store.live_devices("k")
    assert (record.spec.device_id, record.state) == ("live/0", DeviceState.FREE)
    assert len(store.devices("k")) == 3  # the lost ones are still known


@redis_only
def test_the_queue_key_index_follows_every_queue_write_and_delete(
    store_url: str, redis_server: RedisServer, loop: LoopThread
) -> None:
    store = Blocking(open_store(store_url), loop)
    prefix = store_url.split("prefix=")[1]
    client = redis_server.client()

    def index() -> dict[str, set[str]]:
        keys = [str(k) for k in client.keys(f"{prefix}qk:*")]
        return {k[len(prefix) + 3 :]: {str(m) for m in client.smembers(k)} for k in keys}

    try:
        store.register(registration("a", "k", "j"), T0)
        granted = enqueue(store, "g", key="k")
        enqueue(store, "d", key="j")
        enqueue(store, "x", key="", now=T0 - QUEUE_TTL_S)  # already past its expiry at T0 + 1
        store.keep_queued([(granted, LeaseRequest(key="k", request_id="g"))], T0, QUEUE_TTL_S)
        assert index() == {"k": {"g"}, "j": {"d"}, "": {"x"}}
        assert grant(store, "L", ticket=granted, key="k") is not None
        store.dequeue("d")
        store.expire(T0 + 1, AGENT_TIMEOUT_S)
        assert index() == {}
    finally:
        store.close()
        client.close()


def test_devices_by_id_reads_just_those(store: Store) -> None:
    store.register(registration("a", "k", "k", "j"), T0)
    lease = grant(store, "L", key="j")
    assert lease is not None
    records = {r.spec.device_id: r for r in store.devices_by_id(["a/2", "a/0", "ghost"])}
    assert set(records) == {"a/0", "a/2"}
    assert records["a/2"].fence == lease.fence and records["a/0"].state is DeviceState.FREE
    assert store.devices_by_id([]) == []


def test_queued_shapes_count_live_requests_per_key_and_selector(store: Store) -> None:
    for i in range(3):
        enqueue(store, f"k{i}", key="k")
    enqueue(store, "arm", key="k", tag_selector={"arch": "arm", "board": "rk"})
    enqueue(store, "arm2", key="k", tag_selector={"board": "rk", "arch": "arm"})
    enqueue(store, "old", key="j", now=T0 - QUEUE_TTL_S)  # expired by T0 + 1
    assert store.queued_shapes(T0 + 1) == {
        ("k", ()): 3,
        ("k", (("arch", "arm"), ("board", "rk"))): 2,
    }


# -- deregister ---------------------------------------------------------------------------------


def test_deregister_removes_the_agent_and_its_devices_and_ends_their_leases(
    store: Store,
) -> None:
    store.register(registration("a", "k", "k"), T0)
    store.register(registration("b", "k"), T0)
    lease = grant(store, "L1")
    assert lease is not None and lease.device.device_id == "a/0"
    removed = store.deregister("a")
    assert (removed.devices, removed.ended_leases) == (("a/0", "a/1"), ("L1",))
    assert states(store) == {"b/0": DeviceState.FREE}
    assert [r.spec.device_id for r in store.live_devices("k")] == ["b/0"]
    assert store.devices_by_id(["a/0", "a/1"]) == []
    with pytest.raises(LeaseLost, match=base.REASON_AGENT_DEREGISTERED):
        store.renew("L1", T0 + 1, 10.0, ISSUE)
    with pytest.raises(LeaseLost, match=base.REASON_AGENT_DEREGISTERED):
        store.release("L1", T0 + 1)
    assert store.heartbeat("a", T0 + 1) is False
    report = store.expire(T0 + 100, AGENT_TIMEOUT_S, lost_device_retention_s=1.0)
    assert "a" not in report.expired_agents and "a/0" not in report.lost_devices
    assert store.deregister("a").devices == ()


def test_deregister_of_an_unknown_agent_changes_nothing(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    removed = store.deregister("nobody")
    assert (removed.devices, removed.ended_leases) == ((), ())
    assert states(store) == {"a/0": DeviceState.FREE}


def test_deregister_forgets_lost_devices_at_once(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    store.expire(T0 + AGENT_TIMEOUT_S + 1, AGENT_TIMEOUT_S)
    assert states(store) == {"a/0": DeviceState.LOST}
    assert store.deregister("a").devices == ("a/0",)
    assert store.devices() == []
    assert store.expire(T0 + 10_000, AGENT_TIMEOUT_S, 1.0).pruned_devices == ()


def test_deregister_leaves_a_device_another_agent_took_over(store: Store) -> None:
    store.register(validation.registration("a", "h:1", [DeviceSpec("shared", "k")]), T0)
    store.expire(T0 + 10, AGENT_TIMEOUT_S)
    store.register(validation.registration("b", "h:2", [DeviceSpec("shared", "k")]), T0 + 10)
    assert store.deregister("a").devices == ()
    [record] = store.devices()
    assert (record.spec.agent_address, record.state) == ("h:2", DeviceState.FREE)


def test_a_device_registered_again_after_deregister_gets_higher_fences(
    store: Store,
) -> None:
    """The fence survives the device: the same clock reading still gives a higher fence."""
    store.register(registration("a", "k"), T0)
    fences = []
    for index in range(3):  # same clock reading: the fence is bumped past the grant time
        lease = grant(store, f"L{index}")
        assert lease is not None
        fences.append(lease.fence)
        if index < 2:
            store.release(f"L{index}", T0)
    assert store.deregister("a").ended_leases == ("L2",)
    store.register(registration("a", "k"), T0)
    again = grant(store, "L9")
    assert again is not None and again.fence == fences[-1] + 1 > int(T0 * 1_000_000)


def test_deregister_keeps_queued_requests_for_other_devices(store: Store) -> None:
    store.register(registration("a", "k"), T0)
    ticket = enqueue(store, "q1", key="k")
    store.deregister("a")
    assert [t.request_id for t, _ in store.queued(T0)] == ["q1"]
    assert grant(store, "L1", ticket=ticket, key="k") is None
    store.register(registration("b", "k"), T0 + 1)
    lease = grant(store, "L2", now=T0 + 1, ticket=ticket, key="k")
    assert lease is not None and lease.device.device_id == "b/0"
    assert store.queued(T0 + 1) == []


@redis_only
def test_deregister_leaves_no_redis_keys_of_the_agent_or_its_devices(
    store_url: str, redis_server: RedisServer, loop: LoopThread
) -> None:
    store = Blocking(open_store(store_url), loop)
    prefix = store_url.split("prefix=")[1]
    client = redis_server.client()
    try:
        store.register(registration("a", "k", "j"), T0)
        store.register(registration("b", "k"), T0)
        lease = grant(store, "L1", key="j")
        assert lease is not None
        store.deregister("a")
        keys = {str(k)[len(prefix) :] for k in client.keys(f"{prefix}*")}
        assert not {k for k in keys if "a/" in k or k == "agent:a"}
        assert client.zrange(f"{prefix}devs", 0, -1) == ["b/0"]
        assert client.zrange(f"{prefix}free", 0, -1) == ["b/0"]
        assert client.zrange(f"{prefix}alive", 0, -1) == ["b"]
        assert client.zrange(f"{prefix}devs:j", 0, -1) == []
        assert client.hget(f"{prefix}fences", "a/1") == str(lease.fence)  # kept on purpose
    finally:
        store.close()
        client.close()

"""Contract tests every TrackerStore implementation must pass (memory now; redis joins later)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tracker import validation
from tracker.errors import InvalidArgument, LeaseLost
from tracker.model import DeviceSpec, DeviceState, Lease, LeaseRequest, Registration
from tracker.store import base, open_store
from tracker.store.base import TrackerStore
from tracker.tokens import random_token

T0 = 1_000_000.0
TTL_S = 30.0
AGENT_TIMEOUT_S = 4.0


@pytest.fixture(params=["memory"])
def store(request: pytest.FixtureRequest) -> Iterator[TrackerStore]:
    store = open_store(request.param)
    yield store
    store.close()


def registration(agent_id: str, *keys: str, address: str = "10.0.0.1:9000") -> Registration:
    specs = [DeviceSpec(device_id="", key=key) for key in keys]
    return validation.registration(agent_id, address, specs)


def grant(store: TrackerStore, lease_id: str, now: float = T0, **request: Any) -> Lease | None:
    return store.grant(LeaseRequest(**request), lease_id, now, TTL_S, random_token)


def states(store: TrackerStore) -> dict[str, DeviceState]:
    return {record.spec.device_id: record.state for record in store.devices()}


def test_grant_marks_device_leased_and_holds_the_token(store: TrackerStore) -> None:
    store.register(registration("a", "x86"), T0)
    lease = grant(store, "L1", user="alice")
    assert lease is not None
    assert (lease.device.device_id, lease.user, lease.expires_at_unix) == (
        "a/0",
        "alice",
        T0 + TTL_S,
    )
    assert len(lease.token) == 32
    [record] = store.devices()
    assert (record.state, record.lease_holder) == (DeviceState.LEASED, "alice")
    assert grant(store, "L2") is None


def test_grant_matches_key_and_every_selected_tag(store: TrackerStore) -> None:
    specs = [
        DeviceSpec("", "arm", {"board": "rk3399", "mem": "4g"}),
        DeviceSpec("", "arm", {"board": "rpi4", "mem": "4g"}),
    ]
    store.register(validation.registration("a", "h:1", specs), T0)
    assert grant(store, "L0", key="x86") is None
    assert grant(store, "L1", key="arm", tag_selector={"board": "rk3399", "mem": "8g"}) is None
    lease = grant(store, "L2", key="arm", tag_selector={"board": "rpi4", "mem": "4g"})
    assert lease is not None and lease.device.device_id == "a/1"
    lease = grant(store, "L3", key="", tag_selector={"mem": "4g"})
    assert lease is not None and lease.device.device_id == "a/0"


def test_concurrent_grants_never_share_a_device(store: TrackerStore) -> None:
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


def test_renew_extends_and_release_frees(store: TrackerStore) -> None:
    store.register(registration("a", "k"), T0)
    grant(store, "L1")
    renewed = store.renew("L1", T0 + 20, 50.0)
    assert renewed.expires_at_unix == T0 + 70
    store.release("L1", T0 + 21)
    assert states(store) == {"a/0": DeviceState.FREE}
    with pytest.raises(LeaseLost, match=base.REASON_RELEASED):
        store.release("L1", T0 + 22)
    with pytest.raises(LeaseLost, match=base.REASON_RELEASED):
        store.renew("L1", T0 + 22, 10.0)
    with pytest.raises(LeaseLost, match=base.REASON_UNKNOWN):
        store.renew("nope", T0, 10.0)


def test_renew_past_expiry_ends_the_lease_without_a_sweep(store: TrackerStore) -> None:
    store.register(registration("a", "k"), T0)
    grant(store, "L1")
    with pytest.raises(LeaseLost, match=base.REASON_EXPIRED):
        store.renew("L1", T0 + TTL_S + 1, 10.0)
    assert states(store) == {"a/0": DeviceState.FREE}


def test_expire_frees_lapsed_leases(store: TrackerStore) -> None:
    store.register(registration("a", "k"), T0)
    grant(store, "L1")
    store.heartbeat("a", T0 + TTL_S)
    assert store.expire(T0 + TTL_S - 1, AGENT_TIMEOUT_S).ended_leases == ()
    report = store.expire(T0 + TTL_S + 1, AGENT_TIMEOUT_S)
    assert report.ended_leases == ("L1",)
    assert report.expired_agents == ()
    assert states(store) == {"a/0": DeviceState.FREE}
    with pytest.raises(LeaseLost, match=base.REASON_EXPIRED):
        store.renew("L1", T0 + TTL_S + 2, 10.0)


def test_silent_agent_loses_devices_and_leases(store: TrackerStore) -> None:
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
        store.renew("L1", T0 + 5, 10.0)
    assert store.heartbeat("a", T0 + 5) is False
    store.register(registration("a", "k", "k"), T0 + 6)
    assert states(store) == {"a/0": DeviceState.FREE, "a/1": DeviceState.FREE}


def test_heartbeat_keeps_agent_alive(store: TrackerStore) -> None:
    store.register(registration("a", "k"), T0)
    assert store.heartbeat("a", T0 + 3) is True
    assert store.expire(T0 + 6, AGENT_TIMEOUT_S).expired_agents == ()
    assert store.heartbeat("unknown", T0) is False


def test_reregister_is_idempotent_and_keeps_leases_of_kept_devices(store: TrackerStore) -> None:
    store.register(registration("a", "k", "k"), T0)
    grant(store, "L0")
    assert store.register(registration("a", "k", "k"), T0 + 1) == ()
    assert states(store) == {"a/0": DeviceState.LEASED, "a/1": DeviceState.FREE}
    assert store.renew("L0", T0 + 2, 10.0).device.device_id == "a/0"


def test_reregister_without_a_device_ends_its_lease(store: TrackerStore) -> None:
    store.register(registration("a", "k", "k"), T0)
    store.register(validation.registration("a", "h:1", [DeviceSpec("a/1", "k")]), T0)
    grant(store, "L1")
    assert store.register(registration("a", "k"), T0 + 1) == ("L1",)
    assert states(store) == {"a/0": DeviceState.FREE}
    with pytest.raises(LeaseLost, match=base.REASON_DEVICE_DROPPED):
        store.renew("L1", T0 + 2, 10.0)


def test_device_id_of_another_live_agent_is_refused(store: TrackerStore) -> None:
    store.register(validation.registration("a", "h:1", [DeviceSpec("shared", "k")]), T0)
    taken = validation.registration("b", "h:2", [DeviceSpec("shared", "k")])
    with pytest.raises(InvalidArgument, match=r"devices\[0\]\.device_id 'shared'.*agent 'a'"):
        store.register(taken, T0)
    store.expire(T0 + 10, AGENT_TIMEOUT_S)
    store.register(taken, T0 + 10)
    [record] = store.devices()
    assert (record.spec.agent_address, record.state) == ("h:2", DeviceState.FREE)


def test_devices_filters_by_key(store: TrackerStore) -> None:
    store.register(registration("a", "x86", "arm"), T0)
    assert [record.spec.device_id for record in store.devices("arm")] == ["a/1"]
    assert len(store.devices()) == 2

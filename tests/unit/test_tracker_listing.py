"""ListDevices' pages, queue depths counted per request shape, and Register's fence floors."""

from __future__ import annotations

import pytest

from tracker import listing
from tracker.errors import InvalidArgument
from tracker.model import DeviceRecord, DeviceSpec, DeviceState, LeaseRequest
from tracker.store.base import next_fence, shape_counts

NOW = 2_000_000.0


def record(
    device_id: str, key: str = "k", state: DeviceState = DeviceState.FREE, fence: int = 0
) -> DeviceRecord:
    """A device of `key`; ids ending in 0 are x86_64, the others arm."""
    tags = {"arch": "x86_64"} if device_id.endswith("0") else {"arch": "arm"}
    return DeviceRecord(DeviceSpec(device_id, key, tags, "h:1"), state, "", NOW - 1.0, fence)


def test_page_size_defaults_caps_and_refuses_negative() -> None:
    assert listing.page_size(0) == listing.DEFAULT_PAGE_SIZE
    assert listing.page_size(7) == 7
    assert listing.page_size(10**9) == listing.MAX_PAGE_SIZE
    with pytest.raises(InvalidArgument, match="page_size"):
        listing.page_size(-1)
    with pytest.raises(InvalidArgument, match="page_token"):
        listing.check_page_token("x" * 129)


def test_next_page_token_is_the_last_id_served_only_when_more_remain() -> None:
    records = [record(f"a/{i}") for i in range(3)]
    assert listing.next_page_token(records, 2) == "a/1"
    assert listing.next_page_token(records, 3) == ""


def test_queue_depth_counts_each_request_that_could_take_the_device() -> None:
    queued = [LeaseRequest(key="k")] * 500 + [
        LeaseRequest(key="k", tag_selector={"arch": "arm"}),
        LeaseRequest(key="other"),
        LeaseRequest(key="", tag_selector={"arch": "x86_64"}),
    ]
    shapes = shape_counts(queued)
    assert shapes[("k", ())] == 500
    rows = listing.statuses([record("a/0"), record("a/1"), record("b/1", key="j")], shapes, NOW)
    assert [row.queue_depth for row in rows] == [501, 501, 0]
    assert [row.heartbeat_age_s for row in rows] == [1.0, 1.0, 1.0]


def test_fence_floor_keeps_a_surviving_lease_and_is_above_every_earlier_grant() -> None:
    floors = listing.fence_floors(
        [record("a/0", state=DeviceState.LEASED, fence=123), record("a/1")], NOW
    )
    assert floors["a/0"] == 123
    earlier = next_fence(NOW - 0.001, 0)
    assert floors["a/1"] > earlier
    assert floors["a/1"] <= next_fence(NOW, earlier)

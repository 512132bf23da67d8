"""What ListDevices and Register answer beyond the store's records: pages, queue depths, fence floors.

ListDevices pages: a page holds at most `page_size` devices (0 = DEFAULT_PAGE_SIZE, at most
MAX_PAGE_SIZE) sorted by device id, and its token is the last id it holds, so a listing costs the
store one range read per page whatever the pool's size, and a device registered meanwhile shows
up in its place.

Queue depths count the queued requests that could take each device. Waiters mostly share a few
shapes (key and tag selector), so they are counted once per shape, not once per waiter per device:
with 500 waiters on one key and 1,000 devices that is 1,000 matches instead of 500,000.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tracker.errors import InvalidArgument
from tracker.model import DeviceRecord, DeviceSpec, DeviceState, DeviceStatus
from tracker.store.base import Shape, next_fence

# A page is built in one step of the tracker's event loop, so its size bounds how long every
# other call waits behind a listing. 1,000 devices listed ten times a second beside 500 waiters
# and 16 clients (benchmarks/soak.py, 2 vCPUs): pages of 500 put Acquire+Release at p50 9.0 ms
# on the memory store (3.7x the floor of two empty calls); pages of 100, 2.9 ms (1.2x) and p99
# 14 ms, for ten round trips a listing instead of two.
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# A page token is a device id, which protos.ids bounds at 128 characters.
_MAX_TOKEN_CHARS = 128


def page_size(requested: int) -> int:
    """The page size to serve for a request's `page_size`.

    Raises:
        InvalidArgument: a negative size.
    """
    if requested < 0:
        raise InvalidArgument(f"page_size must not be negative, got {requested}")
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def check_page_token(token: str) -> str:
    """`token` when it can be one this tracker handed out.

    Raises:
        InvalidArgument: it is too long to be a device id.
    """
    if len(token) > _MAX_TOKEN_CHARS:
        raise InvalidArgument(f"page_token must be at most {_MAX_TOKEN_CHARS} characters")
    return token


def next_page_token(records: Sequence[DeviceRecord], size: int) -> str:
    """The token of the page after `records` (read with limit size + 1); "" when it was the last."""
    if len(records) <= size:
        return ""
    return records[size - 1].spec.device_id


def statuses(
    records: Sequence[DeviceRecord], shapes: Mapping[Shape, int], now_unix: float
) -> list[DeviceStatus]:
    """ListDevices' rows for `records`, each with the number of queued requests it could serve
    (`shapes`: the queued requests counted per shape, see TrackerStore.queued_shapes)."""

    def depth(spec: DeviceSpec) -> int:
        total = 0
        for (key, tags), count in shapes.items():
            if key and key != spec.key:
                continue
            if all(spec.tags.get(name) == value for name, value in tags):
                total += count
        return total

    return [
        DeviceStatus(
            record.spec,
            record.state,
            record.lease_holder,
            max(now_unix - record.last_heartbeat_unix, 0.0),
            depth(record.spec) if shapes else 0,
        )
        for record in records
    ]


def fence_floors(records: Iterable[DeviceRecord], now_unix: float) -> dict[str, int]:
    """Per device of a registering agent, the lowest lease fence the agent may still accept.

    A device that kept its lease: that lease's fence. Any other: the fence a grant now would get
    at the least, which is above every lease ever granted on it before now, so leases the tracker
    ended (the agent went silent, or re-registered without the device) are refused at once.
    """
    return {
        record.spec.device_id: (
            record.fence
            if record.state is DeviceState.LEASED and record.fence
            else next_fence(now_unix, 0)
        )
        for record in records
    }

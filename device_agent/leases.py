"""Lease checks on Measure and Run: the tracker's fencing tokens, verified without calling it.

`FencingLeases` is what a secured agent uses (see `protos.fencing` for the token format): the token
must be signed with the pool's lease key for exactly this lease id and device id, must not have
expired (give or take `leeway_s` of clock difference), and must carry a fence no lower than the
highest this agent has seen for the device, so a holder whose lease was granted again to someone
else is refused even before its token expires ("superseded by a newer lease").

A check also says how long the lease has left (the token's expiry plus the leeway, less now): the
agent ends a job, and a wait for the device, no later than that. `AcceptAllLeases` is dev mode (no
pool secrets): every request may use every device, for as long as the agent's own cap allows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from protos.fencing import TokenError, verify

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseCheck:
    """A lease check's outcome: `refusal` says why a request is refused (None: accepted).

    `remaining_s` is how long an accepted lease has left, measured when checked; None when it
    never ends (dev mode).
    """

    refusal: str | None = None
    remaining_s: float | None = None
    fence: int | None = None
    """The lease's fence (None in dev mode)."""


class LeaseVerifier(Protocol):
    """Decides whether a request may use a device, and for how long.

    MUST accept (no `refusal`) only when `lease_token` is a token the tracker issued for `lease_id`
    on `device_id` and the lease has time left, and then give that time as `remaining_s` (> 0)
    unless the lease never ends; a refusal is answered as Status UNAUTHORIZED.
    """

    def check(self, device_id: str, lease_id: str, lease_token: str) -> LeaseCheck: ...

    def raise_floors(self, floors: Mapping[str, int]) -> None:
        """Refuse from now on, per device, every fence below `floors[device_id]`."""


class AcceptAllLeases:
    """Accepts every request, with no end (dev mode, an agent without pool secrets)."""

    def check(self, device_id: str, lease_id: str, lease_token: str) -> LeaseCheck:
        """Always accepted; logs the lease so a run can be traced."""
        _LOG.debug("lease %r on %s accepted without verification", lease_id, device_id)
        return LeaseCheck()

    def raise_floors(self, floors: Mapping[str, int]) -> None:
        """Nothing to refuse: dev mode has no fences."""


class FencingLeases:
    """Verifies HMAC fencing tokens and refuses fences lower than the highest seen per device.

    Args:
        key: the pool's lease key (`lease_key` of the secrets file).
        leeway_s: accepted clock difference between the tracker and this host.
        clock: seconds since the epoch (a test may pass a fake).
    """

    def __init__(
        self, key: bytes, leeway_s: float = 2.0, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = key
        self._leeway_s = leeway_s
        self._clock = clock
        self._lock = threading.Lock()
        self._highest_fence: dict[str, int] = {}

    def check(self, device_id: str, lease_id: str, lease_token: str) -> LeaseCheck:
        """Accepted with the time left when the token is valid and current, else why not."""
        if not lease_token:
            return LeaseCheck(
                f"lease {lease_id!r}: no lease token (acquire the device from the tracker)"
            )
        now = self._clock()
        try:
            claims = verify(self._key, lease_token, lease_id, device_id, now, self._leeway_s)
        except TokenError as e:
            return LeaseCheck(f"lease {lease_id!r} on {device_id}: {e}")
        remaining_s = claims.expires_at_ms / 1000.0 + self._leeway_s - now
        if remaining_s <= 0:
            return LeaseCheck(f"lease {lease_id!r} on {device_id}: lease token has no time left")
        with self._lock:
            highest = self._highest_fence.get(device_id, -1)
            if claims.fence < highest:
                return LeaseCheck(
                    f"lease {lease_id!r} on {device_id} was superseded by a newer lease "
                    f"(fence {claims.fence} < {highest})"
                )
            self._highest_fence[device_id] = claims.fence
        return LeaseCheck(remaining_s=remaining_s, fence=claims.fence)

    def raise_floors(self, floors: Mapping[str, int]) -> None:
        """The tracker's fence floors (sent on registration): lower fences are refused from now."""
        with self._lock:
            for device_id, floor in floors.items():
                if floor > self._highest_fence.get(device_id, -1):
                    self._highest_fence[device_id] = floor

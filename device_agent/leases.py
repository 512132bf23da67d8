"""Lease checks on Measure and Run: the tracker's fencing tokens, verified without calling it.

`FencingLeases` is what a secured agent uses (see `protos.fencing` for the token format): the token
must be signed with the pool's lease key for exactly this lease id and device id, must not have
expired (give or take `leeway_s` of clock difference), and must carry a fence no lower than the
highest this agent has seen for the device, so a holder whose lease was granted again to someone
else is refused even before its token expires ("superseded by a newer lease").

`AcceptAllLeases` is dev mode (no pool secrets): every request may use every device.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from protos.fencing import TokenError, verify

_LOG = logging.getLogger(__name__)


class LeaseVerifier(Protocol):
    """Decides whether a request may use a device.

    MUST return None only when `lease_token` is a token the tracker issued for `lease_id` on
    `device_id` and the lease has not expired; otherwise the reason, which the agent answers as
    Status UNAUTHORIZED.
    """

    def check(self, device_id: str, lease_id: str, lease_token: str) -> str | None: ...


class AcceptAllLeases:
    """Accepts every request (dev mode, an agent without pool secrets)."""

    def check(self, device_id: str, lease_id: str, lease_token: str) -> str | None:
        """Always None; logs the lease so a run can be traced."""
        _LOG.debug("lease %r on %s accepted without verification", lease_id, device_id)
        return None


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

    def check(self, device_id: str, lease_id: str, lease_token: str) -> str | None:
        """None when the token is valid and current, else why not."""
        if not lease_token:
            return f"lease {lease_id!r}: no lease token (acquire the device from the tracker)"
        try:
            claims = verify(
                self._key, lease_token, lease_id, device_id, self._clock(), self._leeway_s
            )
        except TokenError as e:
            return f"lease {lease_id!r} on {device_id}: {e}"
        with self._lock:
            highest = self._highest_fence.get(device_id, -1)
            if claims.fence < highest:
                return (
                    f"lease {lease_id!r} on {device_id} was superseded by a newer lease "
                    f"(fence {claims.fence} < {highest})"
                )
            self._highest_fence[device_id] = claims.fence
        return None

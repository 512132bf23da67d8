"""Lease checks on Measure and Run: the seam where tracker-issued fencing tokens get verified."""

from __future__ import annotations

import logging
from typing import Protocol

_LOG = logging.getLogger(__name__)


class LeaseVerifier(Protocol):
    """Decides whether a request may use a device.

    MUST return True only when `lease_token` is a token the tracker issued for `lease_id` on
    `device_id` and the lease has not expired; the agent answers UNAUTHORIZED otherwise.
    """

    def verify(self, device_id: str, lease_id: str, lease_token: str) -> bool: ...


class AcceptAllLeases:
    """Accepts every request: the default until the agent verifies the tracker's HMAC tokens."""

    def verify(self, device_id: str, lease_id: str, lease_token: str) -> bool:
        """Always True; logs the lease so a run can be traced."""
        _LOG.debug("lease %r on %s accepted without verification", lease_id, device_id)
        return True

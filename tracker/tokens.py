"""Lease tokens: what an agent checks before it measures for a lease holder.

Today a token is random and only the tracker knows it. The seam is `TokenIssuer`: a later
implementation signs (lease_id, device_id, expires_at_unix) with an HMAC key shared with agents,
so an agent can verify a token without calling the tracker.
"""

from __future__ import annotations

import secrets
from typing import Protocol


class TokenIssuer(Protocol):
    """Makes the fencing token for a lease about to be granted."""

    def __call__(self, lease_id: str, device_id: str, expires_at_unix: float) -> str: ...


def random_token(lease_id: str, device_id: str, expires_at_unix: float) -> str:
    """A random 128-bit hex token; the arguments are ignored until tokens are signed."""
    del lease_id, device_id, expires_at_unix
    return secrets.token_hex(16)

"""Lease tokens: what an agent checks before it measures for a lease holder.

A token is an HMAC over (lease_id, device_id, fence, expiry) in the format of `protos.fencing`,
signed with the pool's lease key, so an agent verifies it without calling the tracker. The store
picks the fence (strictly increasing per device across grants) and the expiry; the issuer only
signs. Renew issues a fresh token with the new expiry and the same fence.

A pool without a secrets file has no lease key. Its tokens are signed with a random key made per
process (`ephemeral_issuer`): they have the same shape and carry the fence and expiry, but no agent
can verify them, which is right, since agents of such a pool check no tokens either. There is no
unsigned random token any more: every token says which fence and expiry it stands for.
"""

from __future__ import annotations

import secrets
from typing import Protocol

from protos import fencing


class TokenIssuer(Protocol):
    """Makes the fencing token for a lease being granted or renewed."""

    def __call__(self, lease_id: str, device_id: str, fence: int, expires_at_unix: float) -> str:
        """The token for this lease, device, fence and expiry (seconds since the epoch)."""
        ...


def hmac_issuer(lease_key: bytes) -> TokenIssuer:
    """An issuer signing with `lease_key` (protos.fencing.sign); agents verify with the same key.

    Raises:
        ValueError: the key is empty.
    """
    if not lease_key:
        raise ValueError("lease key must not be empty")

    def issue(lease_id: str, device_id: str, fence: int, expires_at_unix: float) -> str:
        claims = fencing.LeaseClaims(lease_id, device_id, fence, round(expires_at_unix * 1000))
        return fencing.sign(lease_key, claims)

    return issue


def ephemeral_issuer() -> TokenIssuer:
    """An issuer with a random key known to no agent, for pools without a lease key."""
    return hmac_issuer(secrets.token_bytes(32))

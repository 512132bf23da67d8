"""Fencing tokens: the lease proof a tracker signs and an agent checks without calling the tracker.

A token is `k1.<fence>.<expires_at_ms>.<mac>` where mac = HMAC-SHA256 (base64url, no padding) over
`k1|<lease_id>|<device_id>|<fence>|<expires_at_ms>` with the pool's lease key (see protos.auth).
The lease id and device id are not in the token: the agent takes them from the request
(MeasureRequest.lease_id, .device_id), so a token cannot be replayed for another lease or device.

`fence` is strictly increasing per device across grants (the tracker uses the grant time in
microseconds, bumped past the previous fence, so a restarted in-memory tracker still issues higher
fences). An agent remembers the highest fence it has seen per device and refuses lower ones, so a
holder whose lease ended and was granted again cannot measure even before its token expires.
Renew keeps the fence and issues a token with the new expiry.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

VERSION = "k1"


class TokenError(ValueError):
    """A lease token is malformed, forged, for another lease or device, or expired."""


@dataclass(frozen=True)
class LeaseClaims:
    """What a valid token proves: this lease held this device, with this fence, until then."""

    lease_id: str
    device_id: str
    fence: int
    expires_at_ms: int


def _mac(key: bytes, claims: LeaseClaims) -> str:
    message = "|".join(
        (VERSION, claims.lease_id, claims.device_id, str(claims.fence), str(claims.expires_at_ms))
    ).encode()
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign(key: bytes, claims: LeaseClaims) -> str:
    """The token for `claims` under `key`.

    Raises:
        ValueError: the key is empty, or an id contains '|', or fence/expiry is negative.
    """
    if not key:
        raise ValueError("lease key must not be empty")
    if "|" in claims.lease_id or "|" in claims.device_id:
        raise ValueError("lease_id and device_id must not contain '|'")
    if claims.fence < 0 or claims.expires_at_ms < 0:
        raise ValueError("fence and expires_at_ms must be non-negative")
    return f"{VERSION}.{claims.fence}.{claims.expires_at_ms}.{_mac(key, claims)}"


def verify(
    key: bytes,
    token: str,
    lease_id: str,
    device_id: str,
    now_unix: float,
    leeway_s: float = 0.0,
) -> LeaseClaims:
    """Check `token` for this lease and device at `now_unix`; return its claims.

    Args:
        leeway_s: accepted clock difference between tracker and agent hosts.

    Raises:
        TokenError: with the reason (malformed, bad signature, expired).
    """
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != VERSION:
        raise TokenError(f"malformed lease token (want {VERSION}.<fence>.<expires_ms>.<mac>)")
    try:
        fence, expires_at_ms = int(parts[1]), int(parts[2])
    except ValueError:
        raise TokenError("malformed lease token: fence and expiry must be integers") from None
    claims = LeaseClaims(lease_id, device_id, fence, expires_at_ms)
    if not hmac.compare_digest(_mac(key, claims), parts[3]):
        raise TokenError("lease token signature does not match this lease and device")
    if now_unix * 1000.0 > expires_at_ms + leeway_s * 1000.0:
        late_s = now_unix - expires_at_ms / 1000.0
        raise TokenError(f"lease token expired {late_s:.3f} s ago")
    return claims

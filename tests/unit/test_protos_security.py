"""The shared security contract: fencing tokens and the pool secrets file."""

from __future__ import annotations

import os
import stat

import pytest

from protos import auth, fencing

KEY = bytes(range(32))
CLAIMS = fencing.LeaseClaims("lease-1", "dev-0", fence=1_700_000_000_000_000, expires_at_ms=2_000)


def test_valid_token_verifies_and_returns_claims() -> None:
    token = fencing.sign(KEY, CLAIMS)
    assert fencing.verify(KEY, token, "lease-1", "dev-0", now_unix=1.5) == CLAIMS


@pytest.mark.parametrize(
    ("key", "lease_id", "device_id", "now", "reason"),
    [
        (b"another key of 16+ bytes", "lease-1", "dev-0", 1.0, "signature"),
        (KEY, "lease-2", "dev-0", 1.0, "signature"),
        (KEY, "lease-1", "dev-1", 1.0, "signature"),
        (KEY, "lease-1", "dev-0", 2.5, "expired 0.500 s ago"),
    ],
)
def test_wrong_key_lease_device_or_time_is_refused(
    key: bytes, lease_id: str, device_id: str, now: float, reason: str
) -> None:
    token = fencing.sign(KEY, CLAIMS)
    with pytest.raises(fencing.TokenError, match=reason):
        fencing.verify(key, token, lease_id, device_id, now_unix=now)


def test_leeway_admits_small_clock_difference() -> None:
    token = fencing.sign(KEY, CLAIMS)
    assert fencing.verify(KEY, token, "lease-1", "dev-0", now_unix=2.4, leeway_s=0.5).fence == (
        CLAIMS.fence
    )


@pytest.mark.parametrize("token", ["", "k1.1.2", "k2.1.2.abc", "k1.x.2.abc", "k1.1.2.abc.def"])
def test_malformed_tokens_are_refused(token: str) -> None:
    with pytest.raises(fencing.TokenError, match="malformed"):
        fencing.verify(KEY, token, "lease-1", "dev-0", now_unix=0.0)


def test_tampered_fence_or_expiry_breaks_signature() -> None:
    version, fence, expires, mac = fencing.sign(KEY, CLAIMS).split(".")
    for forged in (f"{version}.{int(fence) + 1}.{expires}.{mac}", f"{version}.{fence}.9999.{mac}"):
        with pytest.raises(fencing.TokenError, match="signature"):
            fencing.verify(KEY, forged, "lease-1", "dev-0", now_unix=0.0)


def test_secrets_round_trip_with_private_mode(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "pool.secrets")
    written = auth.write_secrets(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = auth.load_secrets(path)
    assert loaded == written
    assert loaded.role_of(loaded.token(auth.Role.CLIENT)) is auth.Role.CLIENT
    assert loaded.role_of("not a token of this pool") is None
    assert len(loaded.require_lease_key()) == 32
    with pytest.raises(auth.SecretsError, match="cannot create"):
        auth.write_secrets(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("agent\n", r"<s>:1: want 'name = value'"),
        ("# c\nroot = 0123456789abcdef0\n", r"<s>:2: unknown entry 'root'"),
        ("client = short\n", "at least 16 characters"),
        ("lease_key = zz\n", "must be hex"),
        ("lease_key = 00ff\n", "at least 16 bytes"),
    ],
)
def test_malformed_secrets_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(auth.SecretsError, match=message):
        auth.parse_secrets(text, "<s>")


def test_missing_entries_are_named() -> None:
    empty = auth.parse_secrets("", "<s>")
    with pytest.raises(auth.SecretsError, match="no 'agent' token"):
        empty.token(auth.Role.AGENT)
    with pytest.raises(auth.SecretsError, match="no 'lease_key'"):
        empty.require_lease_key()


def test_metadata_round_trip() -> None:
    assert auth.token_from_metadata(auth.call_metadata("abc")) == "abc"
    assert auth.call_metadata(None) == ()
    assert auth.token_from_metadata((("authorization", "Basic abc"),)) is None

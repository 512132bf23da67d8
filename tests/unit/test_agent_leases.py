"""Lease fencing on the agent: tokens signed with protos.fencing, checked with a fake clock."""

from __future__ import annotations

import pytest

from device_agent.leases import AcceptAllLeases, FencingLeases, LeaseCheck
from protos.fencing import LeaseClaims, sign

KEY = b"k" * 32
NOW = 1_800_000_000.0
DEVICE = "agent-1/0"


def token(lease: str = "L1", device: str = DEVICE, fence: int = 10, expires: float = NOW + 30):
    return sign(KEY, LeaseClaims(lease, device, fence, int(expires * 1000)))


def leases(now: float = NOW, leeway_s: float = 2.0) -> FencingLeases:
    return FencingLeases(KEY, leeway_s, clock=lambda: now)


def test_a_valid_token_passes_with_the_time_it_has_left() -> None:
    check = leases(leeway_s=2.0).check(DEVICE, "L1", token(expires=NOW + 30))
    assert check.refusal is None and check.remaining_s == pytest.approx(32.0)


@pytest.mark.parametrize(
    ("lease_id", "device_id", "tok", "reason"),
    [
        ("L1", DEVICE, "", "no lease token"),
        ("L1", DEVICE, "garbage", "malformed"),
        ("L2", DEVICE, token(), "signature does not match"),
        ("L1", "agent-1/1", token(), "signature does not match"),
        ("L1", DEVICE, sign(b"x" * 32, LeaseClaims("L1", DEVICE, 10, int(NOW * 1000) + 9)), "sig"),
        ("L1", DEVICE, token()[:-2] + "AA", "signature does not match"),
    ],
)
def test_forged_or_foreign_tokens_are_refused(
    lease_id: str, device_id: str, tok: str, reason: str
) -> None:
    why = leases().check(device_id, lease_id, tok).refusal
    assert why is not None and reason in why and lease_id in why


def test_expiry_honours_the_leeway() -> None:
    tok = token(expires=NOW - 1.0)
    within = leases(leeway_s=2.0).check(DEVICE, "L1", tok)
    assert within.refusal is None and within.remaining_s == pytest.approx(1.0)
    why = leases(leeway_s=0.5).check(DEVICE, "L1", tok).refusal
    assert why is not None and "expired" in why
    at_the_end = leases(leeway_s=1.0).check(DEVICE, "L1", tok).refusal
    assert at_the_end is not None and "no time left" in at_the_end


def test_a_lower_fence_is_superseded_per_device() -> None:
    verifier = leases()
    assert verifier.check(DEVICE, "new", token("new", fence=20)).refusal is None
    why = verifier.check(DEVICE, "old", token("old", fence=19)).refusal
    assert why is not None and "superseded by a newer lease" in why
    # The same fence again (a renewal) and another device's lower fence are fine.
    assert verifier.check(DEVICE, "new", token("new", fence=20)).refusal is None
    other = token("other", "agent-1/1", fence=5)
    assert verifier.check("agent-1/1", "other", other).refusal is None


def test_accept_all_is_dev_mode_with_no_end() -> None:
    assert AcceptAllLeases().check(DEVICE, "", "") == LeaseCheck()

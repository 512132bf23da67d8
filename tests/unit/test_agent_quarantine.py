"""Quarantine counts CRASH and TIMEOUT per (artifact, entry) and refuses at the threshold."""

from __future__ import annotations

from device_agent.domain import Status
from device_agent.quarantine import Quarantine

SHA = "ab" * 32


def test_refused_after_n_crashes_or_timeouts_only() -> None:
    q = Quarantine(3)
    q.record(SHA, "k", Status.CRASH, "signal 11")
    q.record(SHA, "k", Status.RUNTIME_ERROR, "returned 1")
    q.record(SHA, "k", Status.OK, "")
    q.record(SHA, "k", Status.TIMEOUT, "ran past 1 s")
    assert q.reason(SHA, "k") is None
    q.record(SHA, "k", Status.CRASH, "signal 6")
    reason = q.reason(SHA, "k")
    assert reason is not None and reason.startswith("quarantined:")
    assert "3 times" in reason and "signal 6" in reason and SHA in reason


def test_other_entries_and_artifacts_are_not_affected() -> None:
    q = Quarantine(1)
    q.record(SHA, "k", Status.CRASH, "")
    assert q.reason(SHA, "k") is not None
    assert q.reason(SHA, "sibling") is None
    assert q.reason("cd" * 32, "k") is None


def test_threshold_zero_disables() -> None:
    q = Quarantine(0)
    for _ in range(5):
        q.record(SHA, "k", Status.CRASH, "")
    assert q.reason(SHA, "k") is None

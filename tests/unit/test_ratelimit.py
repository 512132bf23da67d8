"""RateLimitedLog: a burst per kind and window, the rest counted and reported, kinds bounded."""

from __future__ import annotations

import logging

import pytest

from protos.ratelimit import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_costs_a_burst_per_window_and_the_next_line_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = RateLimitedLog(logging.getLogger("flood"), burst=3, window_s=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="flood"):
        written = [log.log("Acquire", logging.INFO, "rejected %d", i) for i in range(10_000)]
        assert sum(written) == 3 and len(caplog.records) == 3
        assert log.log("Renew", logging.INFO, "other kind")  # kinds have their own burst
        assert log.suppressed() == 9_997
        clock.now = 10.0
        assert log.log("Acquire", logging.INFO, "rejected %d", 10_000)
    assert caplog.records[-1].getMessage() == (
        "rejected 10000 (and 9,997 more like it in the last 10 s)"
    )
    assert log.suppressed() == 0


def test_unseen_kinds_past_the_bound_share_one_bucket() -> None:
    log = RateLimitedLog(logging.getLogger("kinds"), burst=1, max_kinds=4, clock=Clock())
    results = [log.log(f"kind-{i}", logging.DEBUG, "x") for i in range(1_000)]
    assert sum(results) == 5  # four kinds of their own, then one shared burst
    assert len(log._buckets) == 5

"""The helpers every model figure rests on: output_mismatch reports each kind of difference, and
loop_seconds returns seconds per call of a loop at least as long as asked."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tuner.network import timing
from tuner.network.timing import loop_seconds, output_mismatch

REF = [np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4), np.ones(5, np.float32)]


def test_equal_outputs_and_differences_within_the_tolerance_pass() -> None:
    assert output_mismatch([r.copy() for r in REF], REF, 1e-4) is None
    near = [REF[0] + 1e-5, REF[1]]  # 1e-5 < 1e-4 x max |ref| (2)
    assert output_mismatch(near, REF, 1e-4) is None


@pytest.mark.parametrize(
    ("ours", "why"),
    [
        ([REF[0] + 1e-3, REF[1]], "output 0 max error 0.001 over 0.0001 x 2"),
        ([REF[0], REF[1][:4]], "output 1 shape (4,) != (5,)"),
        ([REF[0]], "1 outputs, the reference has 2"),
        ([np.full_like(REF[0], np.nan), REF[1]], "output 0 max error nan"),
        ([REF[0], np.full_like(REF[1], np.inf)], "output 1 max error inf"),
    ],
)
def test_each_kind_of_mismatch_is_reported(ours: list[np.ndarray], why: str) -> None:
    got = output_mismatch(ours, REF, 1e-4)
    assert got is not None and got.startswith(why)


def test_loop_seconds_is_seconds_per_call_over_a_loop_at_least_as_long_as_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a clock that moves 2 ms per call (and not otherwise): exactly 2 ms a call, from a
    timed loop of at least 50 ms (25 calls or more) after one warm-up call."""
    now = 0.0
    calls = 0
    reads: list[int] = []  # the call count at each clock read

    def clock() -> float:
        reads.append(calls)
        return now

    def call() -> None:
        nonlocal now, calls
        calls += 1
        now += 0.002

    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock))
    assert loop_seconds(call, 0.05) == pytest.approx(0.002)
    assert reads[0] == 1  # the warm-up call is not timed
    last_loop = reads[-1] - reads[-2]
    assert last_loop * 0.002 >= 0.05 - 1e-12

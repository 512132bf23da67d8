"""Records: round trip, corrupt and future lines skipped with a warning naming the line, best by target."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from tuner import records as rec
from tuner.loop import TuneProgress
from tuner.measure import MeasureResult, Status

WL = rec.Workload("matmul", (64, 64, 64))


def make(
    index: int, seconds: float | None, target: str = "x86_64-avx512", wl: rec.Workload = WL
) -> rec.Record:
    if seconds is None:
        result = MeasureResult.failed(Status.CRASH, "executor killed by SIGSEGV", "a/0")
    else:
        result = MeasureResult(Status.OK, (seconds, seconds * 1.1), device_id="a/0", number_used=4)
    return rec.Record(
        WL if wl is None else wl, target, index, {"tile_m": index}, result, 2 * 64**3, rec.now_iso()
    )


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    written = [make(1, 1e-3), make(2, None)]
    rec.append(path, written)
    assert list(rec.load(path)) == written


def test_corrupt_and_future_lines_are_skipped_with_the_line_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.jsonl"
    rec.append(path, [make(1, 1e-3)])
    with open(path, "a") as f:
        f.write('{"v": 1, "workload": {"op": "matmul"\n')  # torn write
        f.write(json.dumps({**make(3, 1e-3).to_json(), "v": 99}) + "\n")
        f.write(
            json.dumps({**make(4, 2e-3).to_json(), "result": {"status": "NOT_A_STATUS"}}) + "\n"
        )
    rec.append(path, [make(5, 2e-3)])
    with caplog.at_level(logging.WARNING, logger="tuner.records"):
        loaded = list(rec.load(path))
    assert [r.config_index for r in loaded] == [1, 5]
    messages = "\n".join(caplog.messages)
    assert f"{path}:2:" in messages and f"{path}:3: skipped: schema version 99" in messages
    assert f"{path}:4:" in messages


def test_best_ignores_failures_other_targets_and_other_workloads() -> None:
    other_wl = rec.Workload("matmul", (32, 32, 32))
    records = [
        make(1, 3e-3),
        make(2, None),
        make(3, 1e-3, target="aarch64-neon"),  # fastest, but another target
        make(4, 0.5e-3, wl=other_wl),
        make(5, 2e-3),
    ]
    best = rec.best(records, WL, "x86_64-avx512")
    assert best is not None and best.config_index == 5
    assert rec.best(records, WL, "riscv64") is None


def test_gflops_is_zero_for_failed_candidates() -> None:
    assert make(1, None).gflops == 0.0
    assert make(1, 1e-3).gflops == pytest.approx(2 * 64**3 / 1e-3 / 1e9 / 1.0, rel=0.06)


def test_best_judges_a_config_measured_twice_by_its_slower_middle() -> None:
    def record(index: int, seconds: float) -> rec.Record:
        result = MeasureResult(Status.OK, (seconds,), device_id="d/0")
        return rec.Record(WL, "x86_64-avx512", index, {"i": index}, result, 1e9, "t", 10)

    lucky = [record(1, 0.010), record(1, 0.020)]  # one lucky run, then slow
    steady = [record(2, 0.012), record(2, 0.012)]
    best = rec.best([*lucky, *steady], WL, "x86_64-avx512")
    assert best is not None and best.config_index == 2
    # measured once, a config is its one measurement
    only = rec.best([lucky[0], steady[0]], WL, "x86_64-avx512")
    assert only is not None and only.config_index == 1
    assert rec.settled_time([record(3, s) for s in (0.3, 0.1, 0.2)]).result.median_s == 0.2


def _timed(index: int, seconds: float, cold: bool, stamp: str) -> rec.Record:
    result = MeasureResult(Status.OK, (seconds,), device_id="a/0", number_used=4, cold=cold)
    return rec.Record(WL, "x86_64-avx512", index, {"tile_m": index}, result, 2 * 64**3, stamp)


def test_a_cold_time_round_trips_and_an_unknown_mode_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.jsonl"
    cold, warm = _timed(1, 2e-3, True, rec.now_iso()), _timed(2, 1e-3, False, rec.now_iso())
    assert cold.to_json()["result"]["caches"] == "cold" and "caches" not in warm.to_json()["result"]
    rec.append(path, [cold, warm])
    bad = cold.to_json()
    bad["result"]["caches"] = "lukewarm"
    with open(path, "a") as f:
        f.write(json.dumps(bad) + "\n")
    with caplog.at_level(logging.WARNING, logger="tuner.records"):
        assert list(rec.load(path)) == [cold, warm]
    assert "lukewarm" in "\n".join(caplog.messages)


def test_best_never_compares_a_cold_time_with_a_warm_one() -> None:
    """Warm times are shorter (the weights sit in cache): mixed, the warm config would always
    win. The newest record's mode decides; within it, the fastest."""
    warm_then_cold = [
        _timed(1, 1.0e-3, False, "2026-11-27T10:00:00+00:00"),
        _timed(2, 1.2e-3, False, "2026-11-27T10:00:00+00:00"),
        _timed(3, 3.0e-3, True, "2026-11-27T11:00:00+00:00"),
        _timed(4, 2.5e-3, True, "2026-11-27T11:00:00+00:00"),
    ]
    best = rec.best(warm_then_cold, WL, "x86_64-avx512")
    assert best is not None and best.config_index == 4 and best.result.cold
    cold_then_warm = [*warm_then_cold[2:], *warm_then_cold[:2]]  # same stamps, later written wins
    stamped = [
        dataclasses.replace(r, timestamp="2026-11-27T12:00:00+00:00") for r in cold_then_warm
    ]
    best = rec.best(stamped, WL, "x86_64-avx512")
    assert best is not None and best.config_index == 1 and not best.result.cold


def test_a_run_resumed_in_the_other_timing_mode_tracks_the_best_of_the_new_mode() -> None:
    progress = TuneProgress(total=8)
    progress.add([_timed(1, 1.0e-3, False, "a"), _timed(2, 0.9e-3, False, "a")])  # resumed
    progress.add([_timed(3, 3.0e-3, True, "b")])
    assert progress.best is not None and progress.best.config_index == 3
    progress.add([_timed(4, 2.0e-3, True, "b"), _timed(5, 2.5e-3, True, "b")])
    assert progress.best.config_index == 4 and progress.best_at == 4

"""`kiln records summary` and `kiln records plot`, run in-process on records files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kiln import cli
from tuner import records as rec
from tuner.measure import MeasureResult, Status

DENSE = rec.Workload("dense", (64, 64, 64))
CONV = rec.Workload("conv2d_nchwc", (1, 16, 8, 8, 16, 3, 3, 1, 1, 0))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def record(
    wl: rec.Workload, index: int, seconds: float | None, target: str = "x86_64"
) -> rec.Record:
    if seconds is None:
        result = MeasureResult.failed(Status.BUILD_ERROR if index % 2 else Status.TIMEOUT, "no")
    else:
        result = MeasureResult(Status.OK, (seconds,), device_id="h/0")
    return rec.Record(wl, target, index, {"k": index}, result, 1e9, rec.now_iso(), 100)


@pytest.fixture
def records_file(tmp_path: Path) -> Path:
    path = tmp_path / "r.jsonl"
    rec.append(
        path,
        [
            record(DENSE, 1, 0.5),  # 2 GFLOP/s
            record(DENSE, 2, None),  # TIMEOUT
            record(DENSE, 3, None),  # BUILD_ERROR
            record(DENSE, 4, 0.25),  # 4 GFLOP/s: the best
            record(DENSE, 5, 1.0),
            record(CONV, 7, None),
            record(CONV, 8, 0.1),  # 10 GFLOP/s
            record(DENSE, 9, 0.01, target="aarch64-neon"),
        ],
    )
    return path


def run_kiln(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def test_summary_has_a_row_per_workload_and_target(
    records_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_kiln(["records", "summary", str(records_file)], capsys)
    assert code == 0, err
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith("| ")
    ]
    assert rows[0] == [
        "workload", "target", "trials", "OK", "errors", "best GFLOP/s", "best config",
    ]  # fmt: skip
    by_pair = {(r[0], r[1]): r for r in rows[1:]}
    dense = by_pair[("dense(64,64,64) float32", "x86_64")]
    assert dense[2:6] == ["5", "3", "BUILD_ERROR=1 TIMEOUT=1", "4.0"]
    assert dense[6] == '#4 {"k": 4}'
    conv = by_pair[("conv2d_nchwc(1,16,8,8,16,3,3,1,1,0) float32", "x86_64")]
    assert conv[2:6] == ["2", "1", "BUILD_ERROR=1", "10.0"]
    arm = by_pair[("dense(64,64,64) float32", "aarch64-neon")]
    assert arm[5] == "100.0"
    assert "8 records, 3 workload/target pairs" in out


def test_summary_of_a_missing_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_kiln(["records", "summary", str(tmp_path / "nope.jsonl")], capsys)
    assert code == 1 and out == ""
    assert err.strip() == f"kiln: {tmp_path / 'nope.jsonl'}: no such records file"


def test_plot_writes_a_png(
    records_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "curve.png"
    code, out, err = run_kiln(["records", "plot", str(records_file), "-o", str(png)], capsys)
    assert code == 0, err
    assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 1000
    assert "3 curve(s) from 8 records" in out


def test_plot_without_matplotlib_names_the_missing_package(
    records_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # matplotlib is installed here; a None entry in sys.modules makes its import fail the way an
    # absent package does (the only way to test the absent case without uninstalling it).
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = tmp_path / "curve.png"
    code, _, err = run_kiln(["records", "plot", str(records_file), "-o", str(png)], capsys)
    assert code == 1 and not png.exists()
    assert "needs the matplotlib package, which is not installed" in err
    assert "Traceback" not in err


def test_best_so_far_is_monotone_and_takes_failures_as_zero() -> None:
    from kiln.cli.records import best_so_far

    rs = [
        record(DENSE, 1, None),
        record(DENSE, 2, 0.5),
        record(DENSE, 3, 1.0),
        record(DENSE, 4, 0.1),
    ]
    assert best_so_far(rs) == [0.0, 2.0, 2.0, 10.0]


def test_confirmation_runs_are_kept_apart_from_trials(tmp_path: Path) -> None:
    from dataclasses import replace

    from kiln.cli.records import best_so_far, summarize

    lucky = record(DENSE, 1, 0.1)  # 10 GFLOP/s once ...
    rs = [
        lucky,
        record(DENSE, 2, 0.2),
        replace(record(DENSE, 1, 0.5), confirmation=True),  # ... then 2 GFLOP/s, twice
        replace(record(DENSE, 1, 0.5), confirmation=True),
        replace(record(DENSE, 2, 0.2), confirmation=True),
        replace(record(DENSE, 2, 0.2), confirmation=True),
    ]
    path = tmp_path / "r.jsonl"
    rec.append(path, rs)
    loaded = list(rec.load(path))
    assert [r.confirmation for r in loaded] == [False, False, True, True, True, True]
    assert '"confirmation"' not in path.read_text().splitlines()[0]  # only written when set
    [summary] = summarize(loaded)
    assert summary.trials == 2 and summary.ok == 2
    assert summary.best is not None and summary.best.config_index == 2  # the steady one
    assert best_so_far(loaded) == [10.0, 10.0]  # one point per trial


def test_summary_marks_a_best_timed_cold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A workload re-tuned cold: its cold records decide, and the row says so."""
    path = tmp_path / "r.jsonl"
    warm = record(DENSE, 1, 0.1)  # 10 GFLOP/s warm, faster than any cold time
    cold = [
        rec.Record(DENSE, "x86_64", i, {"k": i}, MeasureResult(Status.OK, (s,), cold=True), 1e9,
                   "2099-01-01T00:00:00+00:00", 100)
        for i, s in ((2, 0.5), (3, 0.25))
    ]  # fmt: skip
    rec.append(path, [warm, *cold])
    code, out, err = run_kiln(["records", "summary", str(path)], capsys)
    assert code == 0, err
    [row] = [line for line in out.splitlines() if line.startswith("| dense")]
    assert "| 4.0 cold " in row and '#3 {"k": 3}' in row

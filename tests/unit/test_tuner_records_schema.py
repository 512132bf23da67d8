"""Records schema v2: the fields it writes, v1 files migrated on read, apply_best by target."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tuner import records as rec
from tuner.measure import MeasureResult, Status
from tuner.records import FileRecords, open_store

WL = rec.Workload("matmul", (64, 64, 64))
TARGET = "x86_64-avx512"


def make(
    index: int,
    seconds: float | None,
    target: str = TARGET,
    wl: rec.Workload = WL,
    space_size: int = 100,
) -> rec.Record:
    if seconds is None:
        result = MeasureResult.failed(Status.BUILD_ERROR, "gcc: error", "")
    else:
        result = MeasureResult(Status.OK, (seconds, seconds), device_id="h/0", number_used=8)
    return rec.Record(
        wl, target, index, {"tile": index}, result, 2 * 64**3, rec.now_iso(), space_size
    )


def v1_line(index: int, seconds: float, device: str = "old/3") -> str:
    """A line exactly as the version-1 writer wrote it."""
    return json.dumps(
        {
            "v": 1,
            "workload": {"op": "matmul", "shape": [64, 64, 64], "dtype": "float32"},
            "target": TARGET,
            "config": {"index": index, "knobs": {"tile": index}},
            "result": {
                "status": "OK",
                "samples_s": [seconds],
                "error": "",
                "device_id": device,
                "number_used": 2,
            },
            "flop": 2.0 * 64**3,
            "timestamp": "2026-11-01T00:00:00+00:00",
        }
    )


def test_v2_line_carries_every_field_of_the_schema() -> None:
    obj = json.loads(rec.dumps(make(7, 1e-3)))
    assert obj["v"] == 2
    assert obj["workload"] == {"op": "matmul", "shape": [64, 64, 64], "dtype": "float32"}
    assert obj["target"] == TARGET and obj["space_size"] == 100
    assert obj["config"] == {"index": 7, "knobs": {"tile": 7}}
    assert obj["status"] == "OK" and obj["device"] == "h/0"
    assert obj["result"] == {
        "status": "OK",
        "samples_s": [1e-3, 1e-3],
        "error": "",
        "number_used": 8,
    }
    assert obj["flop"] == 2 * 64**3 and obj["timestamp"]
    failed = json.loads(rec.dumps(make(8, None)))
    assert failed["status"] == failed["result"]["status"] == "BUILD_ERROR"
    assert failed["result"]["error"] == "gcc: error"


def test_a_v1_file_is_read_and_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text(v1_line(3, 2e-3) + "\n" + v1_line(4, 1e-3, device="old/4") + "\n")
    loaded = list(rec.load(path))
    assert [r.config_index for r in loaded] == [3, 4]
    assert [r.device for r in loaded] == ["old/3", "old/4"]
    assert all(r.space_size == 0 and r.status is Status.OK for r in loaded)
    best = rec.apply_best(loaded, WL, TARGET)
    assert best is not None and best.index == 4 and best.knobs == {"tile": 4}
    # a migrated record written back is a v2 line and reads back the same
    again = tmp_path / "new.jsonl"
    rec.append(again, loaded)
    assert list(rec.load(again)) == loaded
    assert all(json.loads(line)["v"] == 2 for line in again.read_text().splitlines())


def test_corrupt_line_is_skipped_with_a_warning_naming_file_and_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.jsonl"
    rec.append(path, [make(1, 1e-3), make(2, 2e-3)])
    with open(path, "a") as f:
        f.write("{this is not json\n")
        f.write('"a string, not an object"\n')
    rec.append(path, [make(5, 3e-3)])
    with caplog.at_level(logging.WARNING, logger="tuner.records"):
        loaded = FileRecords(path).load()
    assert [r.config_index for r in loaded] == [1, 2, 5]
    text = "\n".join(caplog.messages)
    assert f"{path}:3: skipped unreadable record" in text
    assert f"{path}:4: skipped: a record is a JSON object" in text


def test_records_of_another_target_are_never_applied() -> None:
    records = [
        make(1, 5e-3),
        make(2, 1e-6, target="aarch64-neon"),  # far faster, but for another machine
        make(3, 4e-3),
        make(4, 1e-7, wl=rec.Workload("matmul", (32, 32, 32))),
    ]
    best = rec.apply_best(records, WL, TARGET)
    assert best is not None and best.index == 3 and best.device == "h/0"
    assert best.gflops == pytest.approx(2 * 64**3 / 4e-3 / 1e9)
    assert rec.apply_best(records, WL, "x86_64-avx2") is None
    arm = rec.apply_best(records, WL, "aarch64-neon")
    assert arm is not None and arm.index == 2


def test_apply_best_skips_records_of_a_space_of_another_size() -> None:
    records = [make(1, 5e-3, space_size=100), make(2, 1e-3, space_size=80)]
    best = rec.apply_best(records, WL, TARGET, space_size=100)
    assert best is not None and best.index == 1
    assert rec.apply_best([make(9, 1e-3, space_size=0)], WL, TARGET, space_size=100) is not None


def test_file_store_filters_by_workload_and_target(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "r.jsonl"))
    assert isinstance(store, FileRecords)
    assert store.load() == [] and store.best(WL, TARGET) is None
    other = rec.Workload("matmul", (32, 32, 32))
    store.append([make(1, 2e-3), make(2, 1e-3, target="aarch64-neon"), make(3, 1e-3, wl=other)])
    store.append([make(4, None), make(5, 1.5e-3)])
    assert [r.config_index for r in store.load(WL, TARGET)] == [1, 4, 5]
    assert [r.config_index for r in store.load(target="aarch64-neon")] == [2]
    assert [r.config_index for r in store.load(workload=other)] == [3]
    assert len(store.load()) == 5
    best = store.best(WL, TARGET)
    assert best is not None and best.config_index == 5

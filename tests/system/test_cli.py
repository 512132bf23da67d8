"""The `kiln` CLI end to end: real tracker and agent processes, real compiles, real measurements."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tuner import records as rec
from tuner.local_pool import LocalPool


def kiln(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_tune_op_on_an_embedded_pool_writes_every_record(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    out = kiln(
        "tune-op",
        "matmul",
        "--shape",
        "64,48,32",
        "--trials",
        "6",
        "--batch",
        "3",
        "--min-repeat-ms",
        "1",
        "--records",
        str(path),
    )
    assert out.returncode == 0, out.stderr
    assert "best of 6 trials" in out.stdout
    loaded = list(rec.load(path))
    assert len(loaded) == 6
    assert len({r.config_index for r in loaded}) == 6
    assert all(r.workload == rec.Workload("matmul", (64, 48, 32)) for r in loaded)
    assert any(r.result.ok for r in loaded)


def test_tune_op_against_a_running_tracker_and_devices_lists_it(tmp_path: Path) -> None:
    with LocalPool(key="sys-cpu") as pool:
        out = kiln(
            "tune-op",
            "matmul",
            "--shape",
            "32,32,32",
            "--trials",
            "2",
            "--batch",
            "2",
            "--min-repeat-ms",
            "1",
            "--tracker",
            pool.tracker_address,
            "--key",
            "sys-cpu",
        )
        assert out.returncode == 0, out.stderr
        listing = kiln("devices", "--tracker", pool.tracker_address, "--json")
        assert listing.returncode == 0, listing.stderr
        [device] = json.loads(listing.stdout)
        assert device["key"] == "sys-cpu" and device["state"] == "FREE"
        assert device["agent"] == pool.agent_addresses[0]
        table = kiln("devices", "--tracker", pool.tracker_address)
        assert "sys-cpu" in table.stdout and "FREE" in table.stdout


def test_demo_prints_its_table() -> None:
    out = kiln("demo", "--shape", "64,64,64", "--trials", "4")
    assert out.returncode == 0, out.stderr
    header = next(line for line in out.stdout.splitlines() if line.startswith("| trials"))
    assert "best GFLOP/s" in header and "numpy GFLOP/s" in header and "measured on" in header
    row = out.stdout.splitlines()[out.stdout.splitlines().index(header) + 2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "4" and float(cells[2]) > 0 and float(cells[3]) > 0


def test_bad_input_gets_a_clear_error() -> None:
    out = kiln("tune-op", "matmul", "--shape", "64,0,32")
    assert out.returncode == 2 and "every dimension must be positive" in out.stderr
    out = kiln("tune-op", "matmul", "--shape", "8,8,8", "--tracker", "127.0.0.1:1")
    assert out.returncode != 0 and "--key is required" in out.stderr
    out = kiln("tune-op", "conv9", "--shape", "8,8")
    assert out.returncode == 2 and "no op template 'conv9'; known: matmul" in out.stderr
    out = kiln("tune-op", "matmul", "--shape", "8,8")
    assert out.returncode == 2 and "matmul workload is (M, N, K)" in out.stderr
    assert "Traceback" not in out.stderr
    out = kiln("devices", "--tracker", "127.0.0.1:1")
    assert out.returncode == 2 and "UNAVAILABLE" in out.stderr

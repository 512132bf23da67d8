"""The `kiln` CLI end to end: real tracker and agent processes, real compiles, real measurements."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
from kiln_cli import kiln

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc
from protos.auth import Role, call_metadata, write_secrets
from tuner import records as rec
from tuner.measure.local_pool import LocalPool


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
    every = list(rec.load(path))
    loaded = every[:6]
    assert not any(r.confirmation for r in loaded) and len({r.config_index for r in loaded}) == 6
    # then the 4 fastest that worked, measured twice more each (--confirm 4 by default)
    fastest = {
        r.config_index for r in sorted(loaded, key=lambda r: r.result.median_s) if r.result.ok
    }
    confirmed = 2 * min(4, len(fastest)) if len(fastest) >= 2 else 0
    assert all(r.confirmation for r in every[6:]) and len(every) - 6 == confirmed
    assert all(r.workload == rec.Workload("matmul", (64, 48, 32)) for r in every)
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
            "--token-file",
            str(pool.secrets_path),
        )
        assert out.returncode == 0, out.stderr
        creds = ("--token-file", str(pool.secrets_path))
        listing = kiln("devices", "--tracker", pool.tracker_address, "--json", *creds)
        assert listing.returncode == 0, listing.stderr
        [device] = json.loads(listing.stdout)
        assert device["key"] == "sys-cpu" and device["state"] == "FREE"
        assert device["agent"] == pool.agent_addresses[0]
        table = kiln("devices", "--tracker", pool.tracker_address, *creds)
        assert "sys-cpu" in table.stdout and "FREE" in table.stdout


def test_model_demo_tunes_builds_checks_and_times_against_onnxruntime() -> None:
    out = kiln("demo", "--model", "resnet18", "--image", "32", "--trials", "16", "--batch", "4")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(
        line.startswith("estimated latency:") and "after 16 trials" in line for line in lines
    )
    header = next(line for line in lines if line.startswith("| build"))
    assert "latency ms" in header and "onnxruntime / this" in header
    rows = lines[lines.index(header) + 2 : lines.index(header) + 5]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[0].split(" (")[0] for c in cells] == ["kiln, untuned", "kiln, tuned", "onnxruntime"]
    assert "16 trials" in cells[1][0]
    assert all(float(c[1]) > 0 for c in cells) and cells[2][2] == "1.00x"
    summary = next(line for line in lines if line.startswith("tuning: 16 trials"))
    assert "outputs match" in summary and "the tuned build on device " in summary


def test_demo_prints_its_table() -> None:
    out = kiln("demo", "--sgemm", "--shape", "64,64,64", "--trials", "4")
    assert out.returncode == 0, out.stderr
    header = next(line for line in out.stdout.splitlines() if line.startswith("| trials"))
    assert "best GFLOP/s" in header and "numpy GFLOP/s" in header and "measured on" in header
    row = out.stdout.splitlines()[out.stdout.splitlines().index(header) + 2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "4" and float(cells[2]) > 0 and float(cells[3]) > 0


def test_bad_input_gets_a_clear_error() -> None:
    out = kiln("tune-op", "matmul", "--shape", "64,0,32")
    assert out.returncode == 2 and "matmul workload is (M, N, K) of positive ints" in out.stderr
    out = kiln("tune-op", "matmul", "--shape", "8,8,8", "--tracker", "127.0.0.1:1")
    assert out.returncode != 0 and "--key is required" in out.stderr
    out = kiln("tune-op", "conv9", "--shape", "8,8")
    assert out.returncode == 2 and "no op template 'conv9'; known: " in out.stderr
    assert "matmul" in out.stderr.split("known: ")[1]
    out = kiln("tune-op", "matmul", "--shape", "8,8")
    assert out.returncode == 2 and "matmul workload is (M, N, K)" in out.stderr
    assert "Traceback" not in out.stderr
    out = kiln("devices", "--tracker", "127.0.0.1:1")
    assert out.returncode == 1 and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert line.startswith("kiln: tracker 127.0.0.1:1 unreachable: UNAVAILABLE")
    out = kiln("devices", "--tracker", "127.0.0.1:1", "--token-file", "/nonexistent/secrets")
    assert out.returncode == 2 and "cannot read pool secrets /nonexistent/secrets" in out.stderr


def test_devices_with_a_token_file_and_a_bounded_watch(tmp_path: Path) -> None:
    secrets_path = tmp_path / "pool.secrets"
    secrets = write_secrets(secrets_path)
    ready = tmp_path / "ready"
    tracker = subprocess.Popen(
        [sys.executable, "-m", "tracker", "--listen", "127.0.0.1:0",
         "--token-file", str(secrets_path), "--ready-file", str(ready)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert tracker.poll() is None and time.monotonic() < deadline, "tracker did not start"
            time.sleep(0.02)
        address = ready.read_text().strip()
        with grpc.insecure_channel(address) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            devices = [common_pb2.DeviceSpec(key="arm"), common_pb2.DeviceSpec(key="x86")]
            stub.Register(
                tracker_pb2.RegisterRequest(agent_id="h", agent_address="h:1", devices=devices),
                timeout=10,
                metadata=call_metadata(secrets.token(Role.AGENT)),
            )
            stub.Acquire(
                tracker_pb2.AcquireRequest(key="x86", user="carol"),
                timeout=10,
                metadata=call_metadata(secrets.token(Role.CLIENT)),
            )
        refused = kiln("devices", "--tracker", address)
        assert refused.returncode == 1
        [line] = refused.stderr.splitlines()
        assert line == (
            f"kiln: tracker {address} rejected the token (check --token-file): "
            "UNAUTHENTICATED: missing bearer token"
        )
        table = kiln("devices", "--tracker", address, "--token-file", str(secrets_path))
        assert table.returncode == 0, table.stderr
        rows = [line for line in table.stdout.splitlines() if line.startswith("| ")]
        header = [cell.strip() for cell in rows[0].strip("|").split("|")]
        assert header == [
            "key", "device", "backend", "agent", "state", "holder", "heartbeat_age_s", "queue", "tags",
        ]  # fmt: skip
        assert "| arm " in rows[1] and "FREE" in rows[1]
        assert "| x86 " in rows[2] and "LEASED" in rows[2] and "carol" in rows[2]
        assert "2 devices: 1 FREE, 1 LEASED; longest queue 0" in table.stdout
        watched = kiln(
            "devices", "--tracker", address, "--token-file", str(secrets_path),
            "--key", "x86", "--json", "--watch", "0.1", "--count", "3",
        )  # fmt: skip
        assert watched.returncode == 0, watched.stderr
        snapshots = [json.loads(line) for line in watched.stdout.splitlines()]
        assert len(snapshots) == 3
        for snapshot in snapshots:
            [device] = snapshot
            assert (device["device"], device["state"], device["holder"]) == (
                "h/1",
                "LEASED",
                "carol",
            )
    finally:
        tracker.terminate()
        tracker.wait(10)

"""Thread counts through the CLI: `kiln tune-op --cores` tunes on a local device of that core
set; `kiln build --threads N` records N in the model, and `kiln run` runs it on N threads (a
local device on N cores, or a tracker's devices tagged threads=N), refusing a device or a core
set of another count with both counts named. Real tracker, agents and gcc."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import kiln_cli
import numpy as np
import onnx
import pytest
from test_cli_run import tiny_model

from compiler.graph.build_model import ModelArtifact
from tuner import records as rec
from tuner.loop import target_name
from tuner.measure.local_pool import LocalPool

CORES = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")


def kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return kiln_cli.kiln(*args, timeout=180)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model, its input, and builds for one and two threads (no records)."""
    tmp = tmp_path_factory.mktemp("threads")
    model = tmp / "tiny.onnx"
    onnx.save(tiny_model(), model)
    records = tmp / "empty.jsonl"
    records.write_text("")
    np.save(tmp / "x.npy", np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("f4"))
    out = {"model": model, "x": tmp / "x.npy"}
    for threads in (1, 2):
        out[f"t{threads}"] = tmp / f"tiny{threads}.kiln"
        flags = ["--threads", "2"] if threads == 2 else []
        done = kiln("build", str(model), "--records", str(records), "-o", str(out[f"t{threads}"]), *flags)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"kernels for {threads} thread(s)" in done.stdout
    return out


def run(builds: dict[str, Path], build: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return kiln("run", str(builds[build]), "--input", f"x={builds['x']}", "--repeat", "2", *flags)


def test_a_build_records_its_thread_count_and_old_builds_read_as_one(
    builds: dict[str, Path], tmp_path: Path
) -> None:
    meta = {k: json.loads((builds[k] / "model.json").read_text()) for k in ("t1", "t2")}
    assert meta["t1"]["threads"] == 1 and meta["t2"]["threads"] == 2
    assert ModelArtifact.load(builds["t2"]).threads == 2
    old = tmp_path / "old.kiln"
    shutil.copytree(builds["t1"], old)
    del meta["t1"]["threads"]  # a model saved before the count was recorded
    (old / "model.json").write_text(json.dumps(meta["t1"]))
    assert ModelArtifact.load(old).threads == 1


def test_a_two_thread_build_runs_on_two_local_cores_and_refuses_one(
    builds: dict[str, Path],
) -> None:
    ok = run(builds, "t2", "--check", str(builds["model"]))
    assert ok.returncode == 0, ok.stderr
    assert "(2 thread(s), as built)" in ok.stdout and "match onnxruntime" in ok.stdout
    one_core = run(builds, "t2", "--cores", str(CORES[0]))
    assert one_core.returncode == 2, one_core.stderr
    assert "built for 2 thread(s)" in one_core.stderr and "1 core(s)" in one_core.stderr


def test_a_tracker_run_leases_only_devices_of_the_builds_thread_count(
    builds: dict[str, Path],
) -> None:
    for core_sets, fits, refused, why in (
        ((), "t1", "t2", "threads': '2'"),  # one-thread devices: no device is tagged threads=2
        ((tuple(CORES[:2]),), "t2", "t1", "run 2 thread(s)"),
    ):
        with LocalPool(core_sets=core_sets) as pool:
            flags = ["--tracker", pool.tracker_address, "--key", pool.key]
            flags += ["--token-file", str(pool.secrets_path)]
            good = run(builds, fits, *flags)
            assert good.returncode == 0, good.stderr
            bad = run(builds, refused, *flags)
            assert bad.returncode == 1, bad.stderr
            threads = 2 if refused == "t2" else 1
            assert f"built for {threads} thread(s)" in bad.stderr and why in bad.stderr


def test_tune_op_on_local_cores_tunes_for_their_thread_count(tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    cores = f"{CORES[0]},{CORES[1]}"
    out = kiln(
        "tune-op", "softmax", "--shape", "67,130", "--cores", cores, "--trials", "4",
        "--batch", "4", "--confirm", "0", "--records", str(records),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    stored = rec.FileRecords(records).load()
    assert stored and {r.target for r in stored} == {rec.records_target(target_name("host"), 2)}
    assert all("parallel" in r.knobs for r in stored)
    for flags, why in (
        (("--cores", cores, "--tracker", "127.0.0.1:1", "--key", "k"), "local pool"),
        (("--cores", str(CORES[0]), "--cores", str(CORES[0])), "two sets"),
        (("--cores", cores, "--devices", "3"), "one per device"),
    ):
        bad = kiln("tune-op", "softmax", "--shape", "67,130", "--trials", "1", *flags)
        assert bad.returncode == 2 and why in bad.stderr, bad.stderr

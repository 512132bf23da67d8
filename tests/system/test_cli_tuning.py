"""`kiln tune-op` end to end: Ctrl-C then --resume, early stop, conv2d, a template that cannot
build, records in a real redis-server, and `kiln records summary|plot` on what a run wrote.

Real `kiln` processes on an embedded local pool (real tracker and agent, real gcc).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kiln_cli import kiln

from tracker.testing import RedisServer
from tuner import records as rec
from tuner.records.redis import RedisRecords

SMALL = ("--min-repeat-ms", "1", "--repeat", "2", "--build-workers", "1")


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def tracker_refuses(stderr: str) -> bool:
    """Whether the local pool's tracker named in a run's stderr is gone (its port refuses)."""
    [line] = [x for x in stderr.splitlines() if x.startswith("pool: local pool (tracker ")]
    host, port = line.split()[4].rstrip("),").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        return True
    return False


# `python -m kiln` with SIGINT raising KeyboardInterrupt, as a shell's foreground job has it: a
# shell's background job inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored. Set
# in the child's Python, not by a preexec_fn: a preexec_fn makes Popen fork() (not vfork), which
# runs gRPC's fork handlers in the child, and grpcio 1.80 onwards can then abort it before exec
# ("epoll_wait error: Bad file descriptor", grpc/grpc#43055; this process holds gRPC channels of
# earlier tests).
KILN_WITH_SIGINT = (
    sys.executable,
    "-c",
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'kiln'; runpy.run_module('kiln', run_name='__main__', alter_sys=True)",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_a_stopped_run_resumes_without_remeasuring_and_ends_at_the_budget(
    tmp_path: Path, signum: int, code: int
) -> None:
    path = tmp_path / "r.jsonl"
    budget, batch = "40", "4"
    common = ("tune-op", "dense", "--shape", "48,32,64", "--trials", budget, "--batch", batch)
    proc = subprocess.Popen(
        [*KILN_WITH_SIGINT, *common, *SMALL, "--tuner", "random", "--records", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while lines_of(path) < 8:  # two batches on disk
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no records written in time"
            time.sleep(0.05)
        os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == code, err
    assert "run again with --resume" in err and "Traceback" not in err
    assert tracker_refuses(err)  # the local pool was stopped, not orphaned
    first = list(rec.load(path))
    assert 8 <= len(first) < 40 and len(first) % 4 == 0  # whole batches only
    assert len({r.config_index for r in first}) == len(first)

    out = kiln(*common, *SMALL, "--records", str(path), "--resume")  # the default xgb tuner
    assert out.returncode == 0, out.stderr
    assert f"best of 40 trials, {len(first)} of them resumed" in out.stdout
    every = list(rec.load(path))
    trials = [r for r in every if not r.confirmation]
    assert len(trials) == 40
    assert len({r.config_index for r in trials}) == 40  # no trial measured twice
    assert every[: len(first)] == first
    # then the 4 fastest were measured twice more, to confirm them (--confirm 4 by default)
    confirmed = every[40:]
    assert len(confirmed) == 8 and all(r.confirmation for r in confirmed)
    fastest = sorted(trials, key=lambda r: r.result.median_s)[:4]
    assert {r.config_index for r in confirmed} == {r.config_index for r in fastest}


def test_early_stop_conv2d_by_its_short_name_and_transfer_to_a_new_workload(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    conv = "1,16,6,6,16,3,3,1,1,0"
    out = kiln(
        "tune-op", "conv2d", "--shape", conv, "--trials", "200", "--batch", "2",
        "--early-stop", "2", "--tuner", "random", "--records", str(path), *SMALL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "stopped: no better candidate in 2 trials" in out.stdout
    loaded = list(rec.load(path))
    assert 4 <= len(loaded) < 200
    assert {r.workload for r in loaded} == {
        rec.Workload("conv2d_nchwc", (1, 16, 6, 6, 16, 3, 3, 1, 1, 0))
    }
    bad = kiln("tune-op", "conv2d", "--shape", "1,16,6,6")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "conv2d_nchwc workload is (N, IC, H, W, OC, KH, KW, stride, pad, epilogue)" in (
        bad.stderr
    )
    assert "(conv2d is conv2d_nchwc)" in bad.stderr
    # a new workload on the same target: the conv records pretrain the model-guided searcher
    dense = ("tune-op", "dense", "--shape", "32,32,32", "--trials", "2", "--records", str(path))
    out = kiln(*dense, *SMALL)
    assert out.returncode == 0, out.stderr
    configs = len({r.config_index for r in loaded})
    assert f"transfer: a model of {configs} records of 1 other workloads on " in out.stderr
    out = kiln(*dense, "--resume", "--trials", "3", "--no-transfer", *SMALL)
    assert out.returncode == 0, out.stderr
    assert "transfer:" not in out.stderr and "best of 3 trials, 2 of them resumed" in out.stdout


def test_a_template_that_cannot_build_ends_fast_with_the_cause(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "empty")}  # no gcc: every build fails
    out = kiln(
        "tune-op", "dense", "--shape", "32,32,32", "--trials", "500", "--batch", "3",
        "--tuner", "random", "--records", str(tmp_path / "r.jsonl"), *SMALL, env=env,
    )  # fmt: skip
    assert out.returncode == 1
    [message] = [line for line in out.stderr.splitlines() if line.startswith("kiln: ")]
    assert "worked in the first 6 trials (2 batches); giving up" in message
    assert "6x BUILD_ERROR: BuildError: compiler 'gcc' is not on PATH" in message
    assert lines_of(tmp_path / "r.jsonl") == 6  # the failures are records too


def test_records_in_redis_then_summary_and_plot(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as server:
        url = server.url(prefix="sys:")
        out = kiln(
            "tune-op", "matmul", "--shape", "32,32,32", "--trials", "6", "--batch", "3",
            "--records", url, "--confirm", "2", *SMALL,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        store = RedisRecords(url)
        [wl] = {r.workload for r in store.load()}
        loaded = store.load(wl, store.load()[0].target)
        assert wl == rec.Workload("matmul", (32, 32, 32)) and len(loaded) == 6 + 2 * 2
        assert sum(r.confirmation for r in loaded) == 4  # the flag survives the round trip
        best = store.best(wl, loaded[0].target)
        assert best is not None and best.config_index in {r.config_index for r in loaded}
        store.close()
        summary = kiln("records", "summary", url)
        assert summary.returncode == 0, summary.stderr
        [row] = [line for line in summary.stdout.splitlines() if line.startswith("| matmul")]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "6" and cells[5] == f"{best.gflops:.1f}"
        png = tmp_path / "curve.png"
        plot = kiln("records", "plot", url, "-o", str(png))
        assert plot.returncode == 0, plot.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_local_pool_of_two_devices_measures_on_both(tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    out = kiln(
        "tune-op", "dense", "--shape", "48,48,48", "--trials", "16", "--batch", "8",
        "--devices", "2", "--tuner", "random", "--records", str(records), "--confirm", "0",
        *SMALL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = list(rec.load(records))
    assert len(got) == 16 and all(r.result.ok for r in got)
    assert len({r.result.device_id for r in got}) == 2

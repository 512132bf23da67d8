"""`kiln tune-op dense --key gpu` tunes on a GPU agent exactly as on a CPU one: the device's
`arch=cuda, sm=90` tags make the target "cuda/sm=90", dense becomes the GPU template cuda_dense,
candidates are built with nvcc into CUDA containers, measured on the agent, and recorded under
a target that names the sm.

No GPU here: the agent runs `--backend cuda` on its fake driver (KILN_CUDA_DRIVER=fake), which
loads the cubins (finding their kernels in the ELF symbol table), launches nothing that computes a GEMM
and times every launch alike; its results are labelled emulated. So the tuning run has its check
off, and a second run with the check on shows the check working: the host reference runs on the
agent and every candidate's (uncomputed) output is a WRONG_ANSWER.

Real `python -m tracker`, `python -m device_agent` and `python -m kiln` processes on 127.0.0.1
(port 0), secured with a pool secrets file; every wait bounded; the servers ended by pid.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kiln_cli import kiln
from test_vta_sim_pool import spawn, stop

from compiler import ops
from compiler.toolchain import CACHE_ENV, find_nvcc
from protos.auth import write_secrets
from tuner import records as rec
from tuner.measure import Status

pytestmark = [
    pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc"),
    pytest.mark.skipif(
        "cuda_dense" not in ops.template_names(), reason="the cuda_dense template is not registered"
    ),
]

SHAPE = "64,64,64"
TRIALS = 4


@contextmanager
def gpu_pool(workdir: Path, secrets_path: Path) -> Iterator[str]:
    """A real tracker and a `--backend cuda --key gpu` agent on the fake driver; yields the
    tracker's address and ends both by pid."""
    procs = []
    try:
        tracker, address = spawn(
            workdir, "tracker",
            ["tracker", "--listen", "127.0.0.1:0", "--token-file", str(secrets_path)],
        )  # fmt: skip
        procs.append(tracker)
        agent, _ = spawn(
            workdir, "agent",
            ["device_agent", "--tracker", address, "--key", "gpu", "--backend", "cuda",
             "--listen", "127.0.0.1:0", "--token-file", str(secrets_path),
             "--cache-dir", str(workdir / "cache")],
            {"KILN_CUDA_DRIVER": "fake"},
        )  # fmt: skip
        procs.append(agent)
        yield address
    finally:
        for proc in reversed(procs):
            stop(proc)


def tune_op(
    workdir: Path, address: str, secrets: Path, records: Path, *more: str
) -> subprocess.CompletedProcess[str]:
    """`kiln tune-op dense` on the pool, its candidates shipped as PTX (what the fake loads)."""
    env = {**os.environ, CACHE_ENV: str(workdir / "build-cache")}
    return kiln(
        "tune-op", "dense", "--shape", SHAPE, "--tracker", address, "--key", "gpu",
        "--token-file", str(secrets), "--trials", str(TRIALS), "--records", str(records), *more,
        env=env, timeout=300,
    )  # fmt: skip


def test_tune_op_on_a_gpu_agent_records_the_sm(tmp_path: Path) -> None:
    secrets = tmp_path / "pool.secrets"
    write_secrets(secrets)
    tuned, checked = tmp_path / "tuned.jsonl", tmp_path / "checked.jsonl"
    with gpu_pool(tmp_path, secrets) as address:
        out = tune_op(tmp_path, address, secrets, tuned, "--no-check")
        wrong = tune_op(tmp_path, address, secrets, checked, "--confirm", "0")
    assert out.returncode == 0, out.stderr
    assert "target cuda/sm=90" in out.stderr
    assert "dense on cuda/sm=90 tunes cuda_dense 64,64,64" in out.stderr
    assert f"best of {TRIALS} trials" in out.stdout and "emulated" in out.stdout

    every = list(rec.load(tuned))
    trials = [r for r in every if not r.confirmation]
    assert len(trials) == TRIALS
    assert all(r.status == Status.OK and r.target == "cuda/sm=90" for r in every)
    assert all(r.workload == rec.Workload("cuda_dense", (64, 64, 64)) for r in every)
    assert len({r.config_index for r in trials}) == TRIALS

    # with the check on, the agent runs the host reference and catches the fake's output
    assert wrong.returncode != 0
    assert "WRONG_ANSWER" in wrong.stderr, wrong.stderr
    checked_records = list(rec.load(checked))
    assert checked_records and all(r.status == Status.WRONG_ANSWER for r in checked_records)
    assert all(r.target == "cuda/sm=90" for r in checked_records)

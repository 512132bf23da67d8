"""`kiln tune-op vta_conv2d --key vta-sim` tunes the convolution whose instruction streams are
lowered from its TE schedule, on simulated cycles, through a real tracker and a real vta_sim
agent: every candidate is an accelerator program checked on the agent against the host-built
reference of the same tensor expression.

Real `python -m tracker`, `python -m device_agent` and `python -m kiln` processes on 127.0.0.1
(port 0), secured with a pool secrets file; every wait bounded; the servers ended by pid.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kiln_cli import kiln
from test_vta_sim_pool import vta_pool

from compiler.ops.vta_conv2d import VtaConv2dTemplate
from protos.auth import write_secrets
from tuner import records as rec
from tuner.measure import Status
from tuner.measure.device_target import vta_records_name

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SHAPE = (32, 10, 10, 32, 3, 1, 1)


def test_tune_op_vta_conv2d_on_a_vta_sim_agent(tmp_path: Path) -> None:
    secrets_path = tmp_path / "pool.secrets"
    write_secrets(secrets_path)
    records_path = tmp_path / "R.jsonl"
    with vta_pool(tmp_path, secrets_path) as tracker_address:
        out = kiln(
            "tune-op", "vta_conv2d", "--shape", ",".join(map(str, SHAPE)),
            "--tracker", tracker_address, "--key", "vta-sim",
            "--token-file", str(secrets_path), "--trials", "8", "--records", str(records_path),
            timeout=240,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "target vta" in out.stderr and "best of 8 trials" in out.stdout

    every = list(rec.load(records_path))
    trials = [r for r in every if not r.confirmation]
    assert len(trials) == 8
    target = vta_records_name()
    # OK means the agent ran the program and its output equalled the host reference's
    assert all(r.status == Status.OK and r.target == target for r in every)
    template = VtaConv2dTemplate()
    space = template.config_space(SHAPE)
    best = rec.best(every, rec.Workload("vta_conv2d", SHAPE), target, len(space))
    assert best is not None
    assert template.worth_measuring(SHAPE, space.get(best.config_index), "vta")
    assert len({r.result.samples_s[0] for r in trials}) > 1  # configs differ in simulated time

"""`kiln tune-op vta_dense|vta_conv2d --key vta-sim` tunes on simulated cycles through a real
tracker and a real `device_agent --backend vta_sim` agent: the device's `arch=vta` tag makes the
target "vta", candidates are accelerator programs (vta_conv2d's lowered from its TE schedule)
checked on the agent against the host-built reference of the same tensor expression.

Real `python -m tracker`, `python -m device_agent` and `python -m kiln` processes on 127.0.0.1
(port 0), secured with a pool secrets file; every wait bounded; the servers ended by pid.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from kiln_cli import kiln
from test_vta_sim_pool import vta_pool

from compiler.ops.vta_conv2d import VtaConv2dTemplate
from compiler.ops.vta_dense import VtaDenseTemplate, VtaOpTemplate
from protos.auth import write_secrets
from protos.vta import VtaSpec
from tuner import records as rec
from tuner.measure import Status
from tuner.measure.device_target import vta_records_name

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SHAPE = (64, 64, 64)
CASES = [
    ("vta_dense", SHAPE, VtaDenseTemplate),
    ("vta_conv2d", (32, 10, 10, 32, 3, 1, 1), VtaConv2dTemplate),
]


@pytest.mark.parametrize(("op", "shape", "template_type"), CASES, ids=[c[0] for c in CASES])
def test_tune_op_on_a_vta_sim_agent(
    tmp_path: Path, op: str, shape: tuple[int, ...], template_type: type[VtaOpTemplate]
) -> None:
    secrets_path = tmp_path / "pool.secrets"
    write_secrets(secrets_path)
    records_path = tmp_path / "R.jsonl"
    with vta_pool(tmp_path, secrets_path) as tracker_address:
        out = kiln(
            "tune-op", op, "--shape", ",".join(map(str, shape)),
            "--tracker", tracker_address, "--key", "vta-sim",
            "--token-file", str(secrets_path), "--trials", "8", "--records", str(records_path),
            timeout=240,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "target vta" in out.stderr and "best of 8 trials" in out.stdout

    every = list(rec.load(records_path))
    trials = [r for r in every if not r.confirmation]
    assert len(trials) == 8
    target = vta_records_name()  # the spec the agent simulates, the default one
    # OK means the agent ran the program and its output equalled the host reference's
    assert all(r.status == Status.OK and r.target == target for r in every)
    assert all(r.workload == rec.Workload(op, shape) for r in every)

    template = template_type()
    space = template.config_space(shape)
    best = rec.best(every, rec.Workload(op, shape), target, len(space))
    assert best is not None
    config = space.get(best.config_index)
    assert dict(config) == best.knobs
    assert template.worth_measuring(shape, config, "vta")
    assert len({r.result.samples_s[0] for r in trials}) > 1  # configs differ in simulated time

    # simulated cycles, not wall time: a config measured again (the confirmations) takes
    # exactly the time it took before, every sample alike
    confirmed = [r for r in every if r.confirmation]
    assert confirmed
    for r in confirmed:
        [trial] = [t for t in trials if t.config_index == r.config_index]
        assert r.result.samples_s == trial.result.samples_s
        assert len(set(r.result.samples_s)) == 1


def test_tune_op_on_a_device_of_another_spec_builds_for_that_spec(tmp_path: Path) -> None:
    """The target names the device's spec, the builder builds for it (a program of another spec
    would not load), and the records carry it: none is the default spec's."""
    secrets_path = tmp_path / "pool.secrets"
    write_secrets(secrets_path)
    records_path = tmp_path / "R.jsonl"
    spec = dataclasses.replace(VtaSpec(), dram_latency_cycles=256)
    overrides = {"KILN_VTA_SPEC": json.dumps({"dram_latency_cycles": 256})}
    with vta_pool(tmp_path, secrets_path, overrides) as tracker_address:
        out = kiln(
            "tune-op", "vta_dense", "--shape", ",".join(map(str, SHAPE)),
            "--tracker", tracker_address, "--key", "vta-sim",
            "--token-file", str(secrets_path), "--trials", "6", "--records", str(records_path),
            "--confirm", "0", timeout=240,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"target vta/spec={spec.key()}" in out.stderr
    every = list(rec.load(records_path))
    assert len(every) == 6
    assert all(r.status == Status.OK for r in every), [r.result.error for r in every]
    assert {r.target for r in every} == {vta_records_name(spec.key())} != {vta_records_name()}


def test_tune_op_conv2d_on_a_vta_device_tunes_its_int8_template(tmp_path: Path) -> None:
    """`kiln tune-op conv2d` names the float op; on an accelerator it becomes vta_conv2d."""
    secrets_path = tmp_path / "pool.secrets"
    write_secrets(secrets_path)
    records_path = tmp_path / "R.jsonl"
    with vta_pool(tmp_path, secrets_path) as tracker_address:
        common = ["--tracker", tracker_address, "--key", "vta-sim", "--token-file",
                  str(secrets_path), "--records", str(records_path)]  # fmt: skip
        out = kiln("tune-op", "conv2d", "--shape", "1,32,10,10,32,3,3,1,1,2", "--trials", "4",
                   "--confirm", "0", *common, timeout=240)  # fmt: skip
        batch2 = kiln("tune-op", "conv2d", "--shape", "2,32,10,10,32,3,3,1,1,2", "--trials", "4",
                      *common, timeout=240)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "conv2d_nchwc on vta tunes vta_conv2d 32,10,10,32,3,1,1 (int8)" in out.stderr
    every = list(rec.load(records_path))
    assert len(every) == 4 and all(r.status == Status.OK for r in every)
    # the same workload `tune-op vta_conv2d --shape 32,10,10,32,3,1,1` records
    assert {r.workload for r in every} == {rec.Workload("vta_conv2d", (32, 10, 10, 32, 3, 1, 1))}
    assert batch2.returncode == 2 and "batch 1" in batch2.stderr

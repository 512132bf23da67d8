"""A quantised ResNet-18 (reduced: 32x32 images, width 16) tuned and run through the pool: real
tracker and `--backend vta_sim` agent processes; every conv and the head are tuned on simulated
cycles and run as accelerator programs, the rest on this machine, and the logits equal the numpy
int8 reference bit for bit. Records carry the agent's spec: a second agent simulating another
spec finds none of them, and runs the network with programs built for its own spec.

Real `python -m tracker` and `python -m device_agent` processes on 127.0.0.1 (port 0), secured
with a pool secrets file; every wait bounded; the servers ended by pid.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_vta_sim_pool import spawn, stop, vta_pool, wait_registered

import kiln
from compiler.quantized.accel import LOWERING, DirectConv
from compiler.quantized.resnet import calibration_image, int8_resnet18, reference
from device_agent.backends.vta_sim import SPEC_ENV
from kiln.accel_model import device_vta_spec, run_network, tune_layers
from protos.auth import write_secrets
from protos.vta import VtaSpec
from tuner import records as rec
from tuner.options import TuneOptions

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

TRIALS = 4
OTHER_SPEC = {"dram_latency_cycles": 128, "clock_mhz": 200}


def test_a_quantised_resnet18_runs_through_the_pool_bit_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets_path = tmp_path / "pool.secrets"
    write_secrets(secrets_path)
    records_path = tmp_path / "R.jsonl"
    net = int8_resnet18(image=32, width=16, classes=10, seed=0)
    picture = calibration_image(32, seed=9)
    expected = reference(net, picture)
    options = TuneOptions(trials=TRIALS, batch_size=TRIALS, confirm=0)
    with vta_pool(tmp_path, secrets_path) as tracker_address:
        with kiln.Pool(tracker_address, key="vta-sim", token_file=secrets_path) as pool:
            assert device_vta_spec(pool) == VtaSpec()
            configs = tune_layers(pool, net, TRIALS, records_path, options)
            tuned = records_path.read_text().count("\n")
            run = run_network(pool, net, picture, configs)
            # a second time, every workload's config comes from the records
            assert tune_layers(pool, net, TRIALS, records_path, options) == configs
            assert records_path.read_text().count("\n") == tuned
            target_a = pool.records_target

        assert run.logits.dtype == np.int8 and run.logits.shape == (10,)
        assert np.array_equal(run.logits, expected)
        assert len(set(expected.tolist())) > 3  # logits that say something
        assert [layer.name for layer in run.layers] == [c.name for c in net.convs()]
        workloads = {LOWERING.workload(c) for c in net.convs()}
        every = list(rec.load(records_path))
        assert {r.workload.shape for r in every} == workloads
        assert all(r.target == target_a for r in every)
        for layer in run.layers:
            cycles = layer.cycles
            assert layer.seconds == pytest.approx(cycles.total_cycles / 100e6)
            assert 0 < cycles.gemm_cycles <= cycles.busy_cycles["compute"] <= cycles.total_cycles
            assert set(cycles.busy_cycles) == {"load", "compute", "store"}
            assert all(0 < cycles.utilisation(m) <= 1 for m in cycles.busy_cycles)
            assert layer.config == configs[layer.name]
        assert run.accel_s == pytest.approx(sum(x.seconds for x in run.layers))

        # an agent simulating another spec: none of these records serve it; its programs are
        # built for its spec, and the network is still exact
        monkeypatch.setenv(SPEC_ENV, json.dumps(OTHER_SPEC))
        other, _ = spawn(
            tmp_path, "agent-b",
            ["device_agent", "--tracker", tracker_address, "--key", "vta-sim-b", "--backend",
             "vta_sim", "--listen", "127.0.0.1:0", "--token-file", str(secrets_path),
             "--cache-dir", str(tmp_path / "cache-b")],
        )  # fmt: skip
        monkeypatch.delenv(SPEC_ENV)
        try:
            wait_registered(tracker_address, secrets_path, "vta-sim-b")
            with kiln.Pool(tracker_address, key="vta-sim-b", token_file=secrets_path) as pool_b:
                spec_b = device_vta_spec(pool_b)
                assert spec_b.dram_latency_cycles == 128 and spec_b.clock_mhz == 200
                assert pool_b.records_target != target_a
                store = rec.FileRecords(records_path)
                for shape in workloads:
                    workload = rec.Workload(LOWERING.template, shape)
                    assert store.best(workload, target_a) is not None
                    assert store.best(workload, pool_b.records_target) is None
                run_b = run_network(pool_b, net, picture, configs)
        finally:
            stop(other)
    assert np.array_equal(run_b.logits, expected)
    for a, b in zip(run.layers, run_b.layers, strict=True):
        assert b.seconds == pytest.approx(b.cycles.total_cycles / 200e6)
        assert b.cycles.gemm_cycles == a.cycles.gemm_cycles  # the same work on another clock


def test_the_network_with_direct_convs_lowered_from_te_runs_bit_exact(tmp_path: Path) -> None:
    """The same network with every conv a `vta_conv2d` program (the TE schedule's lowering, the
    input DMA'd with its padding by the accelerator): tuned and run on the agent, exact."""
    secrets_path = tmp_path / "pool.secrets"
    write_secrets(secrets_path)
    records_path = tmp_path / "R.jsonl"
    net = int8_resnet18(image=32, width=16, classes=10, seed=0)
    picture = calibration_image(32, seed=9)
    options = TuneOptions(trials=TRIALS, batch_size=TRIALS, confirm=0)
    direct = DirectConv()
    with (
        vta_pool(tmp_path, secrets_path) as tracker_address,
        kiln.Pool(tracker_address, key="vta-sim", token_file=secrets_path) as pool,
    ):
        configs = tune_layers(pool, net, TRIALS, records_path, options, lowering=direct)
        run = run_network(pool, net, picture, configs, lowering=direct)
    assert np.array_equal(run.logits, reference(net, picture))
    every = list(rec.load(records_path))
    assert {r.workload.op for r in every} == {"vta_conv2d"}
    assert {r.workload.shape for r in every} == {direct.workload(c) for c in net.convs()}
    assert all(layer.cycles.gemm_cycles > 0 for layer in run.layers)

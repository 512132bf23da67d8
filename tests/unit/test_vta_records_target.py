"""Records of an accelerator carry its spec: tuned under one VTA spec, never served to another."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from protos.vta import VtaSpec
from tuner import records as rec
from tuner.loop import target_name
from tuner.measure import MeasureResult, Status
from tuner.measure.device_target import device_records_target, vta_records_name

WORKLOAD = rec.Workload("vta_dense", (64, 64, 64), "int8")


def vta_tags(spec: VtaSpec, **more: str) -> dict[str, str]:
    """The tags a vta_sim agent registers a device of `spec` with."""
    return {"backend": "vta_sim", "arch": "vta", "emulated": "vta-sim", "vta_spec": spec.key(),
            **more}  # fmt: skip


def a_record(target: str, seconds: float) -> rec.Record:
    result = MeasureResult(Status.OK, samples_s=(seconds,), emulated=True)
    knobs = {"tile_m": 16, "tile_n": 1, "tile_k": 1, "vthreads": 2}
    return rec.Record(WORKLOAD, target, 3, knobs, result, 2.0 * 64**3, "t", space_size=10)


def test_the_records_target_names_the_spec() -> None:
    a, b = VtaSpec(), dataclasses.replace(VtaSpec(), dram_latency_cycles=128)
    target_a, target_b = device_records_target(vta_tags(a)), device_records_target(vta_tags(b))
    assert target_a == f"vta/spec={a.key()}" == vta_records_name(a.key())
    assert target_b == f"vta/spec={b.key()}" != target_a
    assert device_records_target(vta_tags(a, threads="2")) == f"{target_a}/threads=2"
    # the tuning loop's records of the `vta` target are the default spec's (what the
    # templates build for), so they are a default device's records
    assert target_name("vta") == target_a


def test_a_record_tuned_under_one_spec_does_not_serve_another(tmp_path: Path) -> None:
    a, b = VtaSpec(), dataclasses.replace(VtaSpec(), clock_mhz=200)
    target_a, target_b = device_records_target(vta_tags(a)), device_records_target(vta_tags(b))
    store = rec.FileRecords(tmp_path / "R.jsonl")
    store.append([a_record(target_a, 1e-4)])
    found = store.best(WORKLOAD, target_a)
    assert found is not None and found.knobs["vthreads"] == 2
    assert store.best(WORKLOAD, target_b) is None
    assert rec.best(store.load(WORKLOAD), WORKLOAD, target_b) is None
    store.append([a_record(target_b, 2e-4)])  # once spec B has its own, it gets its own
    found_b = store.best(WORKLOAD, target_b)
    assert found_b is not None and found_b.result.samples_s == (2e-4,)

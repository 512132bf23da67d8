"""Tuning on a device of several threads (`kiln-agent --cores`): the builder builds the space with
the `parallel` knob, the device runs the kernels on its cores, and the records carry the count."""

from __future__ import annotations

import os
from pathlib import Path

import kiln
from compiler.ops.base import PARALLEL_KNOB
from tuner import records as rec
from tuner.loop import target_name
from tuner.measure.local_pool import LocalPool

CORES = sorted(os.sched_getaffinity(0))


def test_a_device_on_a_core_set_tunes_parallel_kernels_into_its_own_records(
    tmp_path: Path,
) -> None:
    cores = ",".join(map(str, CORES))
    records = tmp_path / "r.jsonl"
    with (
        LocalPool(extra_agent_args=("--cores", cores)) as local,
        kiln.Pool(local.tracker_address, key=local.key, token_file=local.secrets_path) as pool,
    ):
        assert pool.threads == len(CORES)
        progress = kiln.tune_op(pool, "dense", (37, 50, 64), trials=6, records=records)
    assert progress.best is not None and progress.best.result.ok
    stored = rec.FileRecords(records).load()
    assert stored and {r.target for r in stored} == {
        rec.records_target(target_name("host"), len(CORES))
    }
    has_knob = {PARALLEL_KNOB in r.knobs for r in stored}
    assert has_knob == {len(CORES) > 1}  # a one-thread device never searches the knob

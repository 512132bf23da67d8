"""Build worker processes: pinned to the cores asked for, using the given compile cache."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tuner.measure.builder import LocalBuilder
from tuner.records import Workload

WL = Workload("matmul", (16, 16, 16))


def test_pinned_build_workers_run_on_the_given_core(tmp_path: Path) -> None:
    core = max(os.sched_getaffinity(0))
    builder = LocalBuilder(workers=1, per_unit=2, cache_dir=tmp_path, cpus=[core])
    try:
        built = builder.build(WL, [0, 1])
        assert builder._pool is not None
        affinity = builder._pool.submit(os.sched_getaffinity, 0).result(timeout=60)
    finally:
        builder.close()
    assert affinity == {core}
    assert all(b.artifact is not None for b in built)
    assert len(list(tmp_path.glob("*.so"))) == 1  # the worker used the given cache directory


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_device_core_gets_one_more_worker_at_idle_priority(tmp_path: Path) -> None:
    """`idle_cpus`: the first `workers` build on `cpus` as usual, one more per device core
    builds there in SCHED_IDLE (so a measurement on that core preempts it), gcc included."""
    free, device = sorted(os.sched_getaffinity(0))[:2]
    builder = LocalBuilder(
        workers=1, per_unit=2, cache_dir=tmp_path, cpus=[free], idle_cpus=[device]
    )
    try:
        assert builder._pool is not None
        busy = [builder._pool.submit(time.sleep, 0.5) for _ in range(2)]  # both workers start
        for f in busy:
            f.result(timeout=60)
        pids = list(builder._pool._processes)
        placement = sorted(
            (os.sched_getscheduler(pid), tuple(os.sched_getaffinity(pid))) for pid in pids
        )
        built = builder.build(WL, [0, 1, 2, 3])
    finally:
        builder.close()
    assert placement == sorted([(os.SCHED_OTHER, (free,)), (os.SCHED_IDLE, (device,))])
    assert all(b.artifact is not None for b in built)


def test_every_core_a_devices_builds_only_at_idle_priority(tmp_path: Path) -> None:
    core = max(os.sched_getaffinity(0))
    builder = LocalBuilder(workers=0, per_unit=2, cache_dir=tmp_path, idle_cpus=[core])
    try:
        built = builder.build(WL, [0, 1])
        assert builder._pool is not None
        policy = builder._pool.submit(os.sched_getscheduler, 0).result(timeout=60)
    finally:
        builder.close()
    assert policy == os.SCHED_IDLE and all(b.artifact is not None for b in built)
    with pytest.raises(ValueError, match="workers and per_unit must be >= 1"):
        LocalBuilder(workers=0)

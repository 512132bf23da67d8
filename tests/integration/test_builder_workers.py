"""Build worker processes: pinned to the cores asked for, using the given compile cache."""

from __future__ import annotations

import os
from pathlib import Path

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

"""Op-library templates through the tuner's build path, measured by a real local pool's agent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tuner.measure import EvaluatorConfig, Status
from tuner.measure.builder import build_one
from tuner.measure.local_pool import LocalPool
from tuner.measure.pool_runner import PoolConfig, PoolRunner
from tuner.records import Workload

FAST = EvaluatorConfig(repeat=2, min_repeat_ms=1.0, timeout_s=20.0)
WORKLOADS = [
    Workload("dense", (24, 40, 36)),
    Workload("conv2d_nchwc", (1, 16, 6, 6, 32, 3, 3, 1, 1, 2)),
    Workload("conv2d_stem_nchwc", (1, 3, 12, 12, 16, 7, 7, 2, 3, 1)),
    Workload("softmax", (4, 50)),
]


@pytest.fixture(scope="module")
def pool() -> Iterator[LocalPool]:
    with LocalPool(key="ops-cpu", agents=1) as p:
        yield p


def test_op_templates_build_and_measure_on_an_agent(pool: LocalPool) -> None:
    built = [build_one(w, 1, "host") for w in WORKLOADS]
    for w, b in zip(WORKLOADS, built, strict=True):
        assert b.artifact is not None, f"{w.op}: {b.error}"
        (entry,) = b.artifact.entries
        assert entry.flop > 0
        roles = [a.role for a in entry.args]
        assert roles[-1] == "output" and roles.count("output") == 1, (w.op, roles)
    runner = PoolRunner(
        PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token), FAST
    )
    try:
        results = runner.run([b.artifact for b in built if b.artifact is not None])
    finally:
        runner.close()
    for w, r in zip(WORKLOADS, results, strict=True):
        assert r.status is Status.OK, f"{w.op}: {r.error}"
        # 2 repeats, or 4 where a noisy first measurement was measured again
        assert len(r.samples_s) in (2, 4) and all(s > 0 for s in r.samples_s)

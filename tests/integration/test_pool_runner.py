"""The tuner's PoolRunner against a real local pool: tracker and agent processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from tuner.builder import build_one
from tuner.local_pool import LocalPool
from tuner.measure import EvaluatorConfig, Status
from tuner.records import Workload
from tuner.runner.pool import PoolConfig, PoolRunner

FAST = EvaluatorConfig(repeat=2, min_repeat_ms=1.0, timeout_s=10.0)


@pytest.fixture(scope="module")
def pool() -> Iterator[LocalPool]:
    with LocalPool(key="it-cpu", agents=1) as p:
        yield p


def test_measures_a_compiled_matmul_and_uploads_it_once(pool: LocalPool) -> None:
    built = build_one(Workload("matmul", (48, 40, 24)), 0, "host")
    assert built.artifact is not None, built.error
    runner = PoolRunner(PoolConfig(tracker=pool.tracker_address, key=pool.key), FAST)
    try:
        first, second = runner.run([built.artifact, built.artifact])
    finally:
        runner.close()
    for r in (first, second):
        assert r.status is Status.OK, r.error
        assert len(r.samples_s) == 2 and all(s > 0 for s in r.samples_s)
        assert r.device_id.endswith("/0")
    cache = pool.workdir / "cache0"
    stored = [p for p in cache.rglob("*") if p.name.startswith(built.artifact.sha256[:16])]
    assert stored, f"artifact not in agent cache {sorted(cache.rglob('*'))}"


def test_unknown_key_gives_no_device_within_the_deadline(pool: LocalPool) -> None:
    built = build_one(Workload("matmul", (8, 8, 8)), 0, "host")
    assert built.artifact is not None
    runner = PoolRunner(
        PoolConfig(tracker=pool.tracker_address, key="no-such-key", acquire_timeout_s=0.5), FAST
    )
    try:
        [result] = runner.run([built.artifact])
    finally:
        runner.close()
    assert result.status is Status.NO_DEVICE
    assert "no-such-key" in result.error


def test_a_killed_agent_yields_results_not_a_hang() -> None:
    built = build_one(Workload("matmul", (16, 16, 16)), 0, "host")
    assert built.artifact is not None
    with LocalPool(key="doomed", agents=1, heartbeat_interval_s=0.3) as p:
        runner = PoolRunner(
            PoolConfig(tracker=p.tracker_address, key=p.key, acquire_timeout_s=2.0), FAST
        )
        try:
            [ok] = runner.run([built.artifact])
            assert ok.status is Status.OK, ok.error
            os.kill(p.procs[1].pid, signal.SIGKILL)
            p.procs[1].wait(10)
            started = time.monotonic()
            results = runner.run([built.artifact, built.artifact])
        finally:
            runner.close()
        assert time.monotonic() - started < 30
        assert results[0].status is Status.DEVICE_LOST
        assert results[1].status in (Status.NO_DEVICE, Status.DEVICE_LOST)

"""Noisy timings are measured again and flagged: a real tracker and agent on 127.0.0.1 time the
test kit's `jitter` kernel (every other call sleeps 2 ms more) beside its steady `add_one`."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit_artifacts import kit_artifact

from compiler.artifact import Artifact
from device_agent.testing import build_kernels
from tuner import records as rec
from tuner.measure import EvaluatorConfig
from tuner.measure.local_pool import LocalPool
from tuner.measure.pool_runner import PoolConfig, PoolRunner

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

# One call per sample, so every other sample of `jitter` carries its 2 ms sleep.
ONE_CALL = EvaluatorConfig(warmup=1, number=1, repeat=5, min_repeat_ms=0.0, timeout_s=30.0)


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Artifact, Artifact]:
    data, _ = build_kernels(str(tmp_path_factory.mktemp("kit")))
    return kit_artifact(data, "jitter"), kit_artifact(data, "add_one")


@pytest.fixture(scope="module")
def pool() -> Iterator[LocalPool]:
    with LocalPool(key="noise-cpu") as p:
        yield p


def runner(pool: LocalPool, remeasure: int) -> PoolRunner:
    config = PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token)
    return PoolRunner(config, ONE_CALL, max_spread=0.10, remeasure=remeasure)


def test_a_noisy_result_is_measured_again_and_flagged(
    pool: LocalPool, kit: tuple[Artifact, Artifact], tmp_path: Path
) -> None:
    jitter, _ = kit
    r = runner(pool, remeasure=2)
    try:
        [result] = r.run([jitter])
    finally:
        r.close()
    assert result.ok and result.noisy
    assert len(result.samples_s) == 3 * ONE_CALL.repeat  # both re-measures pooled
    assert r.remeasured == 2
    assert result.spread > 0.10
    assert max(result.samples_s) > 0.002 > min(result.samples_s)  # slept and did not
    # The flag survives the records, so whoever reads them sees it.
    record = rec.Record(rec.Workload("matmul", (1, 1, 1)), "host", 0, {}, result, 1.0, "t", 1)
    assert rec.Record.from_json(record.to_json()).result.noisy


def test_a_steady_result_is_measured_once_and_not_flagged(
    pool: LocalPool, kit: tuple[Artifact, Artifact]
) -> None:
    _, steady = kit
    r = runner(pool, remeasure=2)
    try:
        results = r.run([steady] * 3)
    finally:
        r.close()
    # add_one over 1024 floats takes about a microsecond: a sample far from the others would be
    # a preemption, rare; at most one of three candidates may have needed a second look.
    assert all(x.ok for x in results)
    assert r.remeasured <= 2  # a runner that measured everything again would have done 6
    assert sum(len(x.samples_s) == ONE_CALL.repeat and not x.noisy for x in results) >= 2


def test_remeasure_zero_flags_without_measuring_again(
    pool: LocalPool, kit: tuple[Artifact, Artifact]
) -> None:
    jitter, _ = kit
    r = runner(pool, remeasure=0)
    try:
        [result] = r.run([jitter])
    finally:
        r.close()
    assert result.noisy and len(result.samples_s) == ONE_CALL.repeat and r.remeasured == 0

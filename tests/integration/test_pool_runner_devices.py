"""PoolRunner over several devices at once: real tracker and agent processes on 127.0.0.1.

Candidates alternate a small and a large matmul, so each result's time tells which candidate it
belongs to: results in input order means every large one is slower than its small neighbour.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from compiler.artifact import Artifact
from device_agent.testing import child_pids, wait_until_idle, wait_until_spinning
from protos import tracker_pb2
from tuner.loop import tune
from tuner.measure import EvaluatorConfig, MeasureResult, Status
from tuner.measure.builder import LocalBuilder, build_one
from tuner.measure.local_pool import LocalPool
from tuner.measure.pool_runner import PoolConfig, PoolRunner
from tuner.measure.tracker_client import TrackerClient
from tuner.options import TuneOptions
from tuner.records import Workload
from tuner.task import Task

# Each measurement lasts at least repeat * min_repeat_ms, so several are in flight at once.
SLOW = EvaluatorConfig(warmup=0, repeat=2, min_repeat_ms=60.0, timeout_s=30.0)
DEADLINE_S = 60.0


def _artifact(n: int) -> Artifact:
    built = build_one(Workload("matmul", (n, n, n)), 0, "host")
    assert built.artifact is not None, built.error
    return built.artifact


@pytest.fixture(scope="module")
def small_large() -> tuple[Artifact, Artifact]:
    return _artifact(8), _artifact(96)  # 1728x the flops


def _alternating(small_large: tuple[Artifact, Artifact], pairs: int) -> list[Artifact]:
    small, large = small_large
    return [a for _ in range(pairs) for a in (small, large)]


def _assert_in_order(results: list[MeasureResult]) -> None:
    for i in range(0, len(results), 2):
        small, large = results[i], results[i + 1]
        assert large.median_s > small.median_s, f"pair {i // 2} out of order: {small} {large}"


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def pool() -> Iterator[LocalPool]:
    """One agent process with two devices, both pinned to one core."""
    core = min(os.sched_getaffinity(0))
    with LocalPool(key="multi-cpu", devices=2, pin_cores=[core]) as p:
        yield p


def test_a_batch_keeps_both_devices_busy_and_returns_results_in_order(
    pool: LocalPool, small_large: tuple[Artifact, Artifact]
) -> None:
    # Asking for more devices than the pool has still works: the extra acquire finds none.
    runner = PoolRunner(
        PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token),
        SLOW,
        devices=3,
    )
    try:
        results = runner.run(_alternating(small_large, 5))
        held = runner.leased_devices
    finally:
        runner.close()
    assert [r.status for r in results] == [Status.OK] * 10, [r.error for r in results]
    core = min(os.sched_getaffinity(0))
    executors = child_pids(pool.procs[1].pid)
    assert len(executors) == 2 and all(os.sched_getaffinity(c) == {core} for c in executors)
    assert {r.device_id.rsplit("/", 1)[1] for r in results} == {"0", "1"}
    assert sorted(d.rsplit("/", 1)[1] for d in held) == ["0", "1"]
    _assert_in_order(results)


def test_no_device_for_every_candidate_when_the_key_has_none(
    pool: LocalPool, small_large: tuple[Artifact, Artifact]
) -> None:
    runner = PoolRunner(
        PoolConfig(
            tracker=pool.tracker_address,
            key="no-such-key",
            token=pool.client_token,
            acquire_timeout_s=0.3,
        ),
        SLOW,
        devices=2,
    )
    try:
        results = runner.run(list(small_large))
    finally:
        runner.close()
    assert [r.status for r in results] == [Status.NO_DEVICE] * 2
    assert all("no-such-key" in r.error for r in results)


def test_pin_cores_must_be_usable() -> None:
    with pytest.raises(ValueError, match="cannot pin"):
        LocalPool(pin_cores=[max(os.sched_getaffinity(0)) + 1000])


@pytest.mark.slow
def test_an_agent_killed_mid_batch_costs_no_candidate(
    small_large: tuple[Artifact, Artifact],
) -> None:
    with LocalPool(key="kill-multi", agents=2, heartbeat_interval_s=0.3) as p:
        tracker = TrackerClient(p.tracker_address, p.client_token)
        runner = PoolRunner(
            PoolConfig(
                tracker=p.tracker_address,
                key=p.key,
                token=p.client_token,
                acquire_timeout_s=10.0,
                lease_ttl_s=20.0,
            ),
            SLOW,
            devices=2,
        )
        victim = p.procs[2]  # procs: tracker, agent0, agent1
        victim_address = p.agent_addresses[1]
        try:
            children = [c for a in p.procs[1:] for c in child_pids(a.pid)]
            assert wait_until_idle(children), "executor children never settled"
            batch = _alternating(small_large, 8)
            results: list[MeasureResult] = []
            worker = threading.Thread(target=lambda: results.extend(runner.run(batch)))
            worker.start()

            def both_leased() -> bool:
                devices = tracker.list_devices(p.key).devices
                return sum(d.state == tracker_pb2.LEASED for d in devices) == 2

            _wait_for(both_leased, "both devices leased")
            [victim_device] = [
                d.spec.device_id
                for d in tracker.list_devices(p.key).devices
                if d.spec.agent_address == victim_address
            ]
            [child] = child_pids(victim.pid)
            assert wait_until_spinning(child, ticks=10), "the victim never measured"
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(DEADLINE_S)
            worker.join(DEADLINE_S)
            assert not worker.is_alive(), "the batch never finished"

            # A device coming back (here a new agent) is leased again by the next batch.
            p.add_agent()
            newcomer = p.agent_addresses[-1]

            def newcomer_free() -> bool:
                devices = tracker.list_devices(p.key).devices
                return any(
                    d.spec.agent_address == newcomer and d.state == tracker_pb2.FREE
                    for d in devices
                )

            _wait_for(newcomer_free, "the new agent's device")
            [new_device] = [
                d.spec.device_id
                for d in tracker.list_devices(p.key).devices
                if d.spec.agent_address == newcomer
            ]
            later = runner.run(_alternating(small_large, 3))
        finally:
            runner.close()
            tracker.close()
    assert len(results) == len(batch)
    assert [r.status for r in results] == [Status.OK] * len(batch), [r.error for r in results]
    _assert_in_order(results)
    # One device was lost, and its candidate in flight was measured again, not dropped.
    assert runner.lost_devices == [victim_device] and runner.retried >= 1, runner.lost_devices
    survivor = {r.device_id for r in results} - set(runner.lost_devices)
    assert len(survivor) == 1
    # The survivor measured its own share and everything left after the loss.
    assert sum(r.device_id in survivor for r in results) > len(batch) // 2
    assert [r.status for r in later] == [Status.OK] * 6, [r.error for r in later]
    assert {r.device_id for r in later} == survivor | {new_device}
    _assert_in_order(later)


def test_the_tuning_loop_measures_units_of_candidates_on_both_devices(pool: LocalPool) -> None:
    """Builder units + two-device runner through tune(): every trial recorded, both devices used."""
    task = Task(Workload("matmul", (16, 16, 16)))
    builder = LocalBuilder(per_unit=4)
    runner = PoolRunner(
        PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token),
        SLOW,
        devices=2,
    )
    try:
        progress = tune(task, builder, runner, TuneOptions(trials=8, batch_size=8, tuner="random"))
    finally:
        runner.close()
        builder.close()
    assert progress.trials == 8
    statuses = [r.result.status for r in progress.history]
    assert statuses == [Status.OK] * 8, [r.result.error for r in progress.history]
    assert {r.result.device_id.rsplit("/", 1)[1] for r in progress.history} == {"0", "1"}

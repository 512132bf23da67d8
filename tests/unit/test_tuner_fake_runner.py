"""The fake runner other tuner tests rely on: times by config, injected failures, no sockets."""

from __future__ import annotations

import hashlib

import pytest

from compiler.artifact import Artifact, Entry
from tuner.measure import Status
from tuner.measure.fake_runner import FakeRunner, config_index_of


def art(index: int, symbol: str | None = None) -> Artifact:
    data = f"so-{index}".encode()
    entry = Entry(symbol or f"kiln_dense_8x8x8_c{index}", "t", (), 1.0)
    return Artifact(data, hashlib.sha256(data).hexdigest(), "shared_object", "x", (entry,))


def test_times_come_from_the_config_index() -> None:
    runner = FakeRunner(config_seconds=lambda i: 1.0 + i)
    results = runner.run([art(3), art(0), art(12)])
    assert [r.median_s for r in results] == [4.0, 1.0, 13.0]
    assert all(r.status is Status.OK and r.device_id == "fake/0" for r in results)
    assert runner.batches == [3] and len(runner.measured) == 3


def test_failures_injected_by_config_and_by_call() -> None:
    runner = FakeRunner(
        config_seconds=float,
        fail_configs={2: Status.CRASH},
        fail_calls={1: Status.DEVICE_LOST},
    )
    first = runner.run([art(1), art(5), art(2)])
    second = runner.run([art(5), art(2)])
    assert [r.status for r in first] == [Status.OK, Status.DEVICE_LOST, Status.CRASH]
    assert [r.status for r in second] == [Status.OK, Status.CRASH]  # call 1 failed only once
    assert second[0].median_s == 5.0
    assert "injected" in first[2].error


def test_a_raising_time_function_fails_its_candidate_only() -> None:
    def seconds(i: int) -> float:
        if i == 4:
            raise RuntimeError("no time for 4")
        return 0.5

    results = FakeRunner(config_seconds=seconds).run([art(4), art(1)])
    assert results[0].status is Status.RUNTIME_ERROR and "no time for 4" in results[0].error
    assert results[1].ok


def test_the_artifact_function_still_works_and_bad_setups_are_refused() -> None:
    assert FakeRunner(lambda a: 2.0).run([art(1, "k")])[0].median_s == 2.0
    with pytest.raises(ValueError, match="needs"):
        FakeRunner()
    with pytest.raises(ValueError, match="OK"):
        FakeRunner(config_seconds=float, fail_calls={0: Status.OK})
    with pytest.raises(ValueError, match="config index"):
        config_index_of(art(1, "kernel"))

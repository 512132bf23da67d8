"""A native backend runs a check's reference once per (reference, seed, inputs) and still compares
every candidate: the real cpu backend on the test kit's kernels (built with gcc)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from device_agent import testing
from device_agent.backends.base import ReferenceOutputs, reference_key
from device_agent.backends.cpu import CpuBackend
from device_agent.domain import EvaluatorConfig, Status
from device_agent.jobs import MEASURE, Job, ReferenceCheck

OUTPUT_BYTES = testing.N * 4  # one float32[N] output
ONE_CALL = EvaluatorConfig(warmup=0, number=1, repeat=1, min_repeat_ms=0.0)  # timing is not tested


class CountingCpu(CpuBackend):
    """The cpu backend, counting calls per (artifact path, symbol)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[tuple[str, str], int] = {}
        self._paths: dict[int, str] = {}

    def load(self, path: str) -> Any:
        lib = super().load(path)
        self._paths[id(lib)] = path
        return lib

    def call(self, module: Any, symbol: str, buffers: list[np.ndarray]) -> int:
        key = (self._paths[id(module)], symbol)
        self.calls[key] = self.calls.get(key, 0) + 1
        return super().call(module, symbol, buffers)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(candidate artifact, reference artifact): the kit's kernels, twice, so that calls of the
    reference are told apart from the candidate's by path."""
    directory = tmp_path_factory.mktemp("kernels")
    testing.build_kernels(str(directory))
    candidate = directory / "candidate.so"
    reference = directory / "reference.so"
    shutil.copy(directory / "kernels.so", candidate)
    shutil.copy(directory / "kernels.so", reference)
    yield str(candidate), str(reference)


def measure(
    backend: CpuBackend, artifacts: tuple[str, str], symbol: str, seed: int, atol: float = 1e-6
) -> Status:
    candidate, reference = artifacts
    check = ReferenceCheck(reference, testing.kernel_entry("add_one"), rtol=0.0, atol=atol)
    job = Job(MEASURE, candidate, testing.kernel_entry(symbol), seed, ONE_CALL, check)
    return backend.execute(job).status


def test_the_reference_runs_once_for_many_checks_on_one_seed(artifacts: tuple[str, str]) -> None:
    backend = CountingCpu()
    candidate, reference = artifacts
    for _ in range(5):
        assert measure(backend, artifacts, "add_one", seed=3) is Status.OK
    assert backend.calls[(reference, "add_one")] == 1
    assert backend.calls[(candidate, "add_one")] == 5  # every candidate is still run and compared
    assert measure(backend, artifacts, "add_one", seed=4) is Status.OK  # other inputs
    assert backend.calls[(reference, "add_one")] == 2


def test_a_wrong_candidate_is_caught_against_a_stored_reference(
    artifacts: tuple[str, str],
) -> None:
    backend = CountingCpu()
    _, reference = artifacts
    assert measure(backend, artifacts, "add_one", seed=1) is Status.OK
    for _ in range(2):
        assert measure(backend, artifacts, "add_two", seed=1) is Status.WRONG_ANSWER
        assert measure(backend, artifacts, "add_one", seed=1) is Status.OK
    assert backend.calls[(reference, "add_one")] == 1
    # A loose enough tolerance passes add_two (off by 1 everywhere): the stored outputs are compared
    # with the check's own tolerance each time.
    assert measure(backend, artifacts, "add_two", seed=1, atol=1.5) is Status.OK


def test_stored_references_are_bounded_and_the_least_recent_goes_first(
    artifacts: tuple[str, str],
) -> None:
    backend = CountingCpu()
    backend.reference_outputs = ReferenceOutputs(max_bytes=2 * OUTPUT_BYTES)
    _, reference = artifacts
    for seed in (1, 2, 1, 3):  # 1 is used again before 3 comes, so 2 is evicted
        assert measure(backend, artifacts, "add_one", seed=seed) is Status.OK
    assert backend.calls[(reference, "add_one")] == 3
    assert len(backend.reference_outputs) == 2
    assert backend.reference_outputs.total_bytes == 2 * OUTPUT_BYTES
    assert measure(backend, artifacts, "add_one", seed=1) is Status.OK  # kept
    assert measure(backend, artifacts, "add_one", seed=2) is Status.OK  # evicted: runs again
    assert backend.calls[(reference, "add_one")] == 4


def test_reference_outputs_store_read_only_copies_within_their_bound(tmp_path: Path) -> None:
    entry = testing.kernel_entry("add_one")
    store = ReferenceOutputs(max_bytes=100)
    a, b = (reference_key(str(tmp_path / "ref"), "add_one", s, entry.args) for s in (1, 2))
    assert a != b and a == reference_key(str(tmp_path / "ref"), "add_one", 1, entry.args)
    out = np.zeros(10, np.float32)
    store.put(a, [out])
    out[0] = 5.0  # the caller's buffer changes; the stored copy does not
    (kept,) = store.get(a) or ()
    assert kept[0] == 0.0 and not kept.flags.writeable
    store.put(b, [np.zeros(20, np.float32)])  # 40 + 80 bytes > 100: a goes
    assert a not in store and b in store and store.total_bytes == 80
    store.put(a, [np.zeros(30, np.float32)])  # larger than the bound: not kept, b stays
    assert a not in store and b in store and store.total_bytes == 80


class TimingSpyCpu(CountingCpu):
    """Also remembers the buffers each call got and what each timing loop was given."""

    def __init__(self) -> None:
        super().__init__()
        self.called: list[list[np.ndarray]] = []
        self.timed: list[tuple[list[np.ndarray], EvaluatorConfig]] = []

    def call(self, module: Any, symbol: str, buffers: list[np.ndarray]) -> int:
        self.called.append(buffers)
        return super().call(module, symbol, buffers)

    def time(self, module: Any, entry: Any, buffers: list[np.ndarray], config: Any) -> Any:
        self.timed.append((buffers, config))
        return super().time(module, entry, buffers, config)


@pytest.mark.parametrize("checked", [True, False])
def test_a_checked_candidate_is_timed_on_its_checked_buffers_its_call_a_warm_up(
    artifacts: tuple[str, str], checked: bool
) -> None:
    """Drawing the inputs again cost sgemm 1024 20 ms a candidate, and the check's call warms
    the kernel as a warm-up call would: the timing loop reuses both."""
    backend = TimingSpyCpu()
    candidate, reference = artifacts
    timing = EvaluatorConfig(warmup=2, number=1, repeat=1, min_repeat_ms=0.0)
    check = ReferenceCheck(reference, testing.kernel_entry("add_one"), rtol=0.0, atol=1e-6)
    job = Job(
        MEASURE, candidate, testing.kernel_entry("add_one"), 3, timing, check if checked else None
    )
    assert backend.execute(job).status is Status.OK
    [(buffers, config)] = backend.timed
    if checked:
        candidate_call = backend.called[-1]  # after the reference's
        assert buffers is candidate_call and config.warmup == 1
    else:
        assert not backend.called and config.warmup == 2

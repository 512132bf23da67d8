"""The builder: several candidates per translation unit, fallback for a bad unit, the compile
cache and async builds. Real gcc (allowed in unit tests), no sockets."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compiler import toolchain
from compiler.codegen.timing import HARNESS_SOURCE
from tuner.measure.builder import LocalBuilder, build_one
from tuner.records import Workload
from tuner.task import Task

WL = Workload("matmul", (16, 16, 16))


class Compiles:
    """Counts real compiler runs through toolchain's seam, but for the timing harness's (once per
    cache); fails those whose source has `poison`."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.sources: list[str] = []
        self.poison: str | None = None

    def __call__(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        source = Path(cmd[-1]).read_text()
        if source == HARNESS_SOURCE:
            return self.real(cmd)  # type: ignore[operator]
        self.sources.append(source)
        if self.poison is not None and self.poison in source:
            return subprocess.CompletedProcess(cmd, 1, "", f"error: {self.poison} rejected")
        return self.real(cmd)  # type: ignore[operator]


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[Compiles]:
    spy = Compiles(toolchain._run)
    monkeypatch.setattr(toolchain, "_run", spy)
    yield spy


def _symbol(i: int) -> str:
    return f"kiln_matmul_16x16x16_c{i}"


def test_units_share_one_shared_object_and_each_candidate_measures_its_own_entry(
    tmp_path: Path, compiles: Compiles
) -> None:
    indices = [5, 0, 3, 7, 2, 9]
    builder = LocalBuilder(per_unit=4, cache_dir=tmp_path)
    try:
        built = builder.build(WL, indices)
    finally:
        builder.close()
    assert [b.config_index for b in built] == indices
    assert all(b.artifact is not None for b in built), [b.error for b in built]
    arts = [b.artifact for b in built if b.artifact is not None]
    assert [a.entries[0].symbol for a in arts] == [_symbol(i) for i in indices]
    assert len(compiles.sources) == 2  # two units, two compiles
    assert len({a.sha256 for a in arts[:4]}) == 1 and arts[4].sha256 == arts[5].sha256
    assert arts[0].sha256 != arts[4].sha256
    assert {e.symbol for e in arts[0].entries} == {_symbol(i) for i in indices[:4]}
    assert all(a.entries[0].flop == Task(WL).flop for a in arts)


def test_a_unit_that_does_not_compile_fails_only_its_bad_config(
    tmp_path: Path, compiles: Compiles
) -> None:
    compiles.poison = _symbol(3) + "("  # the compiler rejects config 3's code
    builder = LocalBuilder(per_unit=4, cache_dir=tmp_path)
    try:
        built = builder.build(WL, [1, 3, 4, 6])
    finally:
        builder.close()
    assert [b.config_index for b in built] == [1, 3, 4, 6]
    assert built[1].artifact is None and "rejected" in built[1].error
    good = [b.artifact for b in (built[0], built[2], built[3])]
    assert all(a is not None and len(a.entries) == 1 for a in good), [b.error for b in built]
    assert len(compiles.sources) == 1 + 4  # the unit, then each alone


def test_a_config_that_does_not_instantiate_fails_alone(tmp_path: Path) -> None:
    size = len(Task(WL).space)
    builder = LocalBuilder(per_unit=3, cache_dir=tmp_path)
    try:
        built = builder.build(WL, [0, size + 5, 1])
    finally:
        builder.close()
    assert built[0].artifact is not None and built[2].artifact is not None
    assert built[1].artifact is None and built[1].error
    assert built[0].artifact.sha256 == built[2].artifact.sha256


def test_the_compile_cache_serves_a_batch_built_again(tmp_path: Path, compiles: Compiles) -> None:
    builder = LocalBuilder(per_unit=2, cache_dir=tmp_path / "cache")
    try:
        first = builder.build(WL, [0, 1, 2])
        compiled = len(compiles.sources)
        again = builder.build(WL, [0, 1, 2])
    finally:
        builder.close()
    assert compiled == 2 and len(compiles.sources) == compiled  # nothing compiled the second time
    assert [b.artifact for b in again] == [b.artifact for b in first]
    assert len(list((tmp_path / "cache").glob("*.so"))) == 2


def test_build_async_gives_what_build_gives(tmp_path: Path) -> None:
    builder = LocalBuilder(per_unit=2, cache_dir=tmp_path)
    try:
        future = builder.build_async(WL, [4, 2, 8])
        built = future.result(timeout=120)
        direct = builder.build(WL, [4, 2, 8])
    finally:
        builder.close()
    assert [b.config_index for b in built] == [4, 2, 8]
    assert [b.artifact for b in built] == [b.artifact for b in direct]


def test_close_abandons_a_build_in_flight_and_ends_its_workers(tmp_path: Path) -> None:
    """An interrupted run closes its builder mid-batch: close returns at once (it used to wait
    for the batch, ~10 s here for 24 Winograd kernels in one unit) and leaves no worker."""
    slow = Workload("conv2d_winograd_nchwc", (1, 256, 14, 14, 256, 3, 3, 1, 1, 1))
    builder = LocalBuilder(workers=2, per_unit=24, cache_dir=tmp_path)
    future = builder.build_async(slow, list(range(24)))
    time.sleep(2.0)  # the unit is in a worker by now
    assert not future.done()
    start = time.monotonic()
    builder.close()
    assert time.monotonic() - start < 5.0
    assert future.done() and future.exception() is not None
    assert multiprocessing.active_children() == []
    assert not list(tmp_path.glob("*.so"))  # nothing was built


def test_bad_builder_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="per_unit"):
        LocalBuilder(per_unit=0)
    with pytest.raises(ValueError, match="cannot build on core"):
        LocalBuilder(cpus=[max(os.sched_getaffinity(0)) + 1000])


def test_build_one_is_a_unit_of_one() -> None:
    built = build_one(WL, 2, "host")
    assert built.artifact is not None
    assert [e.symbol for e in built.artifact.entries] == [_symbol(2)]

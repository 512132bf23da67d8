"""The Dask builder on a real LocalCluster (worker processes on 127.0.0.1, started here): the same
artifacts as the local builder, build errors as results, streaming with a per-build timeout, and
a worker killed mid-batch that costs no candidate. Real gcc, real compiles (fresh caches)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, LocalCluster

from compiler.toolchain import CACHE_ENV, host_target_name
from tuner.measure.build_stream import BuildResult, BuildStream
from tuner.measure.builder import LocalBuilder
from tuner.measure.dask_builder import DaskBuilder, scheduler_address
from tuner.records import Workload

DENSE = Workload("dense", (64, 64, 64))
# About 0.4 s per candidate to lower and compile here: slow enough to catch a build in flight.
WINOGRAD = Workload("conv2d_winograd_nchwc", (1, 64, 14, 14, 64, 3, 3, 1, 1, 1))
OUTSIDE = 10**9  # a config index past every space: a real build error (the space refuses it)
DEADLINE_S = 120.0


def cluster(cache: Path, workers: int = 2) -> LocalCluster:
    """Worker processes (one thread each, as build workers run) with a compile cache of their own."""
    return LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        scheduler_port=0,
        dashboard_address="127.0.0.1:0",  # never the default 8787: another cluster may hold it
        env={CACHE_ENV: str(cache)},
    )


@pytest.fixture(scope="module")
def dask_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cluster(tmp_path_factory.mktemp("dask-cache")) as c:
        yield c.scheduler_address


def by_index(built: list[BuildResult]) -> dict[int, BuildResult]:
    return {b.config_index: b for b in built}


def test_dask_builds_the_artifacts_and_errors_the_local_builder_builds(
    dask_address: str, tmp_path: Path
) -> None:
    indices = [0, 5, 17, OUTSIDE, 42, 99]
    dask = DaskBuilder(dask_address, per_unit=2)
    # "host" is resolved on the client to this machine's class: workers elsewhere build for it
    assert dask.target == host_target_name()
    local = LocalBuilder(target=dask.target, per_unit=2, cache_dir=tmp_path / "local-cache")
    try:
        want = local.build(DENSE, indices, check=True)
        got = dask.build(DENSE, indices, check=True)
    finally:
        local.close()
        dask.close()
    assert [b.config_index for b in got] == indices
    for w, g in zip(want, got, strict=True):
        assert g.error == w.error
        if w.artifact is None:
            continue
        assert g.artifact is not None and g.reference is not None and w.reference is not None
        assert g.artifact.sha256 == w.artifact.sha256  # the same bytes, compiled apart
        assert g.artifact.entries == w.artifact.entries
        assert g.reference.artifact.sha256 == w.reference.artifact.sha256
        assert (g.reference.rtol, g.reference.atol) == (w.reference.rtol, w.reference.atol)
    bad = by_index(got)[OUTSIDE]
    assert bad.artifact is None and bad.error.startswith("IndexError: config index")
    assert by_index(got)[42].artifact is not None  # the bad config's unit-mate built
    assert len(list((tmp_path / "local-cache").glob("*.so"))) > 0  # both sides compiled


def test_results_stream_as_units_finish_and_a_slow_unit_times_out(dask_address: str) -> None:
    dask = DaskBuilder(dask_address, per_unit=2, timeout_s=0.3)
    try:
        stream = dask.submit(WINOGRAD, [0, 1])  # one unit, ~0.8 s of work: past its timeout
        fast = DaskBuilder(dask_address, per_unit=1).submit(DENSE, [3])
        [[dense]] = list(fast.as_completed())
        chunks = list(stream.as_completed())
    finally:
        dask.close()
    assert dense.artifact is not None
    assert [[b.config_index for b in c] for c in chunks] == [[0, 1]]
    for slow in chunks[0]:
        assert slow.artifact is None and "build timed out" in slow.error


def test_a_worker_killed_mid_batch_loses_no_candidate(tmp_path: Path) -> None:
    indices = list(range(12))  # six units of two Winograd candidates: ~0.8 s of work each
    with cluster(tmp_path / "cache") as c, Client(c.scheduler_address, set_as_default=False) as cl:
        dask = DaskBuilder(c.scheduler_address, per_unit=2, timeout_s=None)
        try:
            stream = dask.submit(WINOGRAD, indices)
            keys = {f"{h.key}" for h in stream_handles(stream)}
            victim, key = worker_building(cl, keys)
            pid = cl.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)  # a worker process this test's cluster started
            wait_until(lambda: victim not in cl.scheduler_info()["workers"])
            assert cl.run_on_scheduler(suspicious, key=key) >= 1  # its task was run again
            built = [b for chunk in stream.as_completed() for b in chunk]
        finally:
            dask.close()
    assert sorted(b.config_index for b in built) == indices  # every candidate came back once
    assert all(b.artifact is not None for b in built), [b.error for b in built]


def stream_handles(stream: BuildStream) -> list[Any]:
    """The Dask futures of a stream's units not handed out yet."""
    return [u.handle for u in stream._left]


def worker_building(client: Client, keys: set[str]) -> tuple[str, str]:
    """A worker address and one of `keys` it is running now (waits for one)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        for worker, running in client.processing().items():
            mine = sorted(keys.intersection(map(str, running)))
            if mine:
                return worker, mine[0]
        time.sleep(0.05)
    raise AssertionError("no worker took a build in time")


def wait_until(condition: object) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the scheduler did not notice the worker's death"
        time.sleep(0.05)


def suspicious(dask_scheduler: object, key: str) -> int:
    """On the scheduler: how many workers died while running `key`."""
    return int(dask_scheduler.tasks[key].suspicious)  # type: ignore[attr-defined]


def test_a_bad_address_is_refused() -> None:
    with pytest.raises(ValueError, match="dask://HOST:PORT"):
        scheduler_address("dask://nohost")
    with pytest.raises(ValueError, match="dask://HOST:PORT"):
        scheduler_address("http://h:1")
    assert scheduler_address("dask://10.0.0.2:8786") == "tcp://10.0.0.2:8786"

"""`kiln tune-op --builder dask://HOST:PORT` end to end: a real `kiln` process on an embedded
local pool, its candidates built by the workers of a Dask LocalCluster this test starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import LocalCluster
from kiln_cli import kiln

from compiler.toolchain import CACHE_ENV
from tuner import records as rec

SMALL = ("--min-repeat-ms", "1", "--repeat", "2", "--tuner", "random", "--confirm", "0")


@pytest.fixture(scope="module")
def dask_scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """dask://HOST:PORT of a one-worker cluster (a process with one thread) on 127.0.0.1."""
    cache = tmp_path_factory.mktemp("dask-cache")
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        scheduler_port=0,
        dashboard_address="127.0.0.1:0",
        env={CACHE_ENV: str(cache)},
    ) as cluster:
        yield "dask://" + cluster.scheduler_address.removeprefix("tcp://")


@pytest.mark.slow
def test_tune_op_builds_on_a_dask_cluster(dask_scheduler: str, tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    cmd = ("tune-op", "dense", "--shape", "48,32,64", "--trials", "12", "--batch", "4")
    proc = kiln(*cmd, *SMALL, "--builder", dask_scheduler, "--records", str(path))
    assert proc.returncode == 0, proc.stderr
    assert f"builder: Dask scheduler {dask_scheduler}, 1 worker threads" in proc.stderr
    assert "best of 12 trials" in proc.stdout
    loaded = list(rec.load(path))
    assert len(loaded) == 12 and len({r.config_index for r in loaded}) == 12
    assert sum(r.result.ok for r in loaded) >= 1


def test_a_bad_builder_is_a_usage_error() -> None:
    proc = kiln("tune-op", "dense", "--shape", "8,8,8", "--builder", "dask:/nohost")
    assert proc.returncode == 2
    assert "want local or dask://HOST:PORT" in proc.stderr and "Traceback" not in proc.stderr

"""The records stores' contract, run against a JSON-lines file and a real `redis-server`.

The Redis tests start their own redis-server (tracker.testing.RedisServer) on a free port of
127.0.0.1 and give every test a key prefix of its own.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from compiler.artifact import Artifact, Entry
from tracker.testing import RedisServer, free_port
from tuner import records as rec
from tuner.loop import tune
from tuner.measure import MeasureResult, Status
from tuner.measure.builder import BuildResult
from tuner.measure.fake_runner import FakeRunner
from tuner.measure.runner import Reference
from tuner.options import TuneOptions
from tuner.records import FileRecords, RecordStore, RecordStoreError, open_store
from tuner.records.redis import RedisRecords
from tuner.search import RandomSearch
from tuner.task import Task

WL = rec.Workload("matmul", (64, 64, 64))
OTHER = rec.Workload("matmul", (32, 32, 32))
TARGET = "x86_64-avx512"


def make(
    index: int, seconds: float | None, target: str = TARGET, wl: rec.Workload = WL
) -> rec.Record:
    if seconds is None:
        result = MeasureResult.failed(Status.CRASH, "SIGSEGV", "h/1")
    else:
        result = MeasureResult(Status.OK, (seconds, seconds), device_id="h/0", number_used=2)
    return rec.Record(wl, target, index, {"tile": index}, result, 1e6, rec.now_iso(), 500)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    prefix = f"t-{uuid.uuid4().hex[:10]}:"
    yield redis_server.url(prefix=prefix)
    client = redis_server.client()
    keys = client.keys(prefix + "*")
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(params=["file", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RecordStore]:
    spec = (
        str(tmp_path / "r.jsonl")
        if request.param == "file"
        else request.getfixturevalue("redis_url")
    )
    s = open_store(spec)
    assert isinstance(s, FileRecords if request.param == "file" else RedisRecords)
    yield s
    s.close()


def test_append_load_and_best_by_workload_and_target(store: RecordStore) -> None:
    assert store.load() == [] and store.best(WL, TARGET) is None
    first = [make(1, 3e-3), make(2, None), make(3, 1e-6, target="aarch64-neon")]
    second = [make(4, 2e-3), make(5, 1e-7, wl=OTHER), make(6, 2.5e-3)]
    store.append(first)
    store.append(second)
    store.append([])
    assert store.load(WL, TARGET) == [first[0], first[1], second[0], second[2]]
    assert store.load(target="aarch64-neon") == [first[2]]
    assert store.load(workload=OTHER) == [second[1]]
    assert sorted(r.config_index for r in store.load()) == [1, 2, 3, 4, 5, 6]
    best = store.best(WL, TARGET)
    assert best == second[0]  # the aarch64 and OTHER records are faster but never count
    assert store.best(WL, "riscv64") is None


def test_thread_counts_are_kept_apart_and_no_count_means_one(store: RecordStore) -> None:
    two = rec.records_target(TARGET, 2)
    one_thread, two_threads = make(1, 1e-6), make(2, 3e-3, target=two)
    spelled_out = make(3, 2e-3, target=f"{TARGET}/threads=1")  # stored as the bare name
    store.append([one_thread, two_threads, spelled_out])
    assert store.load(WL, two) == [two_threads]
    assert store.best(WL, two) == two_threads  # the far faster 1-thread record never counts
    assert store.load(WL, f"{TARGET}/threads=1") == [one_thread, spelled_out]
    assert store.best(WL, TARGET) == one_thread
    assert store.load(target=two) == [two_threads]
    assert store.best(WL, rec.records_target(TARGET, 4)) is None


class SymbolBuilder:
    """Artifacts (not shared objects) whose entry symbol ends in the config index, no compiler."""

    target = "fake-target"

    def build(
        self, workload: rec.Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        out = []
        for i in indices:
            data = f"config {i}".encode()
            entry = Entry(symbol=f"k_c{i}", timing_symbol=f"k_c{i}__time", args=(), flop=1.0)
            sha = hashlib.sha256(data).hexdigest()
            out.append(BuildResult(i, Artifact(data, sha, "shared_object", self.target, (entry,))))
        return out

    def close(self) -> None:
        pass


class InterruptedRunner(FakeRunner):
    """Ctrl-C arrives during the third batch."""

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        if len(self.batches) == 2:
            raise KeyboardInterrupt
        return super().run(artifacts)


def test_an_interrupted_run_resumes_from_either_store(store: RecordStore) -> None:
    task = Task(WL)

    def seconds(index: int) -> float:
        return 1.0 / (1 + index)

    with pytest.raises(KeyboardInterrupt):
        tune(
            task,
            SymbolBuilder(),
            InterruptedRunner(config_seconds=seconds),
            TuneOptions(trials=30, batch_size=4, tuner="random", confirm=0),
            records=store,
        )
    kept = {r.config_index for r in store.load(WL, "fake-target")}
    assert len(kept) == 8
    runner = FakeRunner(config_seconds=seconds)
    progress = tune(
        task,
        SymbolBuilder(),
        runner,
        TuneOptions(trials=30, batch_size=4, resume=True, confirm=0),
        searcher=RandomSearch(len(task.space), seed=7),
        records=store,
    )
    assert progress.resumed == 8 and progress.trials == 30 and len(runner.measured) == 22
    every = store.load(WL, "fake-target")
    assert len(every) == len({r.config_index for r in every}) == 30
    best = store.best(WL, "fake-target")
    assert best is not None and best.config_index == max(r.config_index for r in every)


def test_best_stays_exact_under_concurrent_writers(redis_url: str) -> None:
    writers, per_writer = 4, 25
    times = {
        (w, i): 1e-3 * (1 + ((w * 37 + i * 11) % 97))
        for w in range(writers)
        for i in range(per_writer)
    }
    errors: list[BaseException] = []

    def write(w: int) -> None:
        s = RedisRecords(redis_url)
        try:
            for i in range(per_writer):
                s.append([make(w * 1000 + i, times[(w, i)])])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    s = RedisRecords(redis_url)
    loaded = s.load(WL, TARGET)
    assert len(loaded) == writers * per_writer
    best = s.best(WL, TARGET)
    fastest = min(loaded, key=lambda r: r.result.median_s)
    assert best == fastest and best.result.median_s == min(times.values())
    s.close()


def test_prefixes_keep_databases_apart(redis_server: RedisServer, redis_url: str) -> None:
    a = RedisRecords(redis_url)
    b = RedisRecords(redis_url, prefix=f"other-{uuid.uuid4().hex[:8]}:")
    a.append([make(1, 1e-3)])
    assert b.load() == [] and b.best(WL, TARGET) is None
    assert [r.config_index for r in a.load()] == [1]
    client = redis_server.client()
    client.delete(*client.keys(b.prefix + "*") or ["-"])
    client.close()
    a.close()
    b.close()


def test_an_unreadable_entry_is_skipped_with_a_warning_naming_it(
    redis_server: RedisServer, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = RedisRecords(redis_url)
    s.append([make(1, 1e-3)])
    client = redis_server.client()
    [log_key] = [str(k) for k in client.keys(s.prefix + "log:*")]
    client.rpush(log_key, '{"v": 1, "torn')
    client.close()
    s.append([make(2, 2e-3)])
    with caplog.at_level(logging.WARNING, logger="tuner.records"):
        loaded = s.load(WL, TARGET)
    assert [r.config_index for r in loaded] == [1, 2]
    assert f"{log_key}[1]: skipped unreadable record" in "\n".join(caplog.messages)
    s.close()


def test_an_unreachable_database_is_a_clear_error() -> None:
    port = free_port()  # nothing listens there
    s = RedisRecords(f"redis://127.0.0.1:{port}/0")
    with pytest.raises(
        RecordStoreError, match=rf"records database redis://127.0.0.1:{port}/0: append failed"
    ):
        s.append([make(1, 1e-3)])
    with pytest.raises(RecordStoreError, match=r"index failed"):
        s.load()
    s.close()


def test_bad_urls_are_refused_naming_the_problem() -> None:
    with pytest.raises(ValueError, match="names no host"):
        RedisRecords("redis:///0")
    with pytest.raises(ValueError, match="scheme must be"):
        RedisRecords("http://127.0.0.1:6379/0")

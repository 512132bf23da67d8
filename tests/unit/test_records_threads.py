"""Records per thread count: the target carries it, old records mean one thread, and a record of
one thread count is never applied to another (records, stores, device tags, model builds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_network_tune import matmul_net

from compiler.graph.build_model import plan_model
from compiler.graph.model_kernels import default_config
from compiler.ops import op_templates
from compiler.ops.base import PARALLEL_KNOB, parallel_of
from tuner import records as rec
from tuner.loop import builder_records_target, target_name, tune
from tuner.measure import MeasureResult, Status
from tuner.measure.builder import LocalBuilder, build_unit
from tuner.measure.device_target import TargetError, device_records_target, device_threads
from tuner.measure.fake_runner import FakeRunner
from tuner.network.tune import configs_from_records, model_tasks, one_thread_seeds
from tuner.options import TuneOptions
from tuner.records import FileRecords
from tuner.task import Task

WL = rec.Workload("matmul", (64, 64, 64))
AVX512 = {"arch": "x86_64", "features": "avx512f,avx2,fma"}


def make(
    index: int, seconds: float, target: str, wl: rec.Workload = WL, size: int = 0
) -> rec.Record:
    result = MeasureResult(Status.OK, (seconds,), device_id="a/0", number_used=4)
    return rec.Record(wl, target, index, {"i": index}, result, 1.0, rec.now_iso(), size)


def test_the_target_spells_the_thread_count_and_one_thread_is_the_bare_name() -> None:
    assert rec.records_target("x86_64-avx512") == "x86_64-avx512"
    assert rec.records_target("x86_64-avx512", 4) == "x86_64-avx512/threads=4"
    assert rec.split_threads("x86_64-avx512/threads=4") == ("x86_64-avx512", 4)
    assert rec.split_threads("x86_64-avx512") == ("x86_64-avx512", 1)
    assert rec.canonical_target("x86_64-avx512/threads=1") == "x86_64-avx512"
    for bad in ("x/threads=0", "x/threads=two", "x/threads="):
        with pytest.raises(ValueError, match="thread count"):
            rec.split_threads(bad)
    with pytest.raises(ValueError, match="already carries"):
        rec.records_target("x/threads=2", 2)
    with pytest.raises(ValueError, match="at least one thread"):
        rec.records_target("x", 0)


def test_an_old_record_without_a_count_reads_as_one_thread(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    old = make(3, 1e-3, "x86_64-avx512").to_json()  # what every writer wrote before counts
    explicit = {**make(4, 2e-3, "x86_64-avx512").to_json(), "target": "x86_64-avx512/threads=1"}
    bad = {**make(5, 2e-3, "x86_64-avx512").to_json(), "target": "x86_64-avx512/threads=0"}
    path.write_text("".join(json.dumps(o) + "\n" for o in (old, explicit, bad)))
    loaded = list(rec.load(path))  # the malformed count is skipped with a warning
    assert [(r.config_index, r.target, r.threads) for r in loaded] == [
        (3, "x86_64-avx512", 1),
        (4, "x86_64-avx512", 1),
    ]
    store = FileRecords(path)
    assert len(store.load(WL, "x86_64-avx512/threads=1")) == 2
    assert store.load(WL, "x86_64-avx512/threads=2") == []


def test_a_record_of_one_thread_count_never_serves_another(tmp_path: Path) -> None:
    one, two = "x86_64-avx512", "x86_64-avx512/threads=2"
    records = [make(0, 1e-6, one), make(1, 5e-3, two), make(2, 4e-3, two)]
    store = FileRecords(tmp_path / "r.jsonl")
    store.append(records)
    assert [r.config_index for r in store.load(WL, two)] == [1, 2]
    found = store.best(WL, two)
    assert found is not None and found.config_index == 2  # not the far faster 1-thread record
    chosen = rec.apply_best(records, WL, "x86_64-avx512/threads=2")
    assert chosen is not None and chosen.index == 2
    assert rec.apply_best(records[1:], WL, one) is None  # nor 2-thread records a 1-thread build
    assert rec.apply_best(records, WL, "x86_64-avx512/threads=4") is None
    assert rec.Record.from_json(json.loads(rec.dumps(records[1]))).threads == 2


def test_a_device_tag_gives_the_thread_count_of_its_records() -> None:
    assert device_threads(AVX512) == 1  # an agent that does not say runs one thread
    assert device_threads({**AVX512, "threads": "4"}) == 4
    assert device_records_target({**AVX512, "threads": "4"}) == "x86_64-avx512/threads=4"
    assert device_records_target({**AVX512, "threads": "1"}) == "x86_64-avx512"
    assert device_records_target({**AVX512, "threads": "2"}, "x86_64-avx2") == (
        "x86_64-avx2/threads=2"
    )
    for bad in ("0", "-1", "many"):
        with pytest.raises(TargetError, match="threads"):
            device_threads({**AVX512, "threads": bad})


def test_a_build_takes_only_records_of_its_thread_count(tmp_path: Path) -> None:
    graph = matmul_net()
    mt = model_tasks(graph)[0][0]
    mt2 = model_tasks(graph, threads=2)[0][0]  # the same task with the `parallel` knob
    space, space2 = mt.task.space, mt2.task.space
    assert len(space) > 1
    assert len(space2) == 3 * len(space) and space2.knobs[-1].name == "parallel"
    one_thread = 0
    two_threads = space2.index_of({**space.get(1), "parallel": "outer"})
    store = FileRecords(tmp_path / "r.jsonl")
    store.append(
        [
            make(one_thread, 1e-9, "fake-target", mt.task.workload, len(space)),
            make(two_threads, 1e-3, "fake-target/threads=2", mt.task.workload, len(space2)),
        ]
    )

    def chosen(threads: int | None = None, target: str = "fake-target") -> int | None:
        configs = configs_from_records(graph, store, target, threads)
        if mt.spec.key not in configs:
            return None
        config = configs[mt.spec.key]
        return (space2 if parallel_of(config) != "none" else space).index_of(config)

    assert chosen() == one_thread  # a build without a count is a one-thread build
    assert chosen(threads=1) == one_thread
    assert chosen(threads=2) == two_threads
    assert chosen(threads=4) is None  # nothing tuned for 4 threads: the default config
    assert chosen(target="fake-target/threads=2") == two_threads
    with pytest.raises(ValueError, match="carries 2 threads"):
        configs_from_records(graph, store, "fake-target/threads=2", threads=3)


def test_a_two_thread_build_uses_no_one_thread_record_and_parallel_defaults(
    tmp_path: Path,
) -> None:
    graph = matmul_net()
    mt = model_tasks(graph)[0][0]
    tuned = len(mt.task.space) - 1  # a one-thread record of a config no default would pick
    store = FileRecords(tmp_path / "r.jsonl")
    host = target_name("host")
    store.append([make(tuned, 1e-9, host, mt.task.workload, len(mt.task.space))])
    assert mt.task.space.index_of(configs_from_records(graph, store, "host")[mt.spec.key]) == tuned
    two = configs_from_records(graph, store, "host", threads=2)
    assert two == {}  # nothing tuned for two threads: every kernel takes its default
    anchors = [s for s in plan_model(graph, two, "host", threads=2).steps if s.role == "anchor"]
    assert anchors and all(s.config is not None for s in anchors)
    assert all(dict(s.config) != dict(mt.task.space.get(tuned)) for s in anchors if s.config)
    assert all(s.config is not None and PARALLEL_KNOB in s.config for s in anchors)
    # the default on several threads runs the outer loop in parallel, unless the kernel is tiny
    dense = op_templates()["dense"]
    assert default_config(dense, (256, 256, 256), "host", {}, threads=2)[PARALLEL_KNOB] == "outer"
    assert default_config(dense, (8, 16, 8), "host", {}, threads=2)[PARALLEL_KNOB] == "none"
    assert PARALLEL_KNOB not in default_config(dense, (256, 256, 256), "host", {})


def test_a_builder_for_two_threads_builds_the_parallel_space_and_names_its_records() -> None:
    wl = rec.Workload("dense", (37, 50, 64))
    task = Task(wl, threads=2)
    index = next(
        i
        for i in range(len(task.space))
        if task.space.get(i)[PARALLEL_KNOB] == "fused" and task.worth_measuring(i)
    )
    (built,) = build_unit(wl, [index], "host", threads=2)
    assert built.artifact is not None, built.error
    assert built.artifact.entries[0].symbol.endswith(f"_t2_c{index}")
    builder = LocalBuilder(threads=2)
    try:
        assert builder_records_target(builder) == f"{target_name('host')}/threads=2"
        with pytest.raises(ValueError, match="task is for 1 thread"):
            tune(Task(wl), builder, FakeRunner(lambda art: 1e-3), TuneOptions(trials=1))
    finally:
        builder.close()
    assert builder_records_target(LocalBuilder()) == target_name("host")


def test_two_thread_tuning_first_measures_the_best_one_thread_config_in_parallel(
    tmp_path: Path,
) -> None:
    graph = matmul_net()
    mt1, mt2 = model_tasks(graph)[0][0], model_tasks(graph, threads=2)[0][0]
    host = target_name("host")
    store = FileRecords(tmp_path / "r.jsonl")
    size = len(mt1.task.space)
    store.append(
        [make(3, 2e-3, host, mt1.task.workload, size), make(5, 1e-3, host, mt1.task.workload, size)]
    )
    seeds = one_thread_seeds(mt2, store, rec.records_target(host, 2))
    knobs = dict(mt1.task.space.get(5))
    assert seeds == [
        mt2.task.space.index_of({**knobs, PARALLEL_KNOB: c}) for c in ("outer", "fused")
    ]
    assert one_thread_seeds(mt1, store, host) == []  # one thread: nothing to carry over
    assert one_thread_seeds(mt2, None, rec.records_target(host, 2)) == []

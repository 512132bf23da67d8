"""Records per thread count: the target carries it, old records mean one thread, and a record of
one thread count is never applied to another (records, stores, device tags, model builds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.frontend.onnx import from_onnx
from compiler.graph.ir import Graph
from tuner import records as rec
from tuner.measure import MeasureResult, Status
from tuner.measure.device_target import TargetError, device_records_target, device_threads
from tuner.network.tune import configs_from_records, model_tasks
from tuner.records import FileRecords

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


def matmul_net() -> Graph:
    """x @ W1 -> Relu -> @ W2: two matmul tasks."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, 64)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((64, 16)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 32))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_build_takes_only_records_of_its_thread_count(tmp_path: Path) -> None:
    graph = matmul_net()
    tunable, _ = model_tasks(graph)
    mt = tunable[0]
    size = len(mt.task.space)
    assert size > 1
    one_thread, two_threads = 0, 1
    store = FileRecords(tmp_path / "r.jsonl")
    store.append(
        [
            make(one_thread, 1e-9, "fake-target", mt.task.workload, size),
            make(two_threads, 1e-3, "fake-target/threads=2", mt.task.workload, size),
        ]
    )
    space = mt.task.space

    def chosen(threads: int | None = None) -> int | None:
        configs = configs_from_records(graph, store, "fake-target", threads)
        return space.index_of(configs[mt.spec.key]) if mt.spec.key in configs else None

    assert chosen() == one_thread  # a build without a count is a one-thread build
    assert chosen(threads=1) == one_thread
    assert chosen(threads=2) == two_threads
    assert chosen(threads=4) is None  # nothing tuned for 4 threads: the default config
    by_target = configs_from_records(graph, store, "fake-target/threads=2")
    assert space.index_of(by_target[mt.spec.key]) == two_threads
    with pytest.raises(ValueError, match="carries 2 threads"):
        configs_from_records(graph, store, "fake-target/threads=2", threads=3)

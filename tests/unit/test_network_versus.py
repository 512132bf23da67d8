"""One timing path for the demo and the benchmark: `versus_onnxruntime` checks every build
against onnxruntime before timing, runs on one core and gives the core back; `kiln demo` and
`benchmarks/models.py` both time through it, at the same rounds. No figure is asserted."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import benchmarks.models as bench
import kiln.cli.demo as demo
from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model import ModelArtifact, build_model
from tuner.network import timing
from tuner.network.timing import OutputMismatch, versus_onnxruntime


def mlp(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def built() -> tuple[onnx.ModelProto, ModelArtifact, ModelArtifact]:
    """The model, its build, and a build of the same model with other weights (wrong for it)."""
    proto = mlp(0)
    return proto, build_model(from_onnx(proto)), build_model(from_onnx(mlp(1)))


FEEDS = {"x": np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)}


def test_builds_are_timed_against_onnxruntime_on_one_core_which_is_given_back(
    built: tuple[onnx.ModelProto, ModelArtifact, ModelArtifact], monkeypatch: pytest.MonkeyPatch
) -> None:
    proto, good, _ = built
    before = os.sched_getaffinity(0)
    seen: list[set[int]] = []
    real_loop = timing.loop_seconds

    def spy(call: Any, min_round_s: float) -> float:
        seen.append(os.sched_getaffinity(0))
        return real_loop(call, min_round_s)

    monkeypatch.setattr(timing, "loop_seconds", spy)
    result = versus_onnxruntime(proto, FEEDS, {"a": good, "b": good}, 3, 0.0, 1e-4)
    assert os.sched_getaffinity(0) == before
    assert seen and all(s == {max(before)} for s in seen) and result.core == max(before)
    assert len(result.ours["a"]) == len(result.ours["b"]) == len(result.ort) == 3
    assert result.ratio("a") > 0 and set(result.natives) == {"a", "b"}
    assert len(seen) == 9  # every round timed both builds and onnxruntime


def test_a_wrong_build_is_refused_before_anything_is_timed(
    built: tuple[onnx.ModelProto, ModelArtifact, ModelArtifact],
) -> None:
    proto, good, wrong = built
    with pytest.raises(OutputMismatch, match="the wrong build's outputs differ from onnxruntime"):
        versus_onnxruntime(proto, FEEDS, {"good": good, "wrong": wrong}, 3, 0.0, 1e-4)


def test_the_demo_and_the_benchmark_time_through_the_same_path_at_the_same_rounds(
    built: tuple[onnx.ModelProto, ModelArtifact, ModelArtifact], monkeypatch: pytest.MonkeyPatch
) -> None:
    proto, good, _ = built
    assert bench.versus_onnxruntime is timing.versus_onnxruntime
    calls: list[tuple[int, float, float]] = []
    real = timing.versus_onnxruntime

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append((args[3], args[4], args[5]))
        return real(proto, FEEDS, {"tuned": good}, 1, 0.0, args[5])

    monkeypatch.setattr(timing, "versus_onnxruntime", spy)
    demo.time_builds(proto, FEEDS, {"tuned": good})
    parser_defaults = bench_defaults(monkeypatch)
    assert calls == [(parser_defaults["rounds"], parser_defaults["min_round_s"], bench.RTOL)]


def bench_defaults(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """benchmarks/models.py's defaults for --rounds and --min-round-s."""
    seen: dict[str, Any] = {}

    def stop(name: str, args: Any, store: Any, from_records: Any) -> Any:
        seen.update(rounds=args.rounds, min_round_s=args.min_round_s)
        raise SystemExit(0)

    monkeypatch.setattr(bench, "measure_model", stop)
    with pytest.raises(SystemExit):
        bench.main(["--models", "bert_tiny"])
    return seen

"""One timing path for the demo and the benchmark: `versus_onnxruntime` checks every build
against onnxruntime before timing, runs on one core and gives the core back; `kiln demo` and
`benchmarks/models.py` both time through it, at the same rounds. No figure is asserted."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import benchmarks.models as bench
import kiln.cli.demo as demo
from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model import MODEL_ENTRY, ModelArtifact, build_model
from tuner.measure.result import EvaluatorConfig
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


def test_a_device_timer_takes_its_turn_in_every_round_and_a_failed_round_is_left_out(
    built: tuple[onnx.ModelProto, ModelArtifact, ModelArtifact], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's agent figure is timed in the same rounds as this process's (in the order of
    the others, reversed every other round), not in a block before them."""
    proto, good, _ = built
    events: list[str] = []
    real_loop = timing.loop_seconds

    def spy(call: Any, min_round_s: float) -> float:
        events.append("loop")
        return real_loop(call, min_round_s)

    answers = iter([2e-3, float("nan"), 4e-3])

    def device() -> float:
        events.append("device")
        return next(answers)

    monkeypatch.setattr(timing, "loop_seconds", spy)
    result = versus_onnxruntime(proto, FEEDS, {"a": good}, 3, 0.0, 1e-4, timers=[("agent", device)])
    round_ = ["loop", "loop", "device"]
    assert events == round_ + round_[::-1] + round_
    assert set(result.ours) == {"a"} and len(result.ort) == 3
    assert result.timed["agent"][0] == 2e-3 and result.timed["agent"][2] == 4e-3
    assert result.timed_s("agent") == pytest.approx(3e-3)  # the NaN round left out
    assert result.timed_s("missing") is None


def test_a_timer_named_like_a_build_is_refused_before_any_timing() -> None:
    ran: list[str] = []
    with pytest.raises(ValueError, match="labels must be unique"):
        timing.interleaved_rounds(
            [("tuned", lambda: ran.append("call"))], 3, 0.0, [("tuned", lambda: 1.0)]
        )
    assert ran == []


def test_the_demo_device_timer_times_as_this_process_does_and_a_failed_round_is_nan() -> None:
    """The agent's round is a loop of back-to-back calls over the demo's round length, without
    the cold sweep tuning uses (`loop_seconds`' method): the two figures are one method."""

    class Latency:
        def __init__(self, ok: bool) -> None:
            self.ok, self.median_s = ok, 5e-3

    class Runner:
        evaluator = EvaluatorConfig(repeat=10, min_repeat_ms=0.0, flush_cache_bytes=64 << 20)

        def __init__(self) -> None:
            self.oks = iter([True, False])
            self.asked: list[tuple[str, EvaluatorConfig]] = []

        def measure_entry(self, art: Any, symbol: str, evaluator: EvaluatorConfig) -> Latency:
            self.asked.append((symbol, evaluator))
            return Latency(next(self.oks))

    runner = Runner()
    model = build_model(from_onnx(mlp(0)))
    timer = demo.device_timer(runner, model, min_round_s=0.2)  # type: ignore[arg-type]
    assert timer() == 5e-3
    assert np.isnan(timer())
    assert [symbol for symbol, _ in runner.asked] == [MODEL_ENTRY, MODEL_ENTRY]
    ev = runner.asked[0][1]
    assert (ev.warmup, ev.repeat, ev.min_repeat_ms, ev.flush_cache_bytes) == (1, 1, 200.0, 0)
    assert ev.cooldown_ms == 0 and ev.timeout_s == Runner.evaluator.timeout_s


def test_the_agents_row_has_a_ratio_only_at_onnxruntimes_one_thread() -> None:
    one = demo.agent_row("dev/0", 0.020, 0.030, threads=1)
    assert one == ["kiln, tuned, timed by the agent (dev/0)", "20.00", "1.50x"]
    two = demo.agent_row("dev/0", 0.019, 0.030, threads=2)
    assert "on 2 threads" in two[0] and two[1] == "19.00" and not two[2].endswith("x")


def _mapping_of(address: int) -> str:
    """The pathname of this process's mapping holding `address` ("" for an anonymous one)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"{address:#x} is in no mapping")


def test_in_process_runs_read_the_weights_embedded_where_the_agent_does(
    built: tuple[onnx.ModelProto, ModelArtifact, ModelArtifact],
) -> None:
    """The in-process model reads its params from the blob in the shared object (the packed
    entry's, what an agent runs), not from numpy copies: on the Xeon the blob was mapped with
    2 MB pages, the copies mostly in 4 KB ones, and the same build ran 7-11% faster on it."""
    _, good, _ = built
    native = timing.NativeModel(good, FEEDS)
    assert len(native.param_addresses) == len(good.params) >= 1
    for address, param in zip(native.param_addresses, good.params, strict=True):
        assert ".so" in _mapping_of(address)  # the loaded library, not the heap
        assert ctypes.string_at(address, param.nbytes) == np.ascontiguousarray(param).tobytes()
    want = np.maximum(FEEDS["x"] @ numpy_helper.to_array(mlp(0).graph.initializer[0]), 0)
    np.testing.assert_allclose(native.run()[0], want, rtol=1e-5, atol=1e-5)

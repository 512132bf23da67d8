"""`kiln tune MODEL.onnx` on a local pool (then again with --resume), then `kiln build` from its
records; the artifact is run and checked against onnxruntime.

Real `kiln` processes (real tracker and agent, real gcc) on a tiny ONNX model: two 3x3 convs with
32 channels on a 16x16 image, the first with bias and ReLU.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kiln_cli import kiln
from onnx import TensorProto, helper, numpy_helper

from compiler.graph.build_model import ModelArtifact
from kiln.cli.common import COLD_REPEAT
from tuner import records as rec

SMALL = ("--min-repeat-ms", "1", "--repeat", "2", "--build-workers", "1")
UNIT_TESTS = Path(__file__).resolve().parents[1] / "unit"


def tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def param(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["y"], kernel_shape=[3, 3], pads=[1] * 4),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ("batch", 3, 16, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [param("w1", (32, 3, 3, 3)), param("b1", (32,)), param("w2", (32, 32, 3, 3))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run_artifact(path: Path, x: np.ndarray) -> np.ndarray:
    spec = importlib.util.spec_from_file_location("model_runtime", UNIT_TESTS / "model_runtime.py")
    assert spec is not None and spec.loader is not None
    runtime = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runtime)
    return np.asarray(runtime.ModelRunner(ModelArtifact.load(path)).run({"x": x})[0])


@pytest.mark.slow
def test_tune_a_model_then_build_it_from_the_records(tmp_path: Path) -> None:
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), model)
    records = tmp_path / "r.jsonl"
    shape = ("--input-shape", "x=1,3,16,16")
    out = kiln(
        "tune", str(model), *shape, "--trials", "8", "--batch", "4",
        "--records", str(records), *SMALL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    every = list(rec.load(records))
    loaded = [r for r in every if not r.confirmation]
    assert len(loaded) == 8
    # each task's fastest configs (up to 4) measured twice more at the end: --confirm 4
    assert 0 < len(every) - 8 <= 2 * 2 * 4 and all(r.confirmation for r in every[8:])
    assert {r.workload.op for r in loaded} == {"conv2d_stem_nchwc", "conv2d_winograd_nchwc"}
    assert sum(r.result.ok for r in loaded) > 0
    for op in ("conv2d_stem_nchwc", "conv2d_winograd_nchwc"):  # one row per task in the final table
        assert f"| {op}(" in out.stdout, out.stdout
    assert "estimated latency:" in out.stdout and "after 8 trials" in out.stdout

    # `--caches cold` and no measurement flags: each candidate is one call after a sweep that
    # evicts the caches, COLD_REPEAT times (auto would time this tiny model warm)
    again = kiln(
        "tune", str(model), *shape, "--trials", "16", "--batch", "4", "--resume",
        "--records", str(records), "--build-workers", "1", "--caches", "cold",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "resumed)" in again.stdout
    again_every = [r for r in rec.load(records) if not r.confirmation]
    assert again_every[:8] == loaded and len(again_every) == 16
    cold = [r.result for r in again_every[8:] if r.result.ok]
    # (a noisy result is measured once more, its samples added: a multiple of COLD_REPEAT)
    assert cold and all(r.number_used == 1 and len(r.samples_s) % COLD_REPEAT == 0 for r in cold)
    assert all(r.result.number_used > 1 for r in loaded if r.result.ok)  # warm: calls grown
    # none measured twice as a trial
    assert len({(r.workload, r.config_index) for r in again_every}) == len(again_every)

    artifact = tmp_path / "tiny.kiln"
    built = kiln("build", str(model), *shape, "--records", str(records), "-o", str(artifact))
    assert built.returncode == 0, built.stderr
    assert "2 of 2 tunable tasks tuned" in built.stdout
    for name in ("model.so", "params.npz", "model.json"):
        assert (artifact / name).is_file()
    meta = json.loads((artifact / "model.json").read_text())
    assert {t["template"] for t in meta["tasks"]} == {"conv2d_stem_nchwc", "conv2d_winograd_nchwc"}

    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(model.read_bytes()).run(None, {"x": x})[0]
    got = run_artifact(artifact, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_bad_input_is_named() -> None:
    missing = kiln("build", "/nonexistent/m.onnx", "--records", "/nonexistent/r.jsonl", "-o", "x")
    assert missing.returncode == 2 and "no such file" in missing.stderr
    assert "Traceback" not in missing.stderr

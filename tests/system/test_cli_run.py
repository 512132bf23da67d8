"""`kiln build` a tiny model, then `kiln run` it on a local pool (real tracker, agent and gcc).

The model (two 3x3 convs with ReLU, a 2x2 max pool, a dense head; a 16x16 image) runs on the
agent through the packed `kiln_model` entry with its params embedded in the shared object;
`--check` compares with onnxruntime and the saved output is compared here too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kiln_cli
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper


def kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return kiln_cli.kiln(*args, timeout=120)


def tiny_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def param(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    conv: dict[str, Any] = {"kernel_shape": [3, 3], "pads": [1] * 4}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], **conv),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], **conv),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wd", "bd"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_run",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 16, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            param("w1", (8, 3, 3, 3)),
            param("b1", (8,)),
            param("w2", (8, 8, 3, 3)),
            param("wd", (8 * 8 * 8, 10)),
            param("bd", (10,)),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("run")
    model = tmp / "tiny.onnx"
    onnx.save(tiny_model(), model)
    records = tmp / "empty.jsonl"
    records.write_text("")
    artifact = tmp / "tiny.kiln"
    out = kiln("build", str(model), "--records", str(records), "-o", str(artifact))
    assert out.returncode == 0, out.stderr
    return model, artifact


def test_run_on_a_local_pool_checks_and_times(built: tuple[Path, Path], tmp_path: Path) -> None:
    model, artifact = built
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    y = tmp_path / "y.npy"
    out = kiln(
        "run", str(artifact), "--input", f"x={tmp_path / 'x.npy'}", "--check", str(model),
        "--repeat", "3", "--output", str(y), "--in-process",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "latency:" in out.stdout and "median of 3" in out.stdout, out.stdout
    assert "spread" in out.stdout and "interquartile range / median" in out.stdout
    assert "in process:" in out.stdout and "device / in process = " in out.stdout
    assert "1 output(s) match onnxruntime" in out.stdout
    want = ort.InferenceSession(model.read_bytes()).run(None, {"x": x})[0]
    got = np.load(y)
    assert got.shape == want.shape == (1, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_outputs_that_differ_from_onnxruntime_fail_naming_the_error(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    """--check against a model of other weights: the build is right, the comparison must fail."""
    _, artifact = built
    other = tmp_path / "other.onnx"
    onnx.save(tiny_model(seed=1), other)
    np.save(tmp_path / "x.npy", np.ones((1, 3, 16, 16), np.float32))
    out = kiln("run", str(artifact), "--input", str(tmp_path / "x.npy"), "--check", str(other))
    assert out.returncode == 1, out.stdout
    assert "the outputs differ from onnxruntime's: output 0 max error" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_bad_input_shape_is_named(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, artifact = built
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    out = kiln("run", str(artifact), "--input", str(tmp_path / "x.npy"))
    assert out.returncode in (1, 2)
    assert "input 'x' must have shape [1, 3, 16, 16], got [1, 3, 8, 8]" in out.stderr
    assert "Traceback" not in out.stderr

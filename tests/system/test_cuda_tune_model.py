"""`kiln tune MODEL.onnx --key gpu` tunes a whole model on a GPU agent as on a CPU one: its tasks
are the GPU model build's template tasks (cuda_dense, cuda_softmax, ...), handed out by the task
scheduler, built with nvcc and measured on the agent, recorded under "cuda/sm=90"; then the GPU
model is built from the records and run and timed on the agent.

No GPU here: the agent runs `--backend cuda` on its fake driver (KILN_CUDA_DRIVER=fake), which
computes nothing and times every launch alike (results labelled emulated). So tuning runs with
`--no-check`, and the final run says its outputs were not compared with onnxruntime.

Real `python -m tracker`, `python -m device_agent` and `python -m kiln` processes on 127.0.0.1
(port 0), secured with a pool secrets file; the servers ended by pid.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from kiln_cli import kiln
from onnx import TensorProto, helper, numpy_helper
from test_cuda_tune_op import gpu_pool

from compiler.toolchain import CACHE_ENV, find_nvcc
from protos.auth import write_secrets
from tuner import records as rec
from tuner.measure import Status

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc")

TRIALS = 4


def dense_softmax() -> onnx.ModelProto:
    """Gemm + bias + ReLU, then softmax: two GPU template tasks."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["d"], transB=1),
        helper.make_node("Relu", ["d"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "dense_softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 8))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 16))],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_kiln_tune_on_a_gpu_key_tunes_builds_and_runs_the_gpu_model(tmp_path: Path) -> None:
    secrets = tmp_path / "pool.secrets"
    write_secrets(secrets)
    model = tmp_path / "m.onnx"
    onnx.save(dense_softmax(), str(model))
    records = tmp_path / "r.jsonl"
    env = {**os.environ, CACHE_ENV: str(tmp_path / "build-cache")}
    with gpu_pool(tmp_path, secrets) as address:
        out = kiln(
            "tune", str(model), "--tracker", address, "--key", "gpu",
            "--token-file", str(secrets), "--trials", str(TRIALS), "--batch", "2",
            "--confirm", "0", "--no-check", "--records", str(records),
            env=env, timeout=240,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "cuda_dense(4,16,8,2)" in out.stdout and "cuda_softmax(4,16)" in out.stdout
    assert f"after {TRIALS} trials on cuda/sm=90 (emulated" in out.stdout
    assert "2 of 2 template tasks tuned" in out.stdout, out.stdout
    assert "tuned model on" in out.stdout and "emulated by cuda-fake" in out.stdout
    assert "check: off" in out.stdout

    every = list(rec.load(records))
    assert len(every) == TRIALS
    assert all(r.target == "cuda/sm=90" and r.status == Status.OK for r in every)
    assert {r.workload.op for r in every} == {"cuda_dense", "cuda_softmax"}

"""`kiln build --target cuda/sm=90` writes a GPU model (one CUDA container with the `kiln_model`
entry), and `kiln run` sends it to a `cuda` device: a real tracker and a `--backend cuda` agent
process on the fake driver (`KILN_CUDA_DRIVER=fake`), which loads the cubin, allocates the
program's workspace, writes its constants, enqueues every launch and times the sequence, but
computes nothing (so the outputs are not checked here; `test_cuda_model` checks them in the
interpreter). Skipped without nvcc.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_cuda_model import small_cnn

from compiler.graph.build_model_cuda import (
    MODEL_ENTRY,
    CudaModelArtifact,
    interpret_model,
    is_cuda_model,
)
from compiler.toolchain import CACHE_ENV, find_nvcc
from device_agent.testing import wait_for_ready_file
from kiln.api import load_model
from protos.cuda_program import decode_module

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")

PROJECT_ROOT = Path(__file__).resolve().parents[2]
KEY = "fake-gpu"
START_S = 30.0


def spawn(
    args: list[str], ready: Path, log: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args, "--ready-file", str(ready)],
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return proc, wait_for_ready_file(proc, str(ready), START_S)


@pytest.fixture
def gpu_tracker(tmp_path: Path) -> Iterator[str]:
    """A tracker and one fake-GPU `--backend cuda` agent; yields the tracker's address."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        tracker_proc, tracker = spawn(
            ["-m", "tracker", "--listen", "127.0.0.1:0"],
            tmp_path / "tracker.ready",
            tmp_path / "tracker.log",
        )
        procs.append(tracker_proc)
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env.update(KILN_CUDA_DRIVER="fake", KILN_CUDA_FAKE_GPUS="1")
        agent_args = ["-m", "device_agent", "--backend", "cuda", "--devices", "all"]
        agent_args += ["--tracker", tracker, "--key", KEY, "--cache-dir", str(tmp_path / "cache")]
        agent, _ = spawn(agent_args, tmp_path / "agent.ready", tmp_path / "agent.log", env)
        procs.append(agent)
        yield tracker
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10.0)


def kiln(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, CACHE_ENV: str(tmp_path / "build-cache")}
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=PROJECT_ROOT,
    )


def test_kiln_build_for_a_gpu_and_run_it_on_a_cuda_device(tmp_path: Path, gpu_tracker: str) -> None:
    import onnx

    onnx_path = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(), str(onnx_path))
    records = tmp_path / "records.jsonl"
    records.write_text("")
    out_dir = tmp_path / "cnn.kiln"
    built = kiln(
        tmp_path, "build", str(onnx_path), "--records", str(records),
        "--target", "cuda/sm=90", "-o", str(out_dir),
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "10 launches" in built.stdout and "0 of 9 GPU template tasks tuned" in built.stdout
    assert "untuned" in built.stdout and "  cuda_softmax 1,5 (x1)" in built.stdout
    assert is_cuda_model(out_dir) and (out_dir / "model.kcud").is_file()
    model = load_model(out_dir)
    assert isinstance(model, CudaModelArtifact) and model.artifact.target == "cuda/sm=90"
    program = decode_module(model.artifact.data).programs[MODEL_ENTRY]
    assert len(program.launches) == model.launches == 10
    with pytest.raises(ValueError, match="interpret a model built here"):
        interpret_model(model, [np.zeros((1, 3, 9, 9), np.float32)])

    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((1, 3, 9, 9)).astype(np.float32))
    y = tmp_path / "y.npy"
    ran = kiln(
        tmp_path, "run", str(out_dir), "--tracker", gpu_tracker, "--key", KEY,
        "--input", str(x), "--output", str(y), "--repeat", "3",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "(cuda/sm=90, as built)" in ran.stdout, ran.stdout
    assert np.load(y).shape == (1, 5)


def test_a_cpu_only_flag_is_refused_for_a_gpu_model(tmp_path: Path) -> None:
    onnx_path = tmp_path / "cnn.onnx"
    import onnx

    onnx.save(small_cnn(), str(onnx_path))
    records = tmp_path / "records.jsonl"
    records.write_text("")
    threads = kiln(
        tmp_path, "build", str(onnx_path), "--records", str(records),
        "--target", "cuda/sm=90", "--threads", "4", "-o", str(tmp_path / "m"),
    )  # fmt: skip
    assert threads.returncode != 0 and "a GPU build" in threads.stderr


def test_a_gpu_build_takes_the_best_record_of_a_template_task(tmp_path: Path) -> None:
    from compiler import ops
    from compiler.frontend.onnx import from_onnx
    from kiln import api
    from tuner import records as rec
    from tuner.measure import MeasureResult, Status

    graph = from_onnx(small_cnn())
    default = api.build_gpu(graph)
    (dense,) = [t for t in default.tasks if t.template == "cuda_dense"]
    space = ops.get_template("cuda_dense").config_space(dense.workload)
    assert len(space) > 2
    workload = rec.Workload("cuda_dense", dense.workload)

    def record(index: int, seconds: float, target: str = "cuda/sm=90") -> rec.Record:
        result = MeasureResult(Status.OK, (seconds,), device_id="gpu/0")
        knobs = dict(space.get(index))
        return rec.Record(workload, target, index, knobs, result, 1e6, "t", len(space))

    path = tmp_path / "records.jsonl"
    store = rec.open_store(path)
    try:
        # the fastest on this sm wins; a faster one of another sm never applies
        store.append([record(1, 2e-6), record(len(space) - 1, 1e-6), record(2, 1e-9, "cuda/sm=80")])
        configs = api.gpu_model_configs(graph, store, "cuda/sm=90")
    finally:
        store.close()
    assert configs == {dense.key: space.get(len(space) - 1)}
    tuned = api.build_gpu(graph, path)
    with pytest.raises(ValueError, match="build_gpu"):
        api.build(graph, path, target="cuda/sm=90")
    assert tuned.artifact.sha256 != default.artifact.sha256
    x = np.random.default_rng(1).standard_normal((1, 3, 9, 9)).astype(np.float32)
    np.testing.assert_allclose(
        interpret_model(tuned, [x])[0], interpret_model(default, [x])[0], rtol=1e-5, atol=1e-6
    )

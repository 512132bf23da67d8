"""A model built for several threads: the same outputs on 1, 2 and 3 OpenMP threads, and one
persistent pool of OpenMP threads across calls (no thread started per call)."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model import build_model
from compiler.graph.ir import Graph
from tuner.network.timing import NativeModel

pytestmark = pytest.mark.usefixtures("build_cache")


def mlp(rows: int = 67, width: int = 200) -> Graph:
    """x[rows, 96] @ w1 -> ReLU -> @ w2: dense kernels big enough for parallel defaults."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((96, width)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((width, 72)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (rows, 96))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return from_onnx(model)


def _gomp() -> ctypes.CDLL:
    gomp = ctypes.CDLL("libgomp.so.1")
    gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
    gomp.omp_get_max_threads.restype = ctypes.c_int
    return gomp


def _threads_of_this_process() -> int:
    return len(os.listdir("/proc/self/task"))


def test_a_parallel_model_matches_numpy_on_any_thread_count_and_keeps_one_pool() -> None:
    graph = mlp()
    x = np.random.default_rng(0).standard_normal((67, 96)).astype(np.float32)
    w1, w2 = (graph.constants[n] for n in ("w1", "w2"))
    expected = np.maximum(x @ w1, 0) @ w2
    model = build_model(graph, None, "host", threads=2)
    assert b"GOMP_parallel" in model.artifact.data  # its kernels open OpenMP regions
    native = NativeModel(model, {"x": x})
    gomp = _gomp()
    before = gomp.omp_get_max_threads()
    try:
        for threads in (1, 2, 3):
            gomp.omp_set_num_threads(threads)
            (got,) = native.run()
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
        native.call()  # the pool of 3 exists now
        started = _threads_of_this_process()
        for _ in range(50):
            native.call()
        # libgomp keeps its threads between regions and calls: none started (or ended) per call
        assert _threads_of_this_process() == started
    finally:
        gomp.omp_set_num_threads(before)

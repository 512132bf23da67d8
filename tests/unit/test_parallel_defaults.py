"""Untuned kernels on several threads (`model_kernels.default_config`): the parallel choice
whose loop shares out evenly over the threads, never a fused parallel loop that splits a tile's
tail (a min() bound in every tile), numpy's answers on 1, 2 and 3 threads; and a one-thread
model without any parallel loop (its elementwise kernels included)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_compiler_ops import _libgomp, check_close, reduction_length, run_built, template

from compiler import zoo
from compiler.codegen.c import render_c
from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model import build_model, plan_model
from compiler.graph.ir import Graph
from compiler.graph.model_kernels import PARALLEL_MIN_BALANCE, default_config, parallel_balance
from compiler.ir.stmt import For, ForKind, Stmt
from compiler.ir.transform import walk_stmts
from compiler.lower import lower
from compiler.ops.base import PARALLEL_KNOB, threaded_space
from tuner.network.timing import NativeModel, OrtPeer, seeded_feeds

pytestmark = pytest.mark.usefixtures("build_cache")

# (template, workload of at least PARALLEL_MIN_FLOP, layout blocks): "outer" runs 3 channel
# blocks on 2 threads (balance 0.75), and the pixels of the 1x1 images are no multiple of the
# largest tiles that fit (a fused loop must not split a tail)
UNEVEN = [
    ("conv2d_1x1_nchwc", (1, 64, 22, 23, 48, 1, 1, 1, 0, 3), {"ic_block": 16, "oc_block": 16}),
    ("conv2d_1x1_nchwc", (1, 16, 112, 112, 96, 1, 1, 1, 0, 3), {"ic_block": 16, "oc_block": 32}),
    ("conv2d_nchwc", (1, 32, 15, 19, 48, 3, 3, 1, 1, 2), {"ic_block": 16, "oc_block": 16}),
    ("depthwise_conv2d_nchwc", (1, 48, 49, 51, 3, 3, 1, 1, 3), {"c_block": 16}),
]


def _parallel_loops(body: Stmt) -> list[For]:
    return [s for s in walk_stmts(body) if isinstance(s, For) and s.kind is ForKind.PARALLEL]


@pytest.mark.parametrize(("name", "workload", "blocks"), UNEVEN)
def test_the_default_parallel_loop_shares_out_evenly_without_a_split_tail(
    name: str, workload: tuple[int, ...], blocks: dict[str, int]
) -> None:
    t = template(name)
    config = default_config(t, workload, "host", blocks, threads=2)
    space = threaded_space(t, workload, 2)
    outer = space.get(space.index_of({**dict(config), PARALLEL_KNOB: "outer"}))
    assert parallel_balance(t, workload, outer, 2) == 0.75  # 3 blocks: what "outer" gives
    assert config[PARALLEL_KNOB] == "fused"
    assert parallel_balance(t, workload, config, 2) >= PARALLEL_MIN_BALANCE
    func = lower(*t.instantiate(workload, config), "k")
    assert _parallel_loops(func.body)
    body = render_c([(func, "k")]).split("int32_t k(void **args)")[1]
    assert not re.search(
        r"for \([^;]*;[^;]*kiln_min", body
    )  # no tile of the fused loop is cut short
    gomp = _libgomp()
    before = gomp.omp_get_max_threads()
    try:
        for threads in (1, 2, 3):
            gomp.omp_set_num_threads(threads)
            if workload[2] > 100:
                continue  # the large one is here for its config only
            ((ours, ref),) = run_built(t, [(workload, config)])
            check_close(
                ours, ref, f"{name} {workload} {threads}", reduction_length(t, workload, ref.size)
            )
    finally:
        gomp.omp_set_num_threads(before)


def test_an_even_outer_loop_stays_the_default_and_small_kernels_stay_serial() -> None:
    t = template("conv2d_1x1_nchwc")
    six_blocks = (1, 32, 28, 28, 192, 1, 1, 1, 0, 3)
    config = default_config(t, six_blocks, "host", {"ic_block": 32, "oc_block": 32}, threads=2)
    assert config[PARALLEL_KNOB] == "outer" and parallel_balance(t, six_blocks, config, 2) == 1.0
    tiny = (1, 16, 4, 4, 48, 1, 1, 1, 0, 3)
    assert (
        default_config(t, tiny, "host", {"ic_block": 16, "oc_block": 16}, 2)[PARALLEL_KNOB]
        == "none"
    )


def _relu_net() -> Graph:
    """x[1, 64, 32, 32] -> ReLU -> + 1: one elementwise kernel of 65,536 elements."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Add", ["r", "one"], ["y"]),
    ]
    one = helper.make_tensor("one", TensorProto.FLOAT, (1,), [1.0])
    graph = helper.make_graph(
        nodes,
        "relu_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 64, 32, 32))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [one],
    )
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_one_thread_model_has_no_parallel_loop() -> None:
    graph = _relu_net()
    loops = {}
    for threads in (1, 2):
        plan = plan_model(graph, None, "host", threads)
        loops[threads] = [
            loop
            for step in plan.steps
            for loop in _parallel_loops(lower(step.kernel.sch, step.kernel.args, "k").body)
        ]
    assert loops[1] == [] and loops[2]
    x = np.random.default_rng(2).standard_normal((1, 64, 32, 32)).astype(np.float32)
    (got,) = NativeModel(build_model(graph, None, "host", 1), {"x": x}).run()
    np.testing.assert_allclose(got, np.maximum(x, 0) + 1, rtol=1e-6)


def test_mobilenet_v2_built_for_two_threads_matches_onnxruntime_on_any_thread_count() -> None:
    """The untuned defaults on two threads over a whole network (fused 1x1 tiles that divide
    the pixels, depthwise rows in parallel): onnxruntime's outputs on 1, 2 and 3 threads."""
    proto = zoo.build("mobilenet_v2", image=96)
    feeds = seeded_feeds(proto, 0, zoo.BERT_VOCAB)
    (expected,) = OrtPeer(proto, feeds).run()
    plan = plan_model(from_onnx(proto), None, "host", 2)
    assert any(s.config is not None and s.config.get(PARALLEL_KNOB) == "fused" for s in plan.steps)
    native = NativeModel(build_model(from_onnx(proto), None, "host", 2), feeds)
    gomp = _libgomp()
    before = gomp.omp_get_max_threads()
    try:
        for threads in (1, 2, 3):
            gomp.omp_set_num_threads(threads)
            (got,) = native.run()
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3, err_msg=f"{threads}")
    finally:
        gomp.omp_set_num_threads(before)

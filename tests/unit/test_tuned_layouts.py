"""Tuned configs and the model's layout: a config whose output channel block differs from the
default is not taken for a conv whose output joins a concat (the concat, and what reads it, would
leave the blocked layout), however much faster it measured alone; elsewhere it is, when it beats
the block-keeping best by more than the conversions cost."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model import plan_model
from compiler.graph.ir import Graph
from tuner import records as rec
from tuner.measure import MeasureResult, Status
from tuner.network.tune import configs_from_records, model_tasks
from tuner.records import FileRecords


def net(concat: bool) -> Graph:
    """x -> 1x1 conv (64 -> 64) -> ReLU, then a concat with a 3x3 branch (or an add of it)."""
    rng = np.random.default_rng(3)

    def w(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["r", "b"], ["y"], axis=1)
        if concat
        else helper.make_node("Add", ["r", "b"], ["y"]),
        helper.make_node("MaxPool", ["y"], ["z"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "joined",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 14, 14])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [w("w1", 64, 64, 1, 1), w("w2", 64, 64, 3, 3)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return from_onnx(model)


def records_with_a_faster_other_block(graph: Graph, path: Path) -> tuple[int, int]:
    """Records of the 1x1 task: its default config at 1 ms and a config with another output
    block at 0.1 ms; (default index, other index)."""
    (mt,) = [m for m in model_tasks(graph)[0] if m.task.workload.op == "conv2d_1x1_nchwc"]
    space = mt.task.space
    default = mt.default_index("host")
    other = next(
        i
        for i in range(len(space))
        if space.get(i)["ic_block"] == mt.blocks["ic_block"]
        and space.get(i)["oc_block"] != mt.blocks["oc_block"]
    )
    target = "x86_64-avx512"  # what "host" resolves to doesn't matter: records and lookup agree
    store = FileRecords(path)
    store.append(
        [
            rec.Record(
                mt.task.workload,
                target,
                i,
                mt.task.knobs(i),
                MeasureResult(Status.OK, (s,) * 3, device_id="a/0"),
                mt.task.flop,
                rec.now_iso(),
                len(space),
            )
            for i, s in ((default, 1e-3), (other, 1e-4))
        ]
    )
    return default, other


def test_a_concat_joined_conv_keeps_its_output_block(tmp_path: Path) -> None:
    for concat in (True, False):
        graph = net(concat)
        default, other = records_with_a_faster_other_block(graph, tmp_path / f"{concat}.jsonl")
        store = FileRecords(tmp_path / f"{concat}.jsonl")
        (mt,) = [m for m in model_tasks(graph)[0] if m.task.workload.op == "conv2d_1x1_nchwc"]
        assert mt.spec.joined is concat
        configs = configs_from_records(graph, store, "x86_64-avx512")
        picked = configs[mt.spec.key].index
        assert picked == (default if concat else other)
        ops = plan_model(graph, configs).graph.op_counts()
        if concat:  # the concat and the pool after it stay blocked
            assert "concat" in ops and "max_pool2d" not in ops and ops["max_pool2d_nchwc"] == 1

"""Grouped convolutions and channel shuffles: a grouped 1x1 convolution imports as one conv2d and
compiles with `grouped_conv2d_1x1_nchwc`, a shuffle of blocked channels stays blocked
(`gather_channels_nchwc`), other grouped convolutions still run per group; every model against
onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_runtime import ModelRunner
from onnx import TensorProto, helper, numpy_helper

from compiler.frontend.onnx import from_onnx
from compiler.graph import get_op
from compiler.graph.build_model import build_model, optimize
from compiler.graph.ops_layout import channel_tables
from compiler.graph.passes.layout import default_block, grouped_block
from compiler.ops.layout import pack_nchwc, unpack_nchwc

pytestmark = pytest.mark.usefixtures("build_cache")

RNG = np.random.default_rng(23)


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    scale = 1.0 / np.sqrt(np.prod(shape[1:]))
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def shuffle_unit(channels: int, mid: int, groups: int, side: int) -> onnx.ModelProto:
    """ShuffleNet's unit without its shortcut: grouped 1x1 + ReLU, channel shuffle
    (Reshape-Transpose-Reshape), depthwise 3x3, grouped 1x1."""
    inits = [
        _weight("w1", mid, channels // groups, 1, 1),
        _weight("b1", mid),
        _weight("wd", mid, 1, 3, 3),
        _weight("w2", channels, mid // groups, 1, 1),
        numpy_helper.from_array(np.array([1, groups, mid // groups, side, side], np.int64), "s5"),
        numpy_helper.from_array(np.array([1, mid, side, side], np.int64), "s4"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["g1"], group=groups),
        helper.make_node("Relu", ["g1"], ["r1"]),
        helper.make_node("Reshape", ["r1", "s5"], ["a"]),
        helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "s4"], ["sh"]),
        helper.make_node("Conv", ["sh", "wd"], ["dw"], group=mid, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["dw", "w2"], ["y"], group=groups),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, side, side])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, side, side])
    graph = helper.make_graph(nodes, "shuffle_unit", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def one_conv(channels: int, out: int, groups: int, kernel: int, pad: int) -> onnx.ModelProto:
    inits = [_weight("w", out, channels // groups, kernel, kernel), _weight("b", out)]
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=groups, pads=[pad] * 4)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 9, 7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "grouped", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def against_onnxruntime(model: onnx.ModelProto) -> None:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, feeds)
    (got,) = ModelRunner(build_model(from_onnx(model))).run(feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("channels", "mid", "groups", "side"),
    [(24, 60, 3, 8), (32, 64, 4, 6), (48, 96, 3, 5)],  # blocks of 20, 16 and 32-per-group
)
def test_a_shuffle_unit_runs_grouped_and_blocked_and_matches_onnxruntime(
    channels: int, mid: int, groups: int, side: int
) -> None:
    model = shuffle_unit(channels, mid, groups, side)
    g = optimize(from_onnx(model))
    templates = [n.attrs["template"] for n in g.nodes if n.op == "conv2d_nchwc"]
    assert templates == [
        "grouped_conv2d_1x1_nchwc",
        "depthwise_conv2d_nchwc",
        "grouped_conv2d_1x1_nchwc",
    ]
    ops = g.op_counts()
    assert "concat" not in ops and "slice" not in ops  # one convolution, not one per group
    # the shuffle is one blocked gather; data changes layout only where it enters and leaves
    assert ops["gather_channels_nchwc"] == 1 and "gather" not in ops
    assert ops["layout_transform"] == 2
    against_onnxruntime(model)


def test_grouped_convolutions_the_template_does_not_take_still_run_per_group() -> None:
    model = one_conv(12, 18, 3, 3, 1)  # 3x3: one convolution per group, joined by a concat
    ops = from_onnx(model).op_counts()
    assert ops["conv2d"] == 3 and ops["concat"] == 1
    against_onnxruntime(model)
    model = one_conv(12, 18, 3, 1, 1)  # 1x1 but padded: per group too
    assert from_onnx(model).op_counts()["conv2d"] == 3
    against_onnxruntime(model)
    grouped = one_conv(12, 18, 3, 1, 0)
    assert from_onnx(grouped).op_counts()["conv2d"] == 1
    against_onnxruntime(grouped)


@pytest.mark.parametrize(("in_block", "out_block", "count"), [(4, 4, 12), (4, 3, 9), (6, 5, 5)])
def test_blocked_channel_gather_matches_numpy(in_block: int, out_block: int, count: int) -> None:
    x = RNG.standard_normal((2, 12, 3, 4)).astype(np.float32)
    indices = RNG.integers(0, 12, count)  # repeats and any order: not only permutations
    blocks, lanes = channel_tables(indices, in_block, out_block)
    (got,) = get_op("gather_channels_nchwc").reference([pack_nchwc(x, in_block), blocks, lanes], {})
    np.testing.assert_array_equal(unpack_nchwc(got), x[:, indices])


def test_channel_blocks_of_groups_and_of_counts_no_vector_divides() -> None:
    assert default_block(60) == 20 and default_block(20) == 20  # not 15 and 10
    assert default_block(24) == 8 and default_block(48) == 16 and default_block(10) == 10
    assert grouped_block(40) == 40 and grouped_block(72) == 24 and grouped_block(80) == 16
    assert grouped_block(20) == 20

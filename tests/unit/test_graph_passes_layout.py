"""The NCHW -> NCHW[x]c layout pass and the blocked ops it emits."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from compiler.graph import Graph, GraphError, TensorType, get_op
from compiler.graph.execute import run_reference
from compiler.graph.passes import cancel_layout_transforms, to_nchwc
from compiler.graph.passes.rewrite import add_op
from compiler.ops.layout import pack_bias, pack_conv_weight, pack_depthwise_weight, pack_nchwc


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, shape).astype(np.float32)


def _conv(
    g: Graph,
    rng: np.random.Generator,
    x: str,
    oc: int,
    k: int = 3,
    groups: int = 1,
    **attrs: object,
) -> str:
    ic = g.type_of(x).shape[1]
    w = g.add_constant("w", _rand(rng, oc, ic // groups, k, k))
    b = g.add_constant("b", _rand(rng, oc))
    pad = k // 2
    (y,) = add_op(g, "conv2d", [x, w, b], {"pads": (pad,) * 4, "groups": groups, **attrs})
    return y


def _transforms(g: Graph) -> list[tuple[str, str]]:
    return [
        (str(n.attrs["src_layout"]), str(n.attrs["dst_layout"]))
        for n in g.nodes
        if n.op == "layout_transform"
    ]


def _assert_round_trip(g: Graph, out: Graph, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    feeds = {v: _rand(rng, *g.type_of(v).shape) for v in g.inputs}
    assert out.inputs == g.inputs and out.outputs == g.outputs
    assert [out.type_of(v) for v in out.outputs] == [g.type_of(v) for v in g.outputs]
    for want, got in zip(run_reference(g, feeds), run_reference(out, feeds), strict=True):
        # float32 sums of up to 576 products (a 3x3 over 64 channels), Winograd among them: a
        # layout bug is off by O(1), rounding by 1e-5 (numpy 2.4 vs 2.3 moved one element there)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=5e-5)


def _small_net() -> Graph:
    """Stem, pool, a residual block, a depthwise conv, a strided 1x1, a scale, global pool, fc."""
    rng = np.random.default_rng(11)
    g = Graph("small_net")
    x = g.add_input("x", (1, 3, 12, 12))
    (s,) = add_op(g, "relu", [_conv(g, rng, x, 16)])
    (p,) = add_op(g, "max_pool2d", [s], {"kernel": (2, 2), "strides": (2, 2)})
    (r,) = add_op(g, "relu", [_conv(g, rng, p, 16)])
    (a,) = add_op(g, "add", [_conv(g, rng, r, 16), p])
    (r2,) = add_op(g, "relu", [a])
    (d,) = add_op(g, "clip", [_conv(g, rng, r2, 16, groups=16)], {"min": 0.0, "max": 6.0})
    c = _conv(g, rng, d, 32, k=1, strides=(2, 2))
    (m,) = add_op(g, "mul", [c, g.add_constant("scale", _rand(rng, 32, 1, 1))])
    (shift,) = add_op(g, "add", [g.add_constant("shift", np.array(0.25, np.float32)), m])
    (gp,) = add_op(g, "global_avg_pool2d", [shift])
    (f,) = add_op(g, "reshape", [gp], {"shape": (1, 32)})
    (y,) = add_op(g, "dense", [f, g.add_constant("fc", _rand(rng, 32, 10))])
    g.set_outputs([y])
    return g


@pytest.mark.parametrize(
    "block",
    [None, lambda c: 8 if c % 8 == 0 else c, lambda c: 4 if c == 16 else (8 if c == 32 else c)],
    ids=["default", "block8", "mixed"],
)
def test_small_net_round_trips_with_transforms_only_at_the_boundaries(
    block: Callable[[int], int] | None,
) -> None:
    g = _small_net()
    out = to_nchwc(g) if block is None else to_nchwc(g, block)
    out.verify()
    _assert_round_trip(g, out)
    ops = out.op_counts()
    assert ops["conv2d_nchwc"] == 5 and "conv2d" not in ops
    assert ops["max_pool2d_nchwc"] == 1 and ops["global_avg_pool2d_nchwc"] == 1
    # in: the image into the stem (one block of its 3 channels); out: the pooled vector to NCHW
    assert _transforms(out) == [
        ("NCHW", "NCHW3c"),
        (_layout_of(out, "global_avg_pool2d_nchwc"), "NCHW"),
    ]
    weights = {n.inputs[1] for n in out.nodes if n.op == "conv2d_nchwc"}
    assert weights <= set(out.constants)
    assert not any(out.type_of(v).shape[1:] == (3, 3, 3) for v in out.constants)  # OIHW dropped


def _layout_of(g: Graph, op: str) -> str:
    (node,) = [n for n in g.nodes if n.op == op]
    return f"NCHW{g.type_of(node.outputs[0]).shape[-1]}c"


def test_conv_templates_blocks_and_packed_weights() -> None:
    g = _small_net()
    out = to_nchwc(g)
    convs = [n for n in out.nodes if n.op == "conv2d_nchwc"]
    assert [n.attrs["template"] for n in convs] == [
        "conv2d_stem_nchwc",
        "conv2d_nchwc",  # 3x3 stride 1, but a 6x6 output is too small for Winograd
        "conv2d_nchwc",
        "depthwise_conv2d_nchwc",
        "conv2d_1x1_nchwc",
    ]
    assert [(n.attrs["ic_block"], n.attrs["oc_block"]) for n in convs] == [
        (3, 16), (16, 16), (16, 16), (16, 16), (16, 32),  # a 1x1's output: two vectors wide
    ]  # fmt: skip
    orig = [n for n in g.nodes if n.op == "conv2d"]
    np.testing.assert_array_equal(
        out.constants[convs[0].inputs[1]], pack_conv_weight(g.constants[orig[0].inputs[1]], 3, 16)
    )
    np.testing.assert_array_equal(
        out.constants[convs[3].inputs[1]], pack_depthwise_weight(g.constants[orig[3].inputs[1]], 16)
    )
    np.testing.assert_array_equal(
        out.constants[convs[4].inputs[2]], pack_bias(g.constants[orig[4].inputs[2]], 32)
    )


def test_ops_that_stay_nchw_get_transforms_on_both_sides() -> None:
    rng = np.random.default_rng(5)
    g = Graph("softmax_between")
    x = g.add_input("x", (1, 8, 6, 6))
    (r,) = add_op(g, "relu", [_conv(g, rng, x, 16)])
    (sm,) = add_op(g, "softmax", [r], {"axis": 1})  # NCHW only
    (y,) = add_op(g, "add", [_conv(g, rng, sm, 16), r])  # r is needed blocked again: reused
    g.set_outputs([y, r])  # r is also an output: its NCHW form keeps the name
    out = to_nchwc(g, lambda c: 8)
    assert _transforms(out) == [
        ("NCHW", "NCHW8c"),  # x into the first conv
        ("NCHW8c", "NCHW"),  # r into the softmax (and out as a graph output)
        ("NCHW", "NCHW8c"),  # the softmax into the second conv
        ("NCHW8c", "NCHW"),  # y out
    ]
    _assert_round_trip(g, out)


def test_channel_broadcasts_that_cannot_be_blocked_fall_back_to_nchw() -> None:
    rng = np.random.default_rng(6)
    g = Graph("mask")
    x = g.add_input("x", (1, 8, 4, 4))
    mask = g.add_input("mask", (1, 1, 4, 4))  # one channel, computed at run time
    (y,) = add_op(g, "mul", [_conv(g, rng, x, 8), mask])
    (z,) = add_op(g, "add", [y, g.add_constant("per_pixel", _rand(rng, 4, 4))])
    g.set_outputs([z])
    out = to_nchwc(g, lambda c: 4)
    ops = [n.op for n in out.nodes]
    assert ops == ["layout_transform", "conv2d_nchwc", "layout_transform", "mul", "add"]
    _assert_round_trip(g, out)


def test_cancel_layout_transforms_removes_round_trips_and_composes_chains() -> None:
    g = Graph("pairs")
    x = g.add_input("x", (1, 16, 2, 2))
    (a,) = add_op(g, "layout_transform", [x], {"src_layout": "NCHW", "dst_layout": "NCHW8c"})
    (b,) = add_op(g, "layout_transform", [a], {"src_layout": "NCHW8c", "dst_layout": "NCHW"})
    (r,) = add_op(g, "relu", [b])
    (c,) = add_op(g, "layout_transform", [r], {"src_layout": "NCHW", "dst_layout": "NCHW8c"})
    (d,) = add_op(g, "layout_transform", [c], {"src_layout": "NCHW8c", "dst_layout": "NCHW4c"})
    (e,) = add_op(g, "exp", [d])
    g.set_outputs([e])
    out = cancel_layout_transforms(g)
    assert [n.op for n in out.nodes] == ["relu", "layout_transform", "exp"]
    assert out.nodes[0].inputs == [x]
    assert _transforms(out) == [("NCHW", "NCHW4c")]
    _assert_round_trip(g, out)


def test_blocked_ops_match_their_nchw_definitions() -> None:
    rng = np.random.default_rng(8)
    x = _rand(rng, 2, 8, 9, 7)
    attrs = {"strides": (2, 1), "pads": (1, 0, 2, 1), "dilations": (1, 2), "groups": 1}
    w, b = _rand(rng, 12, 8, 3, 3), _rand(rng, 12)
    (want,) = get_op("conv2d").reference([x, w, b], attrs)
    packed = [pack_nchwc(x, 4), pack_conv_weight(w, 4, 6), pack_bias(b, 6)]
    blocked = {**attrs, "ic_block": 4, "oc_block": 6}
    (got,) = get_op("conv2d_nchwc").reference(packed, blocked)
    np.testing.assert_allclose(got, pack_nchwc(want, 6), rtol=1e-5, atol=1e-5)
    (t,) = get_op("conv2d_nchwc").infer([get_type(a) for a in packed], blocked)
    assert t.shape == got.shape

    dw = _rand(rng, 8, 1, 3, 3)
    dattrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "groups": 8}
    (want,) = get_op("conv2d").reference([x, dw], dattrs)
    (got,) = get_op("conv2d_nchwc").reference(
        [pack_nchwc(x, 4), pack_depthwise_weight(dw, 4)], {**dattrs, "ic_block": 4, "oc_block": 4}
    )
    np.testing.assert_allclose(got, pack_nchwc(want, 4), rtol=1e-5, atol=1e-5)

    to8 = {"src_layout": "NCHW", "dst_layout": "NCHW8c"}
    (y8,) = get_op("layout_transform").reference([x], to8)
    (y2,) = get_op("layout_transform").reference(
        [y8], {"src_layout": "NCHW8c", "dst_layout": "NCHW2c"}
    )
    (back,) = get_op("layout_transform").reference(
        [y2], {"src_layout": "NCHW2c", "dst_layout": "NCHW"}
    )
    np.testing.assert_array_equal(back, x)
    with pytest.raises(GraphError, match="does not divide"):
        get_op("layout_transform").infer(
            [get_type(x)], {"src_layout": "NCHW", "dst_layout": "NCHW3c"}
        )
    with pytest.raises(GraphError, match="unknown layout"):
        get_op("layout_transform").infer(
            [get_type(x)], {"src_layout": "NHWC", "dst_layout": "NCHW"}
        )


def get_type(a: np.ndarray) -> TensorType:
    return TensorType(tuple(a.shape), str(a.dtype))


def test_a_block_that_does_not_divide_is_named() -> None:
    rng = np.random.default_rng(9)
    g = Graph("bad_block")
    x = g.add_input("x", (1, 8, 4, 4))
    g.set_outputs([_conv(g, rng, x, 12)])
    with pytest.raises(GraphError, match="block 8 for 12 channels"):
        to_nchwc(g, lambda c: 8)


def test_default_block_prefers_whole_half_vectors() -> None:
    from compiler.graph.passes.layout import default_block

    assert [default_block(c) for c in (64, 144, 24, 40, 12, 3, 7)] == [16, 16, 8, 8, 12, 3, 7]
    # wide channel counts no whole vector divides take wide multiples of 8
    assert [default_block(c) for c in (1000, 200, 72, 1001)] == [40, 40, 24, 13]


def test_a_channel_concat_of_blocked_values_stays_blocked() -> None:
    """Inception branches joined by Concat, then a pool: no transform between the convs, the
    concat and the pool (which runs blocked); the pool read NCHW data before, 4.6 of an
    inception-style net's 10.5 ms."""
    rng = np.random.default_rng(5)
    g = Graph("branches")
    x = g.add_input("x", (1, 16, 8, 8))
    a = _conv(g, rng, x, 16, k=1)
    b = _conv(g, rng, x, 32, k=3)
    (cat,) = add_op(g, "concat", [a, b], {"axis": 1})
    (y,) = add_op(g, "max_pool2d", [cat], {"kernel": (3, 3), "strides": (1, 1), "pads": (1,) * 4})
    g.set_outputs([y])
    out = to_nchwc(g)
    ops = [n.op for n in out.nodes]
    assert "max_pool2d_nchwc" in ops and "max_pool2d" not in ops
    (concat,) = [n for n in out.nodes if n.op == "concat"]
    assert concat.attrs["axis"] == 1 and len(out.type_of(concat.outputs[0]).shape) == 5
    assert _transforms(out) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    _assert_round_trip(g, out)


def test_a_concat_of_values_in_different_blocks_joins_them_in_nchw() -> None:
    rng = np.random.default_rng(6)
    g = Graph("mixed")
    x = g.add_input("x", (1, 16, 6, 6))
    a = _conv(g, rng, x, 16, k=1)  # blocks of 16
    b = _conv(g, rng, x, 24, k=1)  # blocks of 8
    (cat,) = add_op(g, "concat", [a, b], {"axis": 1})
    g.set_outputs([cat])
    out = to_nchwc(g)
    (concat,) = [n for n in out.nodes if n.op == "concat"]
    assert len(out.type_of(concat.outputs[0]).shape) == 4
    _assert_round_trip(g, out)


def _blocks(out: Graph) -> list[tuple[str, int, int]]:
    return [
        (str(n.attrs["template"]), int(n.attrs["ic_block"]), int(n.attrs["oc_block"]))
        for n in out.nodes
        if n.op == "conv2d_nchwc"
    ]


def test_a_1x1_output_is_two_vectors_wide_and_its_readers_take_that_block() -> None:
    """ResNet-50's bottlenecks and DenseNet's 1x1s ran at ~110 GFLOP/s with one-vector blocks
    (a broadcast per FMA); the whole ResNet-50-style net's kernels 47 -> 32 ms untuned."""
    rng = np.random.default_rng(7)
    g = Graph("bottleneck")
    x = g.add_input("x", (1, 16, 8, 8))
    (y,) = add_op(g, "relu", [_conv(g, rng, x, 64, k=1)])
    (z,) = add_op(g, "relu", [_conv(g, rng, y, 64, k=3)])  # reads the 1x1's blocks as they are
    dw = _conv(g, rng, z, 64, k=3, groups=64)  # depthwise too
    g.set_outputs([dw])
    out = to_nchwc(g)
    assert _blocks(out) == [
        ("conv2d_1x1_nchwc", 16, 32),
        ("conv2d_winograd_nchwc", 32, 16),
        ("depthwise_conv2d_nchwc", 16, 16),
    ]
    assert _transforms(out) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    _assert_round_trip(g, out)


def test_a_1x1_joined_with_a_value_of_another_block_keeps_one_vector() -> None:
    rng = np.random.default_rng(8)
    g = Graph("joins")
    x = g.add_input("x", (1, 16, 8, 8))
    (a,) = add_op(g, "relu", [_conv(g, rng, x, 32, k=1)])
    b = _conv(g, rng, x, 16, k=3)
    (cat,) = add_op(g, "concat", [a, b], {"axis": 1})  # an inception block's branches
    c = _conv(g, rng, cat, 32, k=1)  # a downsample-style 1x1 ...
    d = _conv(g, rng, x, 32, k=3)  # ... added to a 3x3's output (blocks of 16)
    (s,) = add_op(g, "add", [c, d])
    g.set_outputs([s])
    out = to_nchwc(g)
    assert [ocb for t, _, ocb in _blocks(out) if t == "conv2d_1x1_nchwc"] == [16, 16]
    assert _transforms(out) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    _assert_round_trip(g, out)


def test_a_channel_shuffle_becomes_one_gather_by_constant_indices() -> None:
    from compiler.graph.passes import shuffles_to_gathers

    rng = np.random.default_rng(9)
    g = Graph("shuffle")
    x = g.add_input("x", (1, 12, 4, 5))
    (a,) = add_op(g, "reshape", [x], {"shape": (1, 3, 4, 4, 5)})
    (b,) = add_op(g, "transpose", [a], {"perm": (0, 2, 1, 3, 4)})
    (c,) = add_op(g, "reshape", [b], {"shape": (1, 12, 4, 5)})
    (y,) = add_op(g, "relu", [c])
    g.set_outputs([y])
    out = shuffles_to_gathers(g)
    assert [n.op for n in out.nodes] == ["gather", "relu"]
    (gather,) = [n for n in out.nodes if n.op == "gather"]
    assert gather.attrs["axis"] == 1 and gather.inputs[1] in out.constants
    feeds = {"x": _rand(rng, 1, 12, 4, 5)}
    (want,) = run_reference(g, feeds)
    (got,) = run_reference(out, feeds)
    np.testing.assert_array_equal(got, want)
    # a shuffle whose middle value is also read elsewhere stays as it is
    g.set_outputs([y, b])
    assert [n.op for n in shuffles_to_gathers(g).nodes] == [
        "reshape",
        "transpose",
        "reshape",
        "relu",
    ]

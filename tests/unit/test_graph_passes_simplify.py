"""Inference simplification: batch norms and per-channel scales folded into convolutions."""

from __future__ import annotations

import numpy as np

from compiler.graph import Graph
from compiler.graph.execute import run_reference
from compiler.graph.passes import fold_batch_norm, fold_scale_into_conv
from compiler.graph.passes.rewrite import add_op


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, shape).astype(np.float32)


def _assert_same(before: Graph, after: Graph, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    feeds = {v: _rand(rng, *before.type_of(v).shape) for v in before.inputs}
    for want, got in zip(run_reference(before, feeds), run_reference(after, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _bn(g: Graph, rng: np.random.Generator, x: str, name: str) -> str:
    c = g.type_of(x).shape[1]
    params = [g.add_constant(f"{name}_{p}", _rand(rng, c)) for p in ("scale", "bias", "mean")]
    var = g.add_constant(f"{name}_var", rng.uniform(0.2, 2.0, c).astype(np.float32))
    (y,) = add_op(g, "batch_norm", [x, *params, var], {"epsilon": 1e-3}, name=name)
    return y


def _conv(g: Graph, rng: np.random.Generator, x: str, oc: int, bias: bool, **attrs: object) -> str:
    ic = g.type_of(x).shape[1] // int(attrs.get("groups", 1))  # type: ignore[call-overload]
    inputs = [x, g.add_constant("w", _rand(rng, oc, ic, 3, 3))]
    if bias:
        inputs.append(g.add_constant("b", _rand(rng, oc)))
    (y,) = add_op(g, "conv2d", inputs, {"pads": (1, 1, 1, 1), **attrs})
    return y


def test_conv_batch_norm_becomes_one_conv_with_bias() -> None:
    rng = np.random.default_rng(1)
    for bias in (False, True):
        g = Graph("conv_bn")
        x = g.add_input("x", (2, 3, 7, 7))
        y = _bn(g, rng, _conv(g, rng, x, 6, bias, strides=(2, 2)), "bn")
        (r,) = add_op(g, "relu", [y])
        g.set_outputs([r])
        out = fold_batch_norm(g)
        assert out.op_counts() == {"conv2d": 1, "relu": 1}
        conv = out.nodes[0]
        assert len(conv.inputs) == 3 and conv.outputs == [y]
        assert not any(k.startswith("bn_") for k in out.constants)  # parameters pruned
        _assert_same(g, out)


def test_grouped_conv_batch_norm_folds_per_output_channel() -> None:
    rng = np.random.default_rng(2)
    g = Graph("depthwise_bn")
    x = g.add_input("x", (1, 4, 6, 6))
    y = _bn(g, rng, _conv(g, rng, x, 4, False, groups=4), "bn")
    g.set_outputs([y])
    out = fold_batch_norm(g)
    assert out.op_counts() == {"conv2d": 1}
    _assert_same(g, out)


def test_batch_norm_without_a_private_conv_becomes_mul_add() -> None:
    rng = np.random.default_rng(3)
    g = Graph("shared")
    x = g.add_input("x", (1, 4, 5, 5))
    c = _conv(g, rng, x, 4, True)
    y = _bn(g, rng, c, "bn1")  # the conv output is also returned: not foldable
    h = g.add_input("h", (3, 4))
    z = _bn(g, rng, h, "bn2")  # rank 2, no conv at all
    g.set_outputs([y, c, z])
    out = fold_batch_norm(g)
    assert out.op_counts() == {"conv2d": 1, "mul": 2, "add": 2}
    shapes = sorted(out.type_of(n.inputs[1]).shape for n in out.nodes if n.op == "mul")
    assert shapes == [(4,), (4, 1, 1)]
    assert out.outputs == g.outputs
    _assert_same(g, out)


def test_scales_and_shifts_fold_into_conv_weights() -> None:
    rng = np.random.default_rng(4)
    g = Graph("scale_shift")
    x = g.add_input("x", (1, 3, 6, 6))
    c = _conv(g, rng, x, 8, False)
    (m,) = add_op(g, "mul", [g.add_constant("s", _rand(rng, 8, 1, 1)), c])  # constant first
    (a,) = add_op(g, "add", [m, g.add_constant("t", _rand(rng, 1, 8, 1, 1))])
    (d,) = add_op(g, "div", [a, g.add_constant("k", np.array(4.0, np.float32))])  # a scalar
    (s,) = add_op(g, "sub", [d, g.add_constant("u", _rand(rng, 8, 1, 1))])
    g.set_outputs([s])
    out = fold_scale_into_conv(g)
    assert out.op_counts() == {"conv2d": 1}
    assert out.nodes[0].outputs == [s]
    _assert_same(g, out)


def test_non_per_channel_or_shared_values_are_not_folded() -> None:
    rng = np.random.default_rng(5)
    g = Graph("kept")
    x = g.add_input("x", (1, 3, 4, 4))
    c1 = _conv(g, rng, x, 4, True)
    (m1,) = add_op(g, "mul", [c1, g.add_constant("spatial", _rand(rng, 1, 1, 4, 4))])
    c2 = _conv(g, rng, x, 4, True)
    (m2,) = add_op(g, "mul", [c2, g.add_constant("s2", _rand(rng, 4, 1, 1))])
    (r,) = add_op(g, "relu", [c2])  # c2 has two readers
    (k,) = add_op(g, "sub", [g.add_constant("s3", _rand(rng, 4, 1, 1)), m1])  # constant on the left
    c3 = _conv(g, rng, x, 4, True)
    (zero_div,) = add_op(g, "div", [c3, g.add_constant("z", np.zeros((4, 1, 1), np.float32))])
    g.set_outputs([k, r, m2, zero_div])
    out = fold_scale_into_conv(g)
    assert out.op_counts() == g.op_counts()

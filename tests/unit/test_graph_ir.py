"""The graph IR's invariants (SSA, verify, copy, producers / consumers), the op registry's type
rules, and the reference executor, checked against plain numpy."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from compiler.graph import (
    Category,
    Graph,
    GraphError,
    Node,
    TensorType,
    execute,
    get_op,
    node_category,
    node_template,
    op_names,
    run_reference,
)

RNG = np.random.default_rng(3)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def infer(op: str, *types: TensorType, **attrs: object) -> list[TensorType]:
    return get_op(op).infer(list(types), attrs)


def small_graph() -> Graph:
    """x -> dense(w, b) -> relu -> add(x2) with x2 = dense output: a little diamond."""
    g = Graph("small")
    x = g.add_input("x", (2, 4))
    w = g.add_constant("w", rand(4, 3))
    b = g.add_constant("b", rand(3))
    (d,) = g.add_node("dense", [x, w, b], infer("dense", g.types[x], g.types[w], g.types[b]))
    (r,) = g.add_node("relu", [d], [g.type_of(d)], name="act")
    (y,) = g.add_node("add", [r, d], [g.type_of(d)], output_names=["y"])
    g.set_outputs([y])
    return g


# -- IR invariants ---------------------------------------------------------------------------------


def test_small_graph_verifies_and_runs_like_numpy() -> None:
    g = small_graph()
    g.verify()
    x = rand(2, 4)
    d = x @ g.constants["w"] + g.constants["b"]
    (y,) = run_reference(g, {"x": x})
    np.testing.assert_allclose(y, np.maximum(d, 0) + d, rtol=1e-6)


def test_ssa_redefinition_is_refused() -> None:
    g = Graph()
    g.add_input("x", (2,))
    with pytest.raises(GraphError, match="'x' is defined twice"):
        g.add_input("x", (2,))
    with pytest.raises(GraphError, match="'x' is defined twice"):
        g.add_node("relu", ["x"], [TensorType((2,))], output_names=["x"])
    with pytest.raises(GraphError, match="reads undefined value 'nope'"):
        g.add_node("relu", ["nope"], [TensorType((2,))])


def test_verify_catches_broken_edits() -> None:
    g = small_graph()
    g.nodes.reverse()  # a node now reads a value before its definition
    with pytest.raises(GraphError, match="before it is defined"):
        g.verify()

    g = small_graph()
    g.nodes.append(Node("relu", ["x"], ["y"]))  # second definition of y
    with pytest.raises(GraphError, match="'y' is defined twice"):
        g.verify()

    g = small_graph()
    g.outputs = ["ghost"]
    with pytest.raises(GraphError, match="'ghost' is never defined"):
        g.verify()

    g = small_graph()
    g.constants["w"] = rand(4, 4)
    with pytest.raises(GraphError, match="constant 'w'"):
        g.verify()


def test_copy_is_independent_but_shares_constants() -> None:
    g = small_graph()
    c = g.copy()
    c.nodes[0].attrs["tag"] = 1
    c.nodes[1].inputs[0] = "x"
    c.nodes.pop()
    c.outputs = []
    assert "tag" not in g.nodes[0].attrs
    assert g.nodes[1].inputs[0] != "x"
    assert len(g.nodes) == 3 and g.outputs == ["y"]
    assert c.constants["w"] is g.constants["w"]
    fresh = c.fresh_name("v")
    assert fresh not in g.types
    g.verify()


def test_producers_and_consumers() -> None:
    g = small_graph()
    producers = g.producers()
    consumers = g.consumers()
    dense, relu, add = g.nodes
    assert producers["y"] is add and producers[relu.outputs[0]] is relu
    assert "x" not in producers
    assert consumers[dense.outputs[0]] == [relu, add]
    assert consumers["x"] == [dense] and consumers["y"] == []


def test_prune_types_forgets_removed_values() -> None:
    g = small_graph()
    relu_out = g.nodes[1].outputs[0]
    g.nodes = [g.nodes[0]]
    g.outputs = [g.nodes[0].outputs[0]]
    g.prune_types()
    assert relu_out not in g.types and "y" not in g.types
    g.verify()


# -- registry --------------------------------------------------------------------------------------


def test_registry_has_the_contract_ops_with_their_categories() -> None:
    want = {
        "conv2d": Category.COMPLEX_OUT_FUSABLE,
        "dense": Category.COMPLEX_OUT_FUSABLE,
        "matmul": Category.COMPLEX_OUT_FUSABLE,
        "conv_transpose2d": Category.REDUCTION,
        "batch_norm": Category.INJECTIVE,
        "relu": Category.INJECTIVE,
        "add": Category.INJECTIVE,
        "reshape": Category.INJECTIVE,
        "max_pool2d": Category.REDUCTION,
        "global_avg_pool2d": Category.REDUCTION,
        "softmax": Category.REDUCTION,
        "layer_norm": Category.REDUCTION,
        "reduce_mean": Category.REDUCTION,
    }
    for op, category in want.items():
        assert get_op(op).category == category, op
    assert get_op("conv2d").template == "conv2d_nchwc" and get_op("dense").template == "dense"
    assert len(op_names()) >= 35
    with pytest.raises(GraphError, match="no graph op 'frobnicate'"):
        get_op("frobnicate")


@pytest.mark.parametrize(
    ("x", "w", "groups", "strides", "template"),
    [
        ((1, 64, 56, 56), (64, 64, 3, 3), 1, (1, 1), "conv2d_winograd_nchwc"),
        ((1, 512, 10, 10), (512, 512, 3, 3), 1, (1, 1), "conv2d_winograd_nchwc"),  # 8x8 out
        ((1, 512, 9, 9), (512, 512, 3, 3), 1, (1, 1), "conv2d_nchwc"),  # 7x7: too few tiles
        ((1, 64, 56, 56), (128, 64, 3, 3), 1, (2, 2), "conv2d_nchwc"),
        ((1, 64, 56, 56), (128, 64, 1, 1), 1, (1, 1), "conv2d_1x1_nchwc"),
        ((1, 3, 224, 224), (64, 3, 7, 7), 1, (2, 2), "conv2d_stem_nchwc"),
        ((1, 32, 56, 56), (32, 1, 3, 3), 32, (1, 1), "depthwise_conv2d_nchwc"),
    ],
)
def test_conv2d_template_choice(
    x: tuple[int, ...],
    w: tuple[int, ...],
    groups: int,
    strides: tuple[int, int],
    template: str,
) -> None:
    g = Graph()
    xv = g.add_input("x", x)
    wv = g.add_constant("w", np.zeros(w, np.float32))
    attrs = {"groups": groups, "pads": (0, 0, 0, 0), "strides": strides}
    out = infer("conv2d", g.types[xv], g.types[wv], **attrs)
    g.add_node("conv2d", [xv, wv], out, attrs)
    assert node_template(g, g.nodes[0]) == template


def test_gather_category_depends_on_constant_indices() -> None:
    g = Graph()
    data = g.add_input("d", (5, 3))
    idx = g.add_input("i", (2,), "int64")
    const_idx = g.add_constant("ci", np.asarray([0, -1]))
    t = infer("gather", g.types[data], g.types[idx], axis=0)
    g.add_node("gather", [data, idx], t, {"axis": 0})
    g.add_node("gather", [data, const_idx], t, {"axis": 0})
    assert node_category(g, g.nodes[0]) == Category.OPAQUE
    assert node_category(g, g.nodes[1]) == Category.INJECTIVE


@pytest.mark.parametrize(
    ("op", "types", "attrs", "message"),
    [
        ("conv2d", [(1, 3, 8, 8), (4, 2, 3, 3)], {}, "input channels 3 != weight channels 2"),
        ("conv2d", [(1, 4, 8, 8), (6, 2, 3, 3)], {"groups": 4}, "input channels 4"),
        ("conv2d", [(1, 3, 2, 2), (4, 3, 3, 3)], {}, "larger than the padded input"),
        ("conv2d", [(1, 3, 8, 8), (4, 3, 3, 3), (5,)], {}, "bias shape [5] must be [4]"),
        ("dense", [(2, 3), (4, 5)], {}, "disagree on K"),
        ("matmul", [(2, 3, 4), (5, 4, 6)], {}, "cannot be broadcast"),
        ("add", [(2, 3), (4, 5)], {}, "shapes [2, 3] and [4, 5] cannot be broadcast"),
        ("reshape", [(2, 3)], {"shape": (4, 2)}, "cannot reshape [2, 3] to [4, 2]"),
        ("transpose", [(2, 3)], {"perm": (0, 0)}, "not a permutation"),
        ("concat", [(2, 3), (3, 3)], {"axis": 1}, "differ off axis 1"),
        ("split", [(2, 6)], {"axis": 1, "sizes": (2, 2)}, "add up to 6"),
        ("softmax", [(2, 3)], {"axis": 2}, "axis 2 is out of range for rank 2"),
        ("max_pool2d", [(1, 1, 4, 4)], {"kernel": (2, 2), "pads": (2, 0, 0, 0)}, "smaller than"),
        ("pad", [(3,)], {"pads": (3, 0), "mode": "reflect"}, "smaller than axis 0"),
        ("layer_norm", [(2, 4), (3,), (4,)], {"axis": -1}, "scale shape [3]"),
        ("batch_norm", [(1, 3, 2, 2), (3,), (3,), (3,), (4,)], {}, "var shape [4]"),
    ],
)
def test_type_rules_name_the_op_and_problem(
    op: str, types: list[tuple[int, ...]], attrs: dict[str, object], message: str
) -> None:
    with pytest.raises(GraphError) as e:
        infer(op, *(TensorType(t) for t in types), **attrs)
    assert str(e.value).startswith(f"{op}:") and message in str(e.value)


def test_conv2d_reference_against_direct_loops() -> None:
    x, w, b = rand(1, 4, 7, 6), rand(6, 2, 3, 2), rand(6)
    attrs = {"strides": (2, 1), "pads": (1, 0, 2, 1), "dilations": (1, 2), "groups": 2}
    (y,) = get_op("conv2d").reference([x, w, b], attrs)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 2), (0, 1)))
    want = np.zeros(y.shape, np.float64)
    for o in range(6):
        g = o // 3
        for i in range(y.shape[2]):
            for j in range(y.shape[3]):
                win = xp[0, 2 * g : 2 * g + 2, 2 * i : 2 * i + 3, j : j + 3 : 2]
                want[0, o, i, j] = np.sum(win * w[o]) + b[o]
    assert y.shape == tuple(
        infer("conv2d", *(TensorType(a.shape) for a in (x, w, b)), **attrs)[0].shape
    )
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_reference_executor_checks_output_types() -> None:
    g = small_graph()
    g.types["y"] = TensorType((2, 4))  # a wrong type for the add's output
    with pytest.raises(GraphError, match="output 'y' is float32\\[2, 3\\], typed float32\\[2,4\\]"):
        run_reference(g, {"x": rand(2, 4)})


def test_reference_executor_frees_values_after_their_last_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = Graph("chain")
    v = g.add_input("x", (64,))
    for _ in range(4):
        (v,) = g.add_node("relu", [v], [g.type_of(v)])
    g.set_outputs([v])
    produced: list[weakref.ref[np.ndarray]] = []
    alive_at_last_node: list[bool] = []
    relu = get_op("relu")

    def reference(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> list[np.ndarray]:
        if len(produced) == 3:  # the last node runs: the first two results are dead by now
            alive_at_last_node.extend(r() is not None for r in produced)
        (out,) = relu.reference(inputs, attrs)
        out = out.copy()
        produced.append(weakref.ref(out))
        return [out]

    spy = dataclasses.replace(relu, reference=reference)
    monkeypatch.setattr(execute, "get_op", lambda name: spy)
    (y,) = run_reference(g, {"x": rand(64)})
    assert alive_at_last_node == [False, False, True]
    assert produced[-1]() is y

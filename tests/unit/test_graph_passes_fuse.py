"""Operator fusion: groups by category and post-dominance, on small graphs."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.graph import Category, Graph
from compiler.graph.passes import FusionPlan, fold_batch_norm, fuse
from compiler.graph.passes.dominators import SINK, immediate_post_dominators
from compiler.graph.passes.rewrite import add_op

RNG = np.random.default_rng(3)


def _const(g: Graph, name: str, shape: tuple[int, ...]) -> str:
    return g.add_constant(name, RNG.standard_normal(shape).astype(np.float32))


def _conv(g: Graph, x: str, oc: int, name: str, bias: bool = True) -> str:
    ic = g.type_of(x).shape[1]
    inputs = [x, _const(g, f"{name}_w", (oc, ic, 3, 3))]
    if bias:
        inputs.append(_const(g, f"{name}_b", (oc,)))
    (y,) = add_op(g, "conv2d", inputs, {"pads": (1, 1, 1, 1)}, name=name)
    return y


def _groups(plan: FusionPlan) -> list[list[str]]:
    return [[n.name or n.op for n in group.nodes] for group in plan.groups]


def _check_partition(plan: FusionPlan) -> None:
    """Every node in one group; groups ordered so each reads only earlier groups' outputs."""
    names = [id(n) for g in plan.groups for n in g.nodes]
    assert sorted(names) == sorted(id(n) for n in plan.graph.nodes)
    available = set(plan.graph.inputs) | set(plan.graph.constants)
    for group in plan.groups:
        assert set(group.inputs) <= available, group
        available |= set(group.outputs)
        complex_members = [
            n for n in group.nodes if n.op in ("conv2d", "dense", "matmul", "conv2d_nchwc")
        ]
        assert len(complex_members) <= 1
    assert set(plan.graph.outputs) <= available


def test_conv_batch_norm_relu_is_one_group_after_folding() -> None:
    g = Graph("cbr")
    x = g.add_input("x", (1, 4, 8, 8))
    y = _conv(g, x, 8, "conv", bias=False)
    params = [_const(g, f"bn_{p}", (8,)) for p in ("scale", "bias", "mean")]
    params.append(g.add_constant("bn_var", RNG.uniform(0.5, 2.0, (8,)).astype(np.float32)))
    (b,) = add_op(g, "batch_norm", [y, *params], {"epsilon": 1e-5}, name="bn")
    (r,) = add_op(g, "relu", [b], name="relu")
    g.set_outputs([r])
    plan = fuse(fold_batch_norm(g))
    assert _groups(plan) == [["conv", "relu"]]
    (group,) = plan.groups
    assert group.anchor.op == "conv2d" and group.category == Category.COMPLEX_OUT_FUSABLE
    assert group.outputs == (r,)
    assert len(group.internal_values()) == 1  # the convolution's own output never leaves


def test_residual_block_groups_conv_bias_add_relu_together() -> None:
    g = Graph("residual")
    x = g.add_input("x", (1, 8, 8, 8))
    (r0,) = add_op(g, "relu", [_conv(g, x, 8, "conv0")], name="relu0")
    (r1,) = add_op(g, "relu", [_conv(g, r0, 8, "conv1")], name="relu1")
    (s,) = add_op(g, "add", [_conv(g, r1, 8, "conv2"), r0], name="add")
    (r2,) = add_op(g, "relu", [s], name="relu2")
    g.set_outputs([r2])
    plan = fuse(g)
    assert _groups(plan) == [["conv0", "relu0"], ["conv1", "relu1"], ["conv2", "add", "relu2"]]
    assert plan.groups[0].outputs == (r0,)  # read by conv1's group and by the residual add
    assert r0 in plan.groups[2].inputs
    assert plan.group_of(s) is plan.groups[2]
    _check_partition(plan)
    text = plan.summary()
    assert "3 groups" in text and "anchor=conv2d [conv2d -> add -> relu]" in text


def test_diamond_fuses_only_where_the_join_post_dominates() -> None:
    # conv feeds relu and sigmoid, both graph outputs: nothing post-dominates the conv.
    g = Graph("split_outputs")
    y = _conv(g, g.add_input("x", (1, 4, 6, 6)), 4, "conv")
    (a,) = add_op(g, "relu", [y], name="relu")
    (b,) = add_op(g, "sigmoid", [y], name="sigmoid")
    g.set_outputs([a, b])
    assert immediate_post_dominators(g)[0] == SINK
    assert _groups(fuse(g)) == [["conv"], ["relu"], ["sigmoid"]]

    # the same branches joined by an add: the add post-dominates, so all four are one kernel.
    (j,) = add_op(g, "add", [a, b], name="join")
    g.set_outputs([j])
    assert _groups(fuse(g)) == [["conv", "relu", "sigmoid", "join"]]

    # a convolution on one branch: the join is reached through another complex op, no fusion.
    h = Graph("complex_branch")
    y = _conv(h, h.add_input("x", (1, 4, 6, 6)), 4, "conv_a")
    (a,) = add_op(h, "relu", [y], name="relu")
    (j,) = add_op(h, "add", [a, _conv(h, y, 4, "conv_b")], name="join")
    h.set_outputs([j])
    plan = fuse(h)
    assert _groups(plan) == [["conv_a"], ["relu"], ["conv_b", "join"]]
    _check_partition(plan)


def test_softmax_stays_alone_between_matmuls_but_takes_injective_inputs() -> None:
    g = Graph("attention")
    x = g.add_input("x", (4, 8))
    (s,) = add_op(g, "matmul", [x, _const(g, "wq", (8, 8))], name="mm1")
    (sm,) = add_op(g, "softmax", [s], {"axis": -1}, name="softmax")
    (o,) = add_op(g, "matmul", [sm, _const(g, "wv", (8, 8))], name="mm2")
    g.set_outputs([o])
    plan = fuse(g)
    assert _groups(plan) == [["mm1"], ["softmax"], ["mm2"]]
    assert plan.groups[1].category == Category.REDUCTION

    h = Graph("scaled_softmax")
    x = h.add_input("x", (4, 8))
    (m,) = add_op(h, "mul", [x, h.add_constant("scale", np.array(0.125, np.float32))], name="scale")
    (sm,) = add_op(h, "softmax", [m], {"axis": -1}, name="softmax")
    (e,) = add_op(h, "exp", [sm], name="exp")
    h.set_outputs([e])
    assert _groups(fuse(h)) == [["scale", "softmax"], ["exp"]]  # no injective after a reduction


def test_injective_chains_fuse_and_opaque_nodes_stay_alone() -> None:
    g = Graph("shapes")
    x = g.add_input("x", (2, 3, 4))
    (a,) = add_op(g, "reshape", [x], {"shape": (6, 4)}, name="r1")
    (b,) = add_op(g, "transpose", [a], {"perm": (1, 0)}, name="t")
    (c,) = add_op(g, "reshape", [b], {"shape": (24,)}, name="r2")
    (idx,) = add_op(g, "cast", [add_op(g, "relu", [c], name="relu")[0]], {"dtype": "int64"})
    g.nodes[-1].name = "cast"
    (gathered,) = add_op(g, "gather", [c, idx], {"axis": 0}, name="gather")
    (n,) = add_op(g, "neg", [gathered], name="neg")
    g.set_outputs([n])
    plan = fuse(g)
    # r2's output is read by relu and by the gather: post-dominated by the opaque gather only
    assert _groups(plan) == [["r1", "t", "r2"], ["relu", "cast"], ["gather"], ["neg"]]
    assert plan.groups[2].category == Category.OPAQUE  # a gather by computed indices
    assert plan.groups[0].outputs == (c,) and plan.groups[1].outputs == (idx,)


def test_two_complex_ops_never_share_a_group() -> None:
    g = Graph("two_dense")
    x = g.add_input("x", (2, 8))
    (a,) = add_op(g, "dense", [x, _const(g, "w1", (8, 4))], name="dense1")
    (b,) = add_op(g, "dense", [x, _const(g, "w2", (8, 4))], name="dense2")
    (s,) = add_op(g, "add", [a, b], name="add")
    (c,) = add_op(g, "dense", [s, _const(g, "w3", (4, 4))], name="dense3")
    g.set_outputs([c])
    plan = fuse(g)
    assert _groups(plan) == [["dense1", "add"], ["dense2"], ["dense3"]] or _groups(plan) == [
        ["dense2"],
        ["dense1", "add"],
        ["dense3"],
    ]
    _check_partition(plan)


def test_post_dominators_of_a_diamond_with_a_side_exit() -> None:
    g = Graph("diamond")
    x = g.add_input("x", (4,))
    (a,) = add_op(g, "relu", [x])  # 0
    (b,) = add_op(g, "exp", [a])  # 1
    (c,) = add_op(g, "neg", [a])  # 2
    (d,) = add_op(g, "add", [b, c])  # 3
    (e,) = add_op(g, "sigmoid", [d])  # 4
    g.set_outputs([e, b])  # b also leaves the graph: 1 is post-dominated only by the exit
    assert immediate_post_dominators(g) == [SINK, SINK, 3, 4, SINK]


@pytest.mark.parametrize("seed", range(20))
def test_random_dags_fuse_into_a_valid_partition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = Graph("random")
    values = [g.add_input("x", (4,))]
    cats: dict[str, Category] = {}
    weights = [0.55, 0.15, 0.2, 0.1]  # injective, reduction, complex, opaque
    for i in range(int(rng.integers(4, 25))):
        k = min(int(rng.integers(1, 3)), len(values))
        inputs = list(rng.choice(values[-6:], size=min(k, len(values[-6:])), replace=False))
        (v,) = g.add_node("op", inputs, [g.type_of(values[0])], name=f"n{i}")
        cats[f"n{i}"] = Category(int(rng.choice(4, p=weights)))
        values.append(v)
    g.set_outputs([values[-1], values[int(rng.integers(1, len(values)))]])
    plan = fuse(g, lambda graph, node: cats[node.name])
    seen: set[str] = set()
    available = set(g.inputs)
    index_of = {n.name: i for i, n in enumerate(g.nodes)}
    for group in plan.groups:
        members = [n.name for n in group.nodes]
        assert not seen & set(members)
        seen |= set(members)
        kinds = [cats[m] for m in members]
        assert kinds.count(Category.COMPLEX_OUT_FUSABLE) <= 1
        assert Category.OPAQUE not in kinds or len(kinds) == 1
        assert group.category == max(kinds) and cats[group.anchor.name] == group.category
        assert members == sorted(members, key=index_of.__getitem__)
        assert set(group.inputs) <= available  # groups in a topological order, no cycles
        available |= set(group.outputs)
        read_outside = {v for n in g.nodes if n.name not in members for v in n.inputs}
        for v in (o for n in group.nodes for o in n.outputs):
            assert (v in group.outputs) == (v in read_outside or v in g.outputs)
    assert seen == set(cats)

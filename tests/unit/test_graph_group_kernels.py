"""Fused injective / reduction groups as kernels: built with gcc, run, checked against numpy.

Each graph is fused; every group whose anchor is injective or a reduction becomes one kernel
(`compiler.graph.group_kernel`), all kernels of a test go into one shared object, and each runs
on seeded random inputs against `run_reference` of the same nodes as a graph of their own.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from compiler import toolchain, zoo
from compiler.build import Kernel, build_source_many
from compiler.frontend.onnx import from_onnx
from compiler.graph import Category, Graph, GraphError, get_op, op_names, run_reference
from compiler.graph import passes as P
from compiler.graph.group_kernel import group_kernel
from compiler.graph.passes.fuse import FusedGroup, FusionPlan
from compiler.graph.passes.rewrite import add_op
from compiler.graph.te_ops import TE_COMPUTES
from compiler.lower import lower
from compiler.schedule.schedule import Schedule
from compiler.te.tensor import Tensor

pytestmark = pytest.mark.usefixtures("build_cache")

RTOL = ATOL = 1e-5


# -- running groups -------------------------------------------------------------------------------


def fusible_groups(plan: FusionPlan) -> list[FusedGroup]:
    return [g for g in plan.groups if g.category <= Category.REDUCTION]


def subgraph(graph: Graph, group: FusedGroup) -> Graph:
    """The group's nodes as a graph: its non-constant inputs are graph inputs."""
    sub = Graph(f"group{group.index}")
    for v in group.inputs:
        if v in graph.constants:
            sub.add_constant(v, graph.constants[v])
        else:
            t = graph.type_of(v)
            sub.add_input(v, t.shape, t.dtype)
    for n in group.nodes:
        sub.add_node(
            n.op, n.inputs, [graph.type_of(o) for o in n.outputs], n.attrs, n.name, n.outputs
        )
    sub.set_outputs(group.outputs)
    return sub


def random_value(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(-20, 20, size=shape).astype(dtype)
    return (rng.standard_normal(shape) * 2).astype(dtype)


def as_kernel_array(value: np.ndarray) -> np.ndarray:
    """A bool array as the C ints kernels use; others contiguous as they are."""
    return np.ascontiguousarray(value.astype(np.int32) if value.dtype == bool else value)


def run_groups(plan: FusionPlan, groups: list[FusedGroup], seed: int = 0) -> int:
    """Build every group into one shared object, run each, compare; the number of kernels."""
    graph = plan.graph
    built: list[tuple[FusedGroup, Schedule, list[Tensor], list[np.ndarray | None]]] = []
    for group in groups:
        sch, args, values = group_kernel(plan, group)
        built.append((group, sch, args, values))
    kernels = [Kernel(sch, args, f"group{g.index}") for g, sch, args, _ in built]
    lib = ctypes.CDLL(str(toolchain.compile_shared(build_source_many(kernels)).path))
    rng = np.random.default_rng(seed)
    for group, _, args, values in built:
        sub = subgraph(graph, group)
        inputs: dict[str, np.ndarray] = {}
        for v in sub.inputs:
            t = sub.type_of(v)
            inputs[v] = random_value(t.shape, t.dtype, rng)
        expected = run_reference(sub, inputs)
        arrays = [
            as_kernel_array(inputs[v] if value is None else value)
            for v, value in zip(group.inputs, values, strict=False)
        ]
        outs = [
            np.zeros(t.shape, np.int32 if t.dtype == "bool" else t.dtype)
            for t in args[len(arrays) :]
        ]
        fn = lib[f"group{group.index}"]
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = ctypes.c_int32
        pointers = [a.ctypes.data for a in [*arrays, *outs]]
        assert fn((ctypes.c_void_p * len(pointers))(*pointers)) == 0
        for name, got, want in zip(group.outputs, outs, expected, strict=True):
            what = f"group #{group.index} {group.ops} output {name}"
            if want.dtype == bool:
                got = got != 0
            assert got.shape == want.shape, what
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)
    return len(built)


def run_graph(g: Graph, seed: int = 0) -> int:
    """Fuse `g`, whose groups must all be injective or reductions, and check every group."""
    plan = P.fuse(g)
    assert fusible_groups(plan) == plan.groups
    return run_groups(plan, plan.groups, seed)


# -- graph building helpers -----------------------------------------------------------------------

RNG = np.random.default_rng(7)


def op(g: Graph, name: str, inputs: list[str], **attrs: Any) -> str:
    return add_op(g, name, inputs, attrs)[0]


def scalar(g: Graph, name: str, value: float, dtype: str = "float32") -> str:
    return g.add_constant(name, np.array(value, dtype))


def const(g: Graph, name: str, shape: tuple[int, ...], low: float | None = None) -> str:
    value = RNG.standard_normal(shape) if low is None else RNG.uniform(low, low + 2.0, shape)
    return g.add_constant(name, value.astype(np.float32))


# -- small graphs ---------------------------------------------------------------------------------


def test_every_injective_and_reduction_op_has_a_te_compute() -> None:
    # `compiler.graph.passes`, imported above, registers the NCHW[x]c ops too.
    wanted = {n for n in op_names() if get_op(n).category <= Category.REDUCTION}
    assert "max_pool2d_nchwc" in wanted and "layout_transform" in wanted
    assert wanted <= set(TE_COMPUTES), sorted(wanted - set(TE_COMPUTES))


def test_elementwise_chain_with_broadcasting() -> None:
    g = Graph("elementwise")
    x = g.add_input("x", (2, 3, 24))
    y = g.add_input("y", (3, 1))
    b = const(g, "b", (24,))
    v = op(g, "add", [x, b])
    v = op(g, "mul", [v, y])
    v = op(g, "sub", [v, scalar(g, "half", 0.5)])
    v = op(g, "relu", [op(g, "leaky_relu", [v], alpha=0.1)])
    v = op(g, "maximum", [op(g, "hard_swish", [v]), op(g, "sigmoid", [x])])
    v = op(g, "div", [v, const(g, "d", (1, 3, 1), low=1.0)])
    v = op(g, "minimum", [op(g, "tanh", [v]), op(g, "clip", [x], min=-0.5, max=None)])
    v = op(g, "pow", [op(g, "abs", [v]), scalar(g, "p", 1.5)])
    v = op(g, "sqrt", [op(g, "exp", [op(g, "neg", [v])])])
    v = op(g, "reciprocal", [op(g, "add", [v, scalar(g, "one", 1.0)])])
    v = op(g, "add", [v, op(g, "hard_sigmoid", [x])])
    v = op(g, "gelu", [op(g, "gelu", [v], approximate="tanh")])
    g.set_outputs([v])
    assert run_graph(g) == 1


def test_comparisons_select_and_casts() -> None:
    g = Graph("compare")
    x = g.add_input("x", (4, 16))
    y = g.add_input("y", (16,))
    big = op(g, "greater", [x, y])
    small = op(g, "less", [x, scalar(g, "zero", 0.0)])
    v = op(g, "where", [big, x, op(g, "where", [small, y, x])])
    n = op(g, "cast", [op(g, "mul", [v, scalar(g, "ten", 10.0)])], dtype="int32")
    same = op(g, "equal", [n, scalar(g, "three", 3, "int32")])
    back = op(g, "cast", [n], dtype="float32")
    flag = op(g, "cast", [op(g, "sub", [x, y])], dtype="bool")
    g.set_outputs([same, back, flag, op(g, "cast", [flag], dtype="float32")])
    assert run_graph(g) >= 1


def test_reshape_transpose_expand_chains() -> None:
    g = Graph("shapes")
    x = g.add_input("x", (2, 3, 4, 5))
    v = op(g, "reshape", [x], shape=(6, 20))
    v = op(g, "transpose", [v], perm=(1, 0))
    v = op(g, "reshape", [v], shape=(4, 5, 3, 2))
    v = op(g, "transpose", [v], perm=(2, 0, 3, 1))
    v = op(g, "reshape", [v], shape=(1, 120, 1))
    v = op(g, "expand", [op(g, "reshape", [v], shape=(2, 1, 60))], shape=(2, 3, 60))
    g.set_outputs([op(g, "add", [v, op(g, "reshape", [x], shape=(2, 1, 60))])])
    assert run_graph(g) == 1


def test_concat_slice_split_pad_gather() -> None:
    g = Graph("moves")
    x = g.add_input("x", (2, 5, 6))
    y = g.add_input("y", (2, 3, 6))
    c = op(g, "concat", [x, y, x], axis=1)  # (2, 13, 6)
    s = op(g, "slice", [c], starts=(1, -2), ends=(12, 0), axes=(1, 2), steps=(3, -2))
    parts = add_op(g, "split", [c], {"axis": 1, "sizes": (4, 9)})
    outs = [s, parts[1]]
    for mode, pads in (
        ("constant", (0, 1, 2, 0, 2, -1)),
        ("reflect", (0, 2, 1, 0, 1, 3)),
        ("edge", (1, 0, 2, 0, 3, 1)),
        ("wrap", (0, 3, 0, 1, 0, 7)),
    ):
        outs.append(op(g, "pad", [op(g, "relu", [parts[0]])], pads=pads, mode=mode, value=1.5))
    idx = g.add_constant("idx", np.array([[0, -1], [3, 2]], np.int64))
    outs.append(op(g, "gather", [op(g, "exp", [x]), idx], axis=2))
    outs.append(op(g, "gather", [x, g.add_constant("i0", np.array(-2, np.int64))], axis=1))
    g.set_outputs(outs)
    assert run_graph(g) >= 1


def test_softmax_layer_norm_and_reductions() -> None:
    g = Graph("norms")
    x = g.add_input("x", (2, 3, 16))
    w = g.add_input("w", (2, 5, 3, 7))
    outs = [
        op(g, "softmax", [op(g, "mul", [x, scalar(g, "k", 8.0)])], axis=-1),
        op(g, "softmax", [w], axis=1),
        op(
            g,
            "layer_norm",
            [x, const(g, "s1", (16,)), const(g, "b1", (16,))],
            axis=-1,
            epsilon=1e-5,
        ),
        op(
            g,
            "layer_norm",
            [w, const(g, "s2", (1, 7)), const(g, "b2", (3, 7))],
            axis=1,
            epsilon=1e-3,
        ),
        op(g, "reduce_sum", [w], axes=(1, 3), keepdims=True),
        op(g, "reduce_mean", [op(g, "sigmoid", [w])], axes=(0,), keepdims=False),
        op(g, "reduce_max", [x], axes=(), keepdims=False),
        op(g, "reduce_mean", [x], axes=(-1,), keepdims=True),
    ]
    g.set_outputs(outs)
    assert run_graph(g) == len(outs)


def test_batch_norm_and_the_erf_gelu_chain() -> None:
    g = Graph("gelu")
    x = g.add_input("x", (2, 4, 3, 8))
    params = [const(g, n, (4,)) for n in ("scale", "bias", "mean")]
    bn = op(g, "batch_norm", [x, *params, const(g, "var", (4,), low=0.5)], epsilon=1e-5)
    half = op(g, "div", [bn, scalar(g, "sqrt2", np.sqrt(2.0))])
    erf = op(g, "add", [op(g, "erf", [half]), scalar(g, "one", 1.0)])
    gelu = op(g, "mul", [op(g, "mul", [bn, erf]), scalar(g, "h", 0.5)])
    g.set_outputs([gelu])
    assert run_graph(g) == 1


POOLS: list[tuple[str, dict[str, Any]]] = [
    ("max_pool2d", {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    (
        "max_pool2d",
        {
            "kernel": (2, 3),
            "strides": (2, 1),
            "pads": (0, 1, 1, 0),
            "ceil_mode": True,
            "dilations": (2, 1),
        },
    ),
    ("avg_pool2d", {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    (
        "avg_pool2d",
        {
            "kernel": (3, 2),
            "strides": (2, 2),
            "pads": (1, 0, 1, 1),
            "count_include_pad": True,
            "ceil_mode": True,
        },
    ),
    (
        "avg_pool2d",
        {
            "kernel": (2, 2),
            "strides": (1, 2),
            "pads": (0, 0, 0, 0),
            "dilations": (2, 1),
            "count_include_pad": True,
        },
    ),
    ("global_avg_pool2d", {}),
]


@pytest.mark.parametrize("blocked", [False, True], ids=["nchw", "nchwc"])
def test_pools(blocked: bool) -> None:
    g = Graph("pools")
    x = g.add_input("x", (1, 32, 9, 8))
    src = op(g, "layout_transform", [x], src_layout="NCHW", dst_layout="NCHW16c") if blocked else x
    outs = []
    for name, attrs in POOLS:
        y = op(g, f"{name}_nchwc" if blocked else name, [op(g, "relu", [src])], **attrs)
        if blocked:
            y = op(g, "layout_transform", [y], src_layout="NCHW16c", dst_layout="NCHW8c")
        outs.append(y)
    g.set_outputs(outs)
    assert run_graph(g) >= len(POOLS)


# -- models ---------------------------------------------------------------------------------------


def model_plan(name: str, **kw: int) -> FusionPlan:
    g = from_onnx(zoo.build(name, **kw))
    return P.fuse(P.to_nchwc(P.fold_batch_norm(g)))


def test_bert_tiny_groups() -> None:
    plan = model_plan("bert_tiny", seq=16)
    groups = fusible_groups(plan)
    assert {n.op for gr in groups for n in gr.nodes} >= {"layer_norm", "softmax", "add"}
    assert run_groups(plan, groups, seed=1) == len(groups) == 7


def test_resnet18_groups() -> None:
    plan = model_plan("resnet18", image=32)
    groups = fusible_groups(plan)
    ops = {n.op for gr in groups for n in gr.nodes}
    assert ops >= {"max_pool2d_nchwc", "global_avg_pool2d_nchwc", "layout_transform"}
    assert run_groups(plan, groups, seed=2) == len(groups)


# -- schedule and errors --------------------------------------------------------------------------


def test_default_schedule_inlines_attaches_and_vectorizes() -> None:
    g = Graph("sched")
    x = g.add_input("x", (4, 8, 32))
    v = op(g, "softmax", [op(g, "add", [x, const(g, "b", (32,))])], axis=-1)
    g.set_outputs([v])
    plan = P.fuse(g)
    sch, args, values = group_kernel(plan, plan.groups[0])
    assert [a.name for a in args] == ["x", "b", v] and values[0] is None
    assert values[1] is g.constants["b"]
    kinds = {s.name: s.attach for s in sch.stages}
    assert kinds[f"{v}.exp"] == "inline" and kinds[f"{v}.max"] == "at" == kinds[f"{v}.sum"]
    text = str(lower(sch, args, "k"))
    assert "vectorized(16)" in text and "x.add" not in text


def test_groups_it_cannot_compile_name_their_ops() -> None:
    g = Graph("bad")
    x = g.add_input("x", (2, 8))
    ids = g.add_input("ids", (3,), "int64")
    y = op(g, "relu", [op(g, "dense", [x, const(g, "w", (8, 4))])])
    z = op(g, "gather", [x, ids], axis=1)
    g.set_outputs([y, z])
    plan = P.fuse(g)
    for group in plan.groups:
        with pytest.raises(GraphError, match=r"dense|gather"):
            group_kernel(plan, group)


def test_large_outputs_get_a_parallel_loop_with_their_reductions_inside() -> None:
    g = Graph("large")
    x = g.add_input("x", (4, 64, 128))
    y = g.add_input("y", (2, 3, 64, 96))
    soft = op(g, "softmax", [x], axis=-1)  # rows aligned with the fused (4 x 64) loop
    norm = op(g, "layer_norm", [y, const(g, "s", (96,)), const(g, "b", (96,))], axis=2)
    g.set_outputs([soft, norm])
    plan = P.fuse(g)
    for group in plan.groups:
        sch, args, _ = group_kernel(plan, group)
        text = str(lower(sch, args, "k"))
        assert "parallel(" in text and "vectorized(16)" in text
        assert all(s.attach in ("at", "inline") for s in sch.stages if s.tensor not in args)
    assert run_graph(g) == 2


def test_row_softmax_and_layer_norm_reduce_per_lane_then_across_the_lanes() -> None:
    g = Graph("lanes")
    x = g.add_input("x", (3, 5, 48))  # 48 = 3 x 16 lanes
    y = g.add_input("y", (6, 24))  # 24 = 3 x 8 lanes
    z = g.add_input("z", (4, 13))  # no lane count divides 13: one reduction loop
    soft = op(g, "softmax", [op(g, "mul", [x, scalar(g, "k", 30.0)])], axis=-1)
    norm = op(g, "layer_norm", [y, const(g, "s", (24,)), const(g, "b", (24,))], axis=-1)
    odd = op(g, "softmax", [z], axis=-1)
    g.set_outputs([soft, norm, odd])
    plan = P.fuse(g)
    lanes = {}
    for group in plan.groups:
        sch, args, _ = group_kernel(plan, group)
        text = str(lower(sch, args, "k"))
        lanes[group.outputs[0]] = [s.name for s in sch.stages if s.name.endswith(".lanes")]
        if group.outputs[0] != odd:
            assert text.count("vectorized(") >= 3  # the lane partials and the output
    assert lanes[soft] == [f"{soft}.max.lanes", f"{soft}.sum.lanes"]
    assert lanes[norm] == [f"{norm}.mean.lanes", f"{norm}.var.lanes"]
    assert lanes[odd] == []
    assert run_graph(g) == 3

"""Zero-size tensors and the reductions: empty results and reductions over empty sets fold into
constants (ONNX's identities) at import and in `fold_constants`, so no kernel sees an empty
tensor; a model with empty inputs or outputs builds and runs; ReduceMin / ReduceProd and bool
ReduceMax / ReduceMin compile to kernels that match numpy."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from model_runtime import ModelRunner
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler.frontend import from_onnx
from compiler.graph import Graph, GraphError, TensorType, get_op, run_reference
from compiler.graph import passes as P
from compiler.graph.build_model import build_model
from compiler.graph.ops_reduce import REDUCTIONS, reduction_identity
from compiler.graph.passes.rewrite import add_op

pytestmark = pytest.mark.usefixtures("build_cache")

RNG = np.random.default_rng(3)


def one_node_model(
    op: str,
    inputs: dict[str, np.ndarray],
    consts: dict[str, np.ndarray],
    outputs: list[str],
    opset: int = 18,
    **attrs: Any,
) -> onnx.ModelProto:
    """A model of one `op` node reading `inputs` (graph inputs) then `consts` (initializers);
    an empty name in `consts` is an omitted optional input."""
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in inputs.items()
    ]
    inits = [numpy_helper.from_array(v, n) for n, v in consts.items() if n]
    node = helper.make_node(op, [*inputs, *consts], outputs, name="n0", **attrs)
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    graph = helper.make_graph([node], "zero", graph_inputs, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def onnx_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's empty-slice and log(0) warnings
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def import_and_check(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> tuple[Graph, list[np.ndarray]]:
    """The imported graph and its reference outputs, which must equal onnx's."""
    graph = from_onnx(model)
    got = run_reference(graph, feeds)
    want = onnx_reference(model, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g, w)
        np.testing.assert_allclose(g, w, rtol=1e-6)
    return graph, got


def build_and_run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ModelRunner(build_model(graph)).run(feeds)


# -- the reductions' type rules and references ----------------------------------------------------


@pytest.mark.parametrize(
    ("op", "dtype", "want"),
    [
        ("reduce_sum", "float32", 0.0),
        ("reduce_prod", "int32", 1),
        ("reduce_max", "float32", -np.inf),
        ("reduce_max", "int64", np.iinfo(np.int64).min),
        ("reduce_max", "bool", False),
        ("reduce_min", "float16", np.inf),
        ("reduce_min", "int32", np.iinfo(np.int32).max),
        ("reduce_min", "bool", True),
    ],
)
def test_a_reduction_over_an_empty_set_is_its_identity(op: str, dtype: str, want: Any) -> None:
    x = np.zeros((2, 0, 3), dtype)
    (y,) = get_op(op).reference([x], {"axes": (1,), "keepdims": True})
    assert y.shape == (2, 1, 3) and y.dtype == np.dtype(dtype)
    assert (y == np.asarray(want, dtype)).all()
    (none,) = get_op(op).reference([x], {"axes": (2,), "keepdims": False})
    assert none.shape == (2, 0)


def test_the_mean_of_nothing_is_nan_for_floats_and_an_error_for_ints() -> None:
    (y,) = get_op("reduce_mean").reference([np.zeros((0, 2), np.float32)], {"axes": (0,)})
    assert y.shape == (1, 2) and np.isnan(y).all()
    with pytest.raises(GraphError, match="reduce_mean: the mean of an empty set of int32"):
        reduction_identity("reduce_mean", "int32")


NUMPY: dict[str, Callable[..., Any]] = {
    "reduce_sum": np.sum,
    "reduce_mean": np.mean,
    "reduce_prod": np.prod,
    "reduce_max": np.max,
    "reduce_min": np.min,
}


@pytest.mark.parametrize("op", REDUCTIONS)
def test_reductions_match_numpy_on_data(op: str) -> None:
    x = RNG.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)
    (y,) = get_op(op).reference([x], {"axes": (0, 2), "keepdims": False})
    np.testing.assert_allclose(y, NUMPY[op](x, axis=(0, 2)), rtol=1e-6)


def test_only_max_and_min_take_bool_data() -> None:
    flags = TensorType((2, 3), "bool")
    for op in ("reduce_max", "reduce_min"):
        (t,) = get_op(op).infer([flags], {"axes": (1,), "keepdims": False})
        assert t == TensorType((2,), "bool")
    for op in ("reduce_sum", "reduce_prod", "reduce_mean"):
        with pytest.raises(GraphError, match=f"{op}: bool data is not supported"):
            get_op(op).infer([flags], {})


# -- import: empty values are constants -----------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        ("ReduceSum", np.float32),
        ("ReduceMax", np.float32),
        ("ReduceMax", np.bool_),
        ("ReduceMin", np.int32),
        ("ReduceProd", np.float32),
        ("ReduceL1", np.float32),
        ("ReduceL2", np.float32),
        ("ReduceSumSquare", np.float32),
        ("ReduceLogSum", np.float32),
        ("ReduceLogSumExp", np.float32),
    ],
)
def test_a_reduction_of_an_empty_input_imports_as_a_constant(op: str, dtype: Any) -> None:
    x = np.zeros((2, 0, 4), dtype)
    model = one_node_model(op, {"x": x}, {"axes": np.asarray([1], np.int64)}, ["y"], keepdims=1)
    graph, (y,) = import_and_check(model, {"x": x})
    assert not graph.nodes and graph.outputs == ["y"] and y.shape == (2, 1, 4)


def test_empty_results_of_shape_ops_are_constants_with_no_nodes() -> None:
    x = RNG.standard_normal((20, 10, 5)).astype(np.float32)
    ints = {"s": np.asarray([1000], np.int64), "e": np.asarray([1000], np.int64)}
    model = one_node_model("Slice", {"x": x}, {**ints, "a": np.asarray([1], np.int64)}, ["y"])
    graph, (y,) = import_and_check(model, {"x": x})
    assert not graph.nodes and y.shape == (20, 0, 5)

    model = one_node_model("Shape", {"x": x}, {}, ["y"], start=2, end=1)
    graph, (y,) = import_and_check(model, {"x": x})
    assert not graph.nodes and y.shape == (0,) and y.dtype == np.int64

    empty = np.zeros((0, 3, 4), np.float32)
    target = {"shape": np.asarray([3, 4, 0], np.int64)}
    model = one_node_model("Reshape", {"x": empty}, target, ["y"], allowzero=1)
    graph, (y,) = import_and_check(model, {"x": empty})
    assert not graph.nodes and y.shape == (3, 4, 0)

    zeros = {"shape": np.asarray([0], np.int64)}
    value = numpy_helper.from_array(np.asarray([7], np.int32), "v")
    model = one_node_model("ConstantOfShape", {}, zeros, ["y"], value=value)
    graph, (y,) = import_and_check(model, {})
    assert not graph.nodes and y.shape == (0,) and y.dtype == np.int32


def test_split_with_empty_pieces_cuts_only_the_others() -> None:
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    sizes = {"split": np.asarray([0, 4, 0, 2], np.int64)}
    model = one_node_model("Split", {"x": x}, sizes, ["a", "b", "c", "d"], axis=1)
    graph, outs = import_and_check(model, {"x": x})
    assert [n.op for n in graph.nodes] == ["split"]
    assert graph.nodes[0].attrs["sizes"] == [4, 2]
    assert [o.shape for o in outs] == [(3, 0), (3, 4), (3, 0), (3, 2)]
    got = build_and_run(graph, {"x": x})
    for g, w in zip(got, outs, strict=True):
        np.testing.assert_array_equal(g, w)


def test_concat_leaves_empty_pieces_out() -> None:
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    empty = np.zeros((2, 0), np.float32)
    model = one_node_model("Concat", {"x": x, "e": empty}, {}, ["y"], axis=1)
    graph, (y,) = import_and_check(model, {"x": x, "e": empty})
    np.testing.assert_array_equal(y, x)
    (node,) = graph.nodes
    assert node.op == "concat" and node.inputs == ["x"]
    np.testing.assert_array_equal(build_and_run(graph, {"x": x, "e": empty})[0], x)


# -- fold_constants: empty values are known --------------------------------------------------------


def test_fold_constants_folds_what_reads_or_writes_nothing() -> None:
    g = Graph("empty")
    x = g.add_input("x", (0, 3))
    w = g.add_input("w", (1, 3))
    (top,) = add_op(g, "reduce_max", [x], {"axes": (0,)})
    (s,) = add_op(g, "add", [top, w])
    (e,) = add_op(g, "relu", [x])
    g.set_outputs([s, e])
    folded = P.fold_constants(g)
    assert [n.op for n in folded.nodes] == ["add"]
    assert (folded.constants[top] == -np.inf).all() and folded.constants[e].shape == (0, 3)
    feeds = {"x": np.zeros((0, 3), np.float32), "w": np.ones((1, 3), np.float32)}
    got = build_and_run(g, feeds)
    want = run_reference(g, feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_model_whose_only_output_is_empty_builds_and_runs() -> None:
    x = np.zeros((2, 0, 4), np.float32)
    model = one_node_model("Identity", {"x": x}, {}, ["y"])
    graph = from_onnx(model)
    built = build_model(graph)
    assert [s.shape for s in built.outputs] == [(2, 0, 4)]
    (y,) = ModelRunner(built).run({"x": x})
    assert y.shape == (2, 0, 4)


# -- compiled reductions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "dtype", "attrs"),
    [
        ("ReduceProd", np.float32, {"keepdims": 1}),
        ("ReduceProd", np.int32, {"keepdims": 0}),
        ("ReduceMin", np.float32, {"keepdims": 0}),
        ("ReduceMin", np.int64, {"keepdims": 1}),
        ("ReduceMax", np.bool_, {"keepdims": 1}),
        ("ReduceMin", np.bool_, {"keepdims": 0}),
    ],
)
def test_compiled_reductions_match_onnx(op: str, dtype: Any, attrs: dict[str, int]) -> None:
    if dtype == np.bool_:
        x = RNG.random((3, 4, 5)) < 0.7
    elif np.issubdtype(dtype, np.integer):
        x = RNG.integers(-3, 4, (3, 4, 5)).astype(dtype)
    else:
        x = RNG.uniform(0.5, 1.5, (3, 4, 5)).astype(dtype)
    model = one_node_model(op, {"x": x}, {"axes": np.asarray([0, -1], np.int64)}, ["y"], **attrs)
    graph, (want,) = import_and_check(model, {"x": x})
    assert [n.op for n in graph.nodes] == [f"reduce_{op.removeprefix('Reduce').lower()}"]
    (got,) = build_and_run(graph, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5)

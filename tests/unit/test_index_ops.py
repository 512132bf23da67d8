"""ArgMax, ArgMin, TopK, Hardmax, CumSum, Trilu, EyeLike, OneHot, GatherElements and
MeanVarianceNormalization: imported, run with the graph's numpy references and compiled into a
model, against onnx's ReferenceEvaluator (numpy where NaN or wide indices go past it); the
type rules and converters refuse what they cannot do, naming the op and the problem."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_runtime import ModelRunner
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler.frontend.onnx import OnnxImportError, from_onnx
from compiler.graph import Graph, GraphError, TensorType, get_op, run_reference
from compiler.graph.build_model import build_model
from compiler.graph.passes.fuse import fuse
from compiler.graph.registry import Category

pytestmark = pytest.mark.usefixtures("build_cache")

RNG = np.random.default_rng(23)


def one_node(
    op: str,
    inputs: dict[str, np.ndarray],
    consts: dict[str, np.ndarray] | None = None,
    outputs: tuple[str, ...] = ("y",),
    opset: int = 21,
    **attrs: Any,
) -> onnx.ModelProto:
    """A model of one `op` node reading `inputs` (graph inputs), then `consts` (initializers)."""
    consts = consts or {}
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in inputs.items()
    ]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()]
    node = helper.make_node(op, [*inputs, *consts], list(outputs), name="n0", **attrs)
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    graph = helper.make_graph([node], op.lower(), graph_inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def onnx_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def compiled(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ModelRunner(build_model(graph)).run(feeds)


def assert_same(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 0.0) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


def check(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    want: list[np.ndarray] | None = None,
    rtol: float = 0.0,
) -> Graph:
    """The graph's numpy references and the compiled model give `want` (onnx's outputs)."""
    want = onnx_outputs(model, feeds) if want is None else want
    graph = from_onnx(model)
    assert_same(run_reference(graph, feeds), want, rtol)
    assert_same(compiled(graph, feeds), want, rtol)
    return graph


def ties(*shape: int, dtype: Any = np.float32, values: int = 5) -> np.ndarray:
    """Random data with many equal values (so the order of ties is tested)."""
    return RNG.integers(-values, values, shape).astype(dtype)


# -- ArgMax / ArgMin ------------------------------------------------------------------------------

ARG_CASES: dict[str, tuple[str, np.ndarray, dict[str, Any]]] = {
    # name: (op, data, attributes)
    "max-middle-axis-keepdims": ("ArgMax", ties(3, 40, 24), {"axis": 1}),
    "min-last-axis-last-index": (
        "ArgMin",
        ties(64, 33, dtype=np.int32),
        {"axis": -1, "keepdims": 0, "select_last_index": 1},
    ),
    "max-1d-to-scalar": ("ArgMax", RNG.normal(size=700), {"keepdims": 0}),
    "min-uint8-first-axis": ("ArgMin", ties(5, 6, 16, dtype=np.uint8) + 5, {"axis": 0}),
    "max-wide-output-last-index": (
        "ArgMax",
        ties(256, 5, 160),
        {"axis": 1, "select_last_index": 1},
    ),
}


@pytest.mark.parametrize("case", sorted(ARG_CASES))
def test_arg_matches_onnx(case: str) -> None:
    op, x, attrs = ARG_CASES[case]
    check(one_node(op, {"x": x}, **attrs), {"x": x})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_with_nan_and_infinity_matches_numpy(op: str, last: int) -> None:
    """A NaN wins, as numpy's argmax and argmin let it; a row of -inf (+inf) still finds one."""
    x = ties(6, 9)
    x[0, 3] = x[0, 7] = np.nan
    x[1, :] = -np.inf if op == "ArgMax" else np.inf
    x[2, :] = np.nan
    x[3, 2] = np.inf if op == "ArgMax" else -np.inf
    find = np.argmax if op == "ArgMax" else np.argmin
    want = 8 - find(x[:, ::-1], axis=1) if last else find(x, axis=1)
    model = one_node(op, {"x": x}, axis=1, keepdims=0, select_last_index=last)
    check(model, {"x": x}, [want.astype(np.int64)])


# -- TopK ------------------------------------------------------------------------------------------

TOPK_CASES: dict[str, tuple[np.ndarray, int, dict[str, Any]]] = {
    # name: (data, k, attributes)
    "largest-middle-axis-ties": (ties(3, 20, 17), 5, {"axis": 1}),
    "smallest-last-axis": (ties(4, 33), 7, {"largest": 0}),
    "int64-all-of-first-axis": (ties(6, 9, dtype=np.int64, values=2), 6, {"axis": 0}),
    "uint64-near-max": (
        np.array([[2**64 - 1, 3, 2**63, 2**64 - 2], [0, 7, 7, 1]], np.uint64),
        3,
        {"axis": 1},
    ),
    "float64-unsorted-flag": (RNG.normal(size=(5, 40)), 4, {"axis": -1, "sorted": 0}),
}


@pytest.mark.parametrize("case", sorted(TOPK_CASES))
def test_topk_matches_onnx(case: str) -> None:
    x, k, attrs = TOPK_CASES[case]
    model = one_node("TopK", {"x": x}, {"k": np.array([k], np.int64)}, ("v", "i"), **attrs)
    check(model, {"x": x})


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_with_nan_sorts_nan_above_numbers(largest: int) -> None:
    x = np.array([[1.0, np.nan, 3.0, np.nan, 3.0, -np.inf]], np.float32)
    order = [1, 3, 2, 4, 0, 5] if largest else [5, 0, 2, 4, 1, 3]
    k = np.array([6], np.int64)
    model = one_node("TopK", {"x": x}, {"k": k}, ("v", "i"), largest=largest)
    want: list[np.ndarray] = [x[:, order], np.array([order], np.int64)]
    check(model, {"x": x}, want)


# -- Hardmax ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_hardmax_matches_onnx(axis: int) -> None:
    x = ties(4, 5, 16, values=3)
    x[0, 0, :3] = np.nan  # the first NaN of a row wins (numpy's argmax)
    check(one_node("Hardmax", {"x": x}, axis=axis), {"x": x})


# -- CumSum ----------------------------------------------------------------------------------------

CUMSUM_CASES: dict[str, tuple[np.ndarray, int, dict[str, Any]]] = {
    # name: (data, axis, attributes)
    "float64-middle": (RNG.normal(size=(3, 10, 4)), 1, {}),
    "float64-middle-exclusive-reverse": (RNG.normal(size=(3, 10, 4)), -2, {"exclusive": 1, "reverse": 1}),
    "int64-1d-exclusive": (ties(50, dtype=np.int64), 0, {"exclusive": 1}),
    "uint32-last-reverse": (ties(2, 70, dtype=np.uint32) + 5, -1, {"reverse": 1}),
    "float32-wide-first-axis": (RNG.normal(size=(12, 4096)).astype(np.float32), 0, {}),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CUMSUM_CASES))
def test_cumsum_matches_onnx(case: str) -> None:
    x, axis, attrs = CUMSUM_CASES[case]
    model = one_node("CumSum", {"x": x}, {"axis": np.array(axis, np.int32)}, **attrs)
    check(model, {"x": x}, rtol=1e-5)


# -- Trilu -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -3, 2, 9, -(2**40)])
def test_trilu_matches_onnx(upper: int, k: int | None) -> None:
    x = ties(2, 5, 7, dtype=np.int64)
    consts = {} if k is None else {"k": np.array(k, np.int64)}
    check(one_node("Trilu", {"x": x}, consts, upper=upper), {"x": x})


def test_trilu_of_bool_and_wide_float() -> None:
    flags = RNG.random((6, 6)) < 0.5
    check(one_node("Trilu", {"x": flags}, {"k": np.array(1, np.int64)}), {"x": flags})
    x = RNG.normal(size=(3, 64, 64)).astype(np.float32)
    check(one_node("Trilu", {"x": x}, upper=0), {"x": x})


# -- EyeLike ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, attrs",
    [((3, 5), {"k": 2}), ((4, 4), {"k": -1, "dtype": TensorProto.DOUBLE}),
     ((2, 6), {"k": 7}), ((5, 3), {"dtype": TensorProto.BOOL})],
)  # fmt: skip
def test_eye_like_is_a_constant_matching_onnx(shape: tuple[int, int], attrs: dict) -> None:
    x = ties(*shape, dtype=np.int32)
    graph = check(one_node("EyeLike", {"x": x}, **attrs), {"x": x})
    assert not graph.nodes  # evaluated at import: its input's shape decides it


# -- OneHot ----------------------------------------------------------------------------------------

ONE_HOT_INDICES = np.array([[0, -1, 3, 7], [-8, 2, 8, -9], [5, 1, -4, 6]], np.int64)


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.int32])
def test_one_hot_matches_onnx(axis: int, dtype: Any) -> None:
    indices = ONE_HOT_INDICES.astype(dtype)
    values = np.array([-2.5, 4.0], np.float32)
    feeds = {"indices": indices, "values": values}
    model = one_node("OneHot", feeds, {"depth": np.array(8.0, np.float32)}, axis=axis)
    # depth sits between the graph inputs: put the feeds in the node's order
    node = model.graph.node[0]
    node.input[:] = ["indices", "depth", "values"]
    check(model, feeds)


def test_one_hot_wide_indices_do_not_wrap() -> None:
    """int8 -100 + depth 200 is 100 (not a wrapped int8); a uint64 index near 2**64 matches
    nothing."""
    depth = 200
    signed = np.array([-100, 127, -128, 5], np.int8)
    unsigned = np.array([2**64 - 1, 199, 0], np.uint64)
    values = np.array([0, 9], np.int32)
    for indices in (signed, unsigned):
        wide = indices.astype(np.float64)
        wide = np.where(wide < 0, wide + depth, wide)
        want = np.where(wide[:, None] == np.arange(depth)[None, :], 9, 0).astype(np.int32)
        model = one_node("OneHot", {"i": indices}, {"d": np.array(depth), "v": values})
        graph = from_onnx(model)
        assert_same(run_reference(graph, {"i": indices}), [want])
        assert_same(compiled(graph, {"i": indices}), [want])


# -- GatherElements --------------------------------------------------------------------------------


def test_gather_elements_matches_onnx() -> None:
    data = RNG.normal(size=(3, 4, 5)).astype(np.float32)
    indices = RNG.integers(-4, 4, (3, 7, 5)).astype(np.int64)
    check(one_node("GatherElements", {"x": data, "i": indices}, axis=1), {"x": data, "i": indices})


def test_gather_elements_with_indices_smaller_off_the_axis_matches_onnxruntime() -> None:
    """Smaller than data off the axis too (onnx's ReferenceEvaluator refuses that)."""
    smaller = RNG.integers(-3, 3, (2, 3)).astype(np.int32)
    ints = ties(3, 4, dtype=np.int64)
    model = one_node("GatherElements", {"x": ints}, {"i": smaller}, axis=0)
    typed = onnx.shape_inference.infer_shapes(model).SerializeToString()
    session = ort.InferenceSession(typed, providers=["CPUExecutionProvider"])
    check(model, {"x": ints}, [np.asarray(v) for v in session.run(None, {"x": ints})])


def test_gather_elements_kernel_clamps_bad_indices_into_the_axis() -> None:
    """ONNX calls an index outside [-n, n) an error: the kernel reads the nearest element
    instead of memory outside the data (an int64 index is clamped before it is narrowed)."""
    data = RNG.normal(size=(4, 3)).astype(np.float32)
    indices = np.array([[2**33 + 1, -(2**40), 5], [-4, 3, -1]], np.int64)
    graph = from_onnx(one_node("GatherElements", {"x": data, "i": indices}, axis=0))
    at = np.clip(np.where(indices < 0, indices + 4, indices), 0, 3)
    assert_same(compiled(graph, {"x": data, "i": indices}), [np.take_along_axis(data, at, 0)])


def test_gather_elements_of_argmax_fuses_and_matches_numpy() -> None:
    """x.take_along_axis(argmax(relu(x))): computed indices read inside fused kernels."""
    x = RNG.normal(size=(8, 6, 32)).astype(np.float32)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("ArgMax", ["r"], ["a"], axis=1),
        helper.make_node("GatherElements", ["x", "a"], ["y"], axis=1),
    ]
    graph_proto = helper.make_graph(
        nodes,
        "take",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    want = np.take_along_axis(x, np.argmax(np.maximum(x, 0), axis=1)[:, None], axis=1)
    graph = check(model, {"x": x}, [want])
    plan = fuse(graph)
    assert any(g.ops == ("relu", "argmax") for g in plan.groups), [g.ops for g in plan.groups]


def test_index_ops_after_a_convolution_match_onnx() -> None:
    """Read in NCHW what the layout pass blocked (NCHW[x]c) for the convolution."""
    x = RNG.normal(size=(1, 8, 6, 6)).astype(np.float32)
    w = numpy_helper.from_array(RNG.normal(size=(16, 8, 1, 1)).astype(np.float32), "w")
    k = numpy_helper.from_array(np.array([3], np.int64), "k")
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("ArgMax", ["c"], ["a"], axis=1),
        helper.make_node("TopK", ["c", "k"], ["v", "i"], axis=1),
        helper.make_node("CumSum", ["c", "axis"], ["s"]),
        helper.make_node("Hardmax", ["c"], ["h"], axis=1),
    ]
    outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in "avish"]
    graph_proto = helper.make_graph(
        nodes,
        "conv_index",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        outputs,
        [w, k, axis],
    )
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    check(model, {"x": x}, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.uint16, np.int32, np.float64])
def test_compiled_kernels_match_the_references_across_dtypes(dtype: Any) -> None:
    x = ties(3, 8, 16, dtype=dtype, values=4 if np.dtype(dtype).kind == "u" else 2)
    i = RNG.integers(-8, 8, (3, 5, 16)).astype(np.int64)
    nodes = [
        helper.make_node("ArgMin", ["x"], ["a"], axis=1, select_last_index=1),
        helper.make_node("TopK", ["x", "k"], ["v", "vi"], axis=-1, largest=0),
        helper.make_node("CumSum", ["x", "axis"], ["s"], exclusive=1),
        helper.make_node("Trilu", ["x"], ["t"]),
        helper.make_node("GatherElements", ["x", "i"], ["g"], axis=1),
        helper.make_node("OneHot", ["a", "depth", "x16"], ["o"], axis=1),
    ]
    consts = {
        "k": np.array([4], np.int64),
        "axis": np.array(1, np.int64),
        "depth": np.array(8, np.int64),
        "x16": np.array([3, 1], dtype),
    }
    names = ("a", "v", "vi", "s", "t", "g", "o")
    graph_proto = helper.make_graph(
        nodes,
        "dtypes",
        [
            helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape),
            helper.make_tensor_value_info("i", TensorProto.INT64, i.shape),
        ],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in names],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 21)])
    graph = from_onnx(model)
    feeds = {"x": x, "i": i}
    assert_same(compiled(graph, feeds), run_reference(graph, feeds), rtol=1e-3)


# -- MeanVarianceNormalization ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, axes, dtype",
    [((2, 3, 4, 5), None, np.float32), ((3, 6, 2), [1], np.float64), ((4, 8), [0, 1], np.float32)],
)
def test_mean_variance_normalization_matches_onnx(
    shape: tuple[int, ...], axes: list[int] | None, dtype: Any
) -> None:
    """Against ONNX's function body, in numpy (onnx's evaluator runs it for float32 only)."""
    x = RNG.normal(1.0, 2.0, shape).astype(dtype)
    over = tuple(axes or (0, 2, 3))
    mean = x.mean(axis=over, keepdims=True)
    std = np.sqrt((x * x).mean(axis=over, keepdims=True) - mean * mean)
    want = ((x - mean) / (std + 1e-9)).astype(dtype)
    attrs: dict[str, Any] = {} if axes is None else {"axes": axes}
    model = one_node("MeanVarianceNormalization", {"x": x}, **attrs)
    if dtype == np.float32:
        assert_same(onnx_outputs(model, {"x": x}), [want], rtol=1e-5)
    check(model, {"x": x}, [want], rtol=1e-4)


# -- the graph ops ---------------------------------------------------------------------------------


def test_categories() -> None:
    for op in ("argmax", "argmin", "topk", "hardmax", "cumsum"):
        assert get_op(op).category is Category.REDUCTION
    for op in ("trilu", "one_hot", "gather_elements"):
        assert get_op(op).category is Category.INJECTIVE


def test_type_rules() -> None:
    f32 = TensorType((2, 4), "float32")
    assert get_op("argmin").infer([f32], {"axis": -1, "keepdims": 0}) == [TensorType((2,), "int64")]
    assert get_op("topk").infer([f32], {"k": 3}) == [
        TensorType((2, 3), "float32"),
        TensorType((2, 3), "int64"),
    ]
    indices = TensorType((3, 5), "int32")
    values = TensorType((2,), "int8")
    assert get_op("one_hot").infer([indices, values], {"depth": 6, "axis": 1}) == [
        TensorType((3, 6, 5), "int8")
    ]


@pytest.mark.parametrize(
    "op, inputs, attrs, message",
    [
        ("argmax", [TensorType((3,), "bool")], {}, "argmax: data must be a number tensor"),
        ("argmin", [TensorType((), "float32")], {}, "argmin: data must have rank >= 1"),
        ("argmax", [TensorType((3, 2), "float32")], {"select_last_index": 2}, "must be 0 or 1"),
        ("topk", [TensorType((3, 4), "float32")], {"k": 5}, "topk: k=5 must be in [0, 4]"),
        ("topk", [TensorType((3, 4), "float32")], {}, "topk: attribute 'k' is required"),
        ("hardmax", [TensorType((3, 4), "int32")], {}, "hardmax: data must be a float tensor"),
        ("cumsum", [TensorType((3, 4), "int8")], {"axis": 2}, "cumsum: axis 2 is out of range"),
        ("trilu", [TensorType((4,), "float32")], {}, "trilu: data must have rank >= 2"),
        (
            "one_hot",
            [TensorType((3,), "int64"), TensorType((3,), "float32")],
            {"depth": 4},
            "one_hot: values must have shape [2]",
        ),
        (
            "one_hot",
            [TensorType((3,), "int64"), TensorType((2,), "float32")],
            {"depth": -1},
            "one_hot: depth -1 must be >= 0",
        ),
        (
            "gather_elements",
            [TensorType((3, 4), "float32"), TensorType((3,), "int64")],
            {},
            "gather_elements: indices [3] must have data's rank 2",
        ),
        (
            "gather_elements",
            [TensorType((3, 4), "float32"), TensorType((2, 5), "int64")],
            {"axis": 0},
            "larger than data [3, 4] on axes [1]",
        ),
        (
            "gather_elements",
            [TensorType((3, 4), "float32"), TensorType((3, 4), "float32")],
            {},
            "gather_elements: indices must be int32 or int64",
        ),
    ],
)
def test_type_rule_errors_name_op_and_problem(
    op: str, inputs: list[TensorType], attrs: dict, message: str
) -> None:
    with pytest.raises(GraphError) as caught:
        get_op(op).infer(inputs, attrs)
    assert message in str(caught.value)


def test_gather_elements_reference_refuses_out_of_range_index() -> None:
    with pytest.raises(GraphError, match=r"gather_elements: an index is outside \[-3, 3\)"):
        get_op("gather_elements").reference(
            [np.zeros((3, 2), np.float32), np.array([[3, 0]])], {"axis": 0}
        )


# -- the converters' refusals ----------------------------------------------------------------------


def test_unknown_attribute_is_refused_naming_node_op_and_attribute() -> None:
    x = ties(2, 3)
    model = one_node("ArgMax", {"x": x}, axis=1, novel=1)
    with pytest.raises(OnnxImportError, match=r"node 'n0' \(op 'ArgMax'.*attribute novel"):
        from_onnx(model)


@pytest.mark.parametrize(
    "op, tensor, outputs",
    [("TopK", "k", ("v", "i")), ("CumSum", "axis", ("y",)), ("Trilu", "k", ("y",))],
)
def test_build_time_inputs_must_be_constants(op: str, tensor: str, outputs: tuple) -> None:
    x = ties(3, 4)
    second = np.array([1] if op == "TopK" else 1, np.int64)
    model = one_node(op, {"x": x, tensor: second}, outputs=outputs)
    with pytest.raises(OnnxImportError, match="must be a constant") as caught:
        from_onnx(model)
    assert caught.value.needs_constant == tensor  # an ONNX backend binds it at run time


def test_one_hot_refusals() -> None:
    indices = np.array([1, 2], np.int64)
    bf16 = helper.make_tensor_value_info("v", TensorProto.BFLOAT16, [2])
    model = one_node("OneHot", {"i": indices}, {"d": np.array(3)}, outputs=("y",))
    model.graph.input.append(bf16)
    model.graph.node[0].input.append("v")
    with pytest.raises(OnnxImportError, match="one_hot: values must be a number or bool tensor"):
        from_onnx(model)
    model = one_node("OneHot", {"i": indices}, {"d": np.array(2.5), "v": np.array([0, 1])})
    with pytest.raises(OnnxImportError, match=r"depth 2\.5 must be an integer"):
        from_onnx(model)


def test_eye_like_refusals() -> None:
    model = one_node("EyeLike", {"x": ties(2, 3)}, dtype=TensorProto.STRING)
    with pytest.raises(OnnxImportError, match="attribute dtype=STRING is not supported"):
        from_onnx(model)
    model = one_node("EyeLike", {"x": ties(2, 3, 4)})
    with pytest.raises(OnnxImportError, match=r"input must be 2-D, got shape \[2, 3, 4\]"):
        from_onnx(model)

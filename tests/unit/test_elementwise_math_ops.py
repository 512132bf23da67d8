"""Rounding, trigonometry, float tests, integer bits and mod (ONNX Floor ... BitShift) end to end.

Type rules refuse what they cannot type, naming the op; the numpy references agree with onnx's
ReferenceEvaluator on single-node models; compiled kernels (gcc, vector and scalar loops) and the
loop-IR interpreter agree with the references on NaN, infinities, signed zeros, halves, values
outside each function's domain, and every integer width at its extremes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from model_runtime import ModelRunner
from onnx import helper
from onnx.reference import ReferenceEvaluator

from compiler import toolchain
from compiler.build import Kernel, build_source_many
from compiler.frontend import OnnxImportError, from_onnx
from compiler.graph import Graph, GraphError, get_op, run_reference
from compiler.graph import passes as P
from compiler.graph.build_model import build_model
from compiler.graph.group_kernel import group_kernel
from compiler.graph.ir import TensorType
from compiler.graph.passes.rewrite import add_op
from compiler.ir import interpreter
from compiler.lower import lower

pytestmark = pytest.mark.usefixtures("build_cache")

FLOAT_UNARY: tuple[str, ...] = ("floor", "ceil", "round", "sin", "cos", "tan", "asin", "acos")
FLOAT_UNARY += ("atan", "sinh", "cosh", "asinh", "acosh", "atanh", "isnan")
INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
SHAPE = (3, 32)  # an inner axis of 32: the group kernels vectorize it (16 or 8 lanes)


# -- inputs -----------------------------------------------------------------------------------------


def float_values(dtype: str, seed: int) -> np.ndarray:
    """Edge values (NaN, +-inf, +-0, halves, domain ends and beyond) then random ones."""
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0]
    edges += [0.999, -0.999, 1.001, 3.0, -7.25, 1e4, -1e4, 0.25, 100.5, -3.5]
    rest = np.random.default_rng(seed).standard_normal(np.prod(SHAPE) - len(edges)) * 3
    return np.concatenate([edges, rest]).reshape(SHAPE).astype(dtype)


def integer_values(dtype: str, seed: int) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = [info.min, info.max, 0, 1, -1, 2, -2, info.min + 1, info.max - 1, 7, -7, 64]
    rng = np.random.default_rng(seed)
    rest = rng.integers(info.min, info.max, np.prod(SHAPE), dtype=dtype, endpoint=True)
    bits = [e & ((1 << info.bits) - 1) for e in edges]  # two's complement: -1 of uint8 is 255
    values = np.concatenate([np.array(bits, f"uint{info.bits}").view(dtype), rest])
    return values[: np.prod(SHAPE)].reshape(SHAPE)


def shift_counts(dtype: str) -> np.ndarray:
    """Counts in and out of [0, bits), negative ones for signed dtypes; one row of SHAPE."""
    bits = np.iinfo(dtype).bits
    low = 0 if dtype.startswith("uint") else -3
    return np.resize(np.arange(low, bits + 4), SHAPE[-1]).astype(dtype)


def divisors(dtype: str) -> np.ndarray:
    """Non-zero divisors of both signs, and 0 and -1 (C traps on x % 0 and INT_MIN % -1)."""
    values = np.resize(np.array([3, -3, 7, -2, 1, 0, -1, 5, 100, -128, 2, 64]), SHAPE[-1])
    if dtype.startswith("uint"):
        values = np.abs(values)
    return values.astype(dtype)


# -- graphs -----------------------------------------------------------------------------------------


def float_graph(dtype: str) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph(f"math_{dtype}")
    x = g.add_input("x", SHAPE, dtype)
    y = g.add_input("y", SHAPE, dtype)
    outs = [add_op(g, op, [x], {})[0] for op in FLOAT_UNARY]
    for negative, positive in ((1, 1), (1, 0), (0, 1), (0, 0)):
        attrs = {"detect_negative": negative, "detect_positive": positive}
        outs.append(add_op(g, "isinf", [x], attrs)[0])
    outs += [add_op(g, "mod", [x, y], {"fmod": f})[0] for f in (0, 1)]
    g.set_outputs(outs)
    y_values = np.flip(float_values(dtype, 2), axis=1).copy()
    return g, {"x": float_values(dtype, 1), "y": y_values}


def integer_graph(dtype: str) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph(f"bits_{dtype}")
    a = g.add_input("a", SHAPE, dtype)
    b = g.add_input("b", SHAPE, dtype)
    row = g.add_input("row", SHAPE[-1:], dtype)  # broadcast over the rows
    counts = g.add_input("counts", SHAPE[-1:], dtype)
    outs = [add_op(g, op, [a, b], {})[0] for op in ("bitwise_and", "bitwise_or", "bitwise_xor")]
    outs.append(add_op(g, "bitwise_and", [a, row], {})[0])
    outs.append(add_op(g, "bitwise_not", [a], {})[0])
    outs += [add_op(g, op, [a, counts], {})[0] for op in ("shift_left", "shift_right")]
    outs += [add_op(g, "mod", [a, row], {"fmod": f})[0] for f in (0, 1)]
    g.set_outputs(outs)
    feeds = {
        "a": integer_values(dtype, 1),
        "b": integer_values(dtype, 2),
        "row": divisors(dtype),
        "counts": shift_counts(dtype),
    }
    return g, feeds


GRAPHS = [("float", d) for d in ("float32", "float64", "float16")] + [
    ("integer", d) for d in INTEGER_DTYPES
]


def make_graph(kind: str, dtype: str) -> tuple[Graph, dict[str, np.ndarray]]:
    return float_graph(dtype) if kind == "float" else integer_graph(dtype)


def assert_matches(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if want.dtype.kind == "f":
        # libm and numpy may differ in the last place (float16 rounds once more).
        rtol = 2e-3 if want.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(got, want, rtol=rtol, atol=0, equal_nan=True, err_msg=what)
        assert (np.signbit(got) == np.signbit(want))[want == 0].all(), f"{what}: sign of zero"
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


# -- type rules -------------------------------------------------------------------------------------

F32 = TensorType((4,), "float32")
I32 = TensorType((4,), "int32")


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "message"),
    [
        ("sin", [I32], {}, "sin: input must be a float tensor, got int32"),
        ("round", [I32], {}, "round: input must be a float tensor"),
        ("isnan", [I32], {}, "isnan: input must be a float tensor"),
        ("isinf", [F32], {"detect_negative": 2}, "isinf: attribute detect_negative=2 must be"),
        ("bitwise_not", [F32], {}, "bitwise_not: operands must be integer tensors, got float32"),
        ("bitwise_and", [I32, F32], {}, "bitwise_and: operands must be integer tensors"),
        ("shift_left", [I32, TensorType((4,), "int64")], {}, "different dtypes int32 and int64"),
        ("shift_right", [I32, TensorType((3,), "int32")], {}, "cannot be broadcast"),
        ("mod", [F32, I32], {}, "mod: operands have different dtypes float32 and int32"),
        ("mod", [F32, F32], {"fmod": 2}, "mod: attribute fmod=2 must be 0 or 1"),
    ],
)
def test_type_rules_name_the_op_and_the_problem(
    op: str, inputs: list[TensorType], attrs: dict[str, Any], message: str
) -> None:
    with pytest.raises(GraphError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_op(op).infer(inputs, attrs)


def test_result_types() -> None:
    assert get_op("isinf").infer([F32], {}) == [TensorType((4,), "bool")]
    assert get_op("isnan").infer([TensorType((2, 3), "float16")], {})[0].dtype == "bool"
    wide = get_op("shift_left").infer([TensorType((2, 1), "uint8"), TensorType((5,), "uint8")], {})
    assert wide == [TensorType((2, 5), "uint8")]
    assert get_op("mod").infer([I32, TensorType((1,), "int32")], {"fmod": 0}) == [I32]


# -- references against onnx's ReferenceEvaluator ----------------------------------------------------

ONNX_CASES: list[tuple[str, dict[str, Any], str]] = [
    *((op, {}, "float32") for op in ("Floor", "Ceil", "Round", "Sin", "Cos", "Tan", "Asin")),
    *((op, {}, "float32") for op in ("Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")),
    ("IsNaN", {}, "float16"),
    ("IsInf", {}, "float32"),
    ("IsInf", {"detect_negative": 0}, "float64"),
    ("IsInf", {"detect_positive": 0}, "float16"),
    ("Mod", {"fmod": 1}, "float32"),
    ("Mod", {"fmod": 0}, "float64"),
    ("Mod", {"fmod": 0}, "float16"),
    *(("Mod", {"fmod": f}, d) for f in (0, 1) for d in ("int8", "int64", "uint16")),
    *((op, {}, d) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor") for d in ("int16", "uint64")),
    ("BitwiseNot", {}, "int8"),
    ("BitwiseNot", {}, "uint32"),
    *(("BitShift", {"direction": s}, d) for s in ("LEFT", "RIGHT") for d in INTEGER_DTYPES),
]


def onnx_case(op: str, attrs: dict[str, Any], dtype: str) -> tuple[onnx.ModelProto, list[Any]]:
    """A one-node model of `op` and its inputs (the second one row, broadcast)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    binary = op in ("Mod", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitShift")
    if dtype.startswith(("int", "uint")):
        x = integer_values(dtype, 3)
        y = shift_counts(dtype) if op == "BitShift" else divisors(dtype)
        if op == "Mod":  # onnx's reference warns on a zero divisor (numpy's 0 is checked below)
            y = np.where(y == 0, np.array(3, dtype), y)
    else:
        x = float_values(dtype, 3)
        y = float_values(dtype, 4)[0]
    inputs = [x, y] if binary else [x]
    names = ["x", "y"][: len(inputs)]
    out_elem = onnx.TensorProto.BOOL if op in ("IsNaN", "IsInf") else elem
    graph = helper.make_graph(
        [helper.make_node(op, names, ["z"], **attrs)],
        op,
        [
            helper.make_tensor_value_info(n, elem, v.shape)
            for n, v in zip(names, inputs, strict=True)
        ],
        [helper.make_tensor_value_info("z", out_elem, SHAPE)],
    )
    opset = 22 if op in ("Round", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan") else 20
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model, inputs


@pytest.mark.parametrize(("op", "attrs", "dtype"), ONNX_CASES)
def test_references_agree_with_onnx(op: str, attrs: dict[str, Any], dtype: str) -> None:
    model, inputs = onnx_case(op, attrs, dtype)
    feeds = dict(zip(("x", "y"), inputs, strict=False))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        (want,) = ReferenceEvaluator(model).run(None, feeds)
    (got,) = run_reference(from_onnx(model), feeds)
    assert_matches(got, np.asarray(want), f"{op} {attrs} {dtype}")


def test_integer_mod_by_zero_and_by_minus_one_is_zero_as_in_numpy() -> None:
    a = np.array([7, -7, -128, -128, 5], np.int8)
    b = np.array([0, 0, -1, 0, -1], np.int8)
    for fmod in (0, 1):
        (got,) = get_op("mod").reference([a, b], {"fmod": fmod})
        np.testing.assert_array_equal(got, np.zeros(5, np.int8))


def test_bit_shift_direction_is_checked_at_import() -> None:
    model, _ = onnx_case("BitShift", {"direction": "UP"}, "uint8")
    with pytest.raises(OnnxImportError, match=r"op 'BitShift'.*direction='UP' must be 'LEFT' or"):
        from_onnx(model)


# -- kernels against the references -------------------------------------------------------------------


def test_toolchain_keeps_nan_inf_and_the_rounding_mode() -> None:
    # -ffast-math / -ffinite-math-only would fold isnan away and -ffast-math may round otherwise.
    flags = set(toolchain.host_target().flags)
    assert not flags & {
        "-ffast-math",
        "-ffinite-math-only",
        "-Ofast",
        "-funsafe-math-optimizations",
    }


@pytest.mark.parametrize(("kind", "dtype"), GRAPHS)
def test_compiled_model_matches_the_references(kind: str, dtype: str) -> None:
    g, feeds = make_graph(kind, dtype)
    want = run_reference(g, feeds)
    got = ModelRunner(build_model(g)).run(feeds)
    for name, w, o in zip(g.outputs, want, got, strict=True):
        assert_matches(o, w, f"{g.name} output {name} ({g.producers()[name].op})")


@pytest.mark.parametrize(("kind", "dtype"), [("float", "float32"), ("integer", "int8")])
def test_interpreter_matches_the_references(kind: str, dtype: str) -> None:
    g, feeds = make_graph(kind, dtype)
    want = dict(zip(g.outputs, run_reference(g, feeds), strict=True))
    plan = P.fuse(g)
    for group in plan.groups:
        sch, args, values = group_kernel(plan, group)
        func = lower(sch, args, f"group{group.index}")
        arrays = [
            feeds[v] if value is None else value
            for v, value in zip(group.inputs, values, strict=False)
        ]
        outs = [np.zeros(t.shape, t.dtype) for t in args[len(arrays) :]]
        interpreter.run(func, *[np.ascontiguousarray(a) for a in arrays], *outs)
        for name, out in zip(group.outputs, outs, strict=True):
            assert_matches(out, want[name], f"group {group.index} output {name}")


def test_bitwise_int32_takes_the_vector_path_and_other_calls_stay_scalar() -> None:
    g, _ = integer_graph("int32")
    f, _ = float_graph("float32")
    kernels = []
    for graph in (g, f):
        plan = P.fuse(graph)
        for group in plan.groups:
            sch, args, _ = group_kernel(plan, group)
            kernels.append(Kernel(sch, args, f"{graph.name}_{group.index}"))
    src = build_source_many(kernels, target="x86_64-avx512")
    assert "kiln_vload_int32x16" in src and "(~kiln_vload_int32x16(" in src
    assert "floorf(" in src and "rintf(" in src and "fmodf(" in src and "isnan(" in src
    assert "kiln_vload_float32" not in src  # no vector form of floor, sin, ...: scalar loops
    toolchain.compile_shared(src)  # and the scalar fallback of each compiles


def test_round_halves_to_even_in_a_kernel() -> None:
    g = Graph("round")
    x = g.add_input("x", (16,), "float32")
    g.set_outputs([add_op(g, "round", [x], {})[0]])
    halves = np.array([0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 4.5, 0.49999997, 1e8 + 1, 8388609.0])
    values = np.resize(halves, 16).astype(np.float32)
    (got,) = ModelRunner(build_model(g)).run({"x": values})
    np.testing.assert_array_equal(got, np.rint(values))
    assert got[0] == 0 and got[2] == 2 and got[6] == -2


def test_after_a_convolution_the_ops_run_on_blocked_data() -> None:
    """Conv -> Sin -> Floor -> Log -> IsNaN: the layout pass keeps them in NCHW[x]c (the bool
    result too); each output is checked against the op applied to the kernel's own input."""
    rng = np.random.default_rng(5)
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, (16, 3, 3, 3), rng.standard_normal(432))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sin", ["c"], ["s"]),
        helper.make_node("Floor", ["s"], ["f"]),
        helper.make_node("Log", ["f"], ["l"]),  # log of -1 and 0: NaN and -inf
        helper.make_node("IsNaN", ["l"], ["n"]),
    ]
    outputs = [("s", onnx.TensorProto.FLOAT), ("f", onnx.TensorProto.FLOAT)]
    graph = helper.make_graph(
        nodes,
        "blocked",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 3, 8, 8))],
        [
            helper.make_tensor_value_info(name, elem, None)
            for name, elem in [*outputs, ("n", onnx.TensorProto.BOOL)]
        ],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    g = from_onnx(model)
    blocked = P.to_nchwc(g)
    for op in ("sin", "floor", "isnan"):
        node = next(n for n in blocked.nodes if n.op == op)
        assert len(blocked.type_of(node.inputs[0]).shape) == 5, op
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        (want_s,) = ReferenceEvaluator(model).run(["s"], {"x": x})
        s, f, n = ModelRunner(build_model(g)).run({"x": x})
        np.testing.assert_allclose(s, np.asarray(want_s), rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(f, np.floor(s))
        np.testing.assert_array_equal(n, np.isnan(np.log(f)))
    assert n.dtype == bool and n.any() and not n.all()

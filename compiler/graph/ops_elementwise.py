"""Elementwise graph ops, all INJECTIVE.

- unary: `relu sigmoid tanh erf sqrt exp neg hard_swish identity`, `clip(min=, max=)` (either
  may be None: unbounded), `cast(dtype=)` (a numpy dtype name such as "float32" or "int64");
- binary, with numpy (multidirectional) broadcasting: `add sub mul div pow`. Operands share one
  dtype, except `pow`'s exponent. Integer `div` truncates toward zero, as ONNX does.

Beyond the shared contract (INJECTIVE too): `abs reciprocal`, `leaky_relu(alpha)`,
`hard_sigmoid(alpha, beta)`, `gelu(approximate="none"|"tanh")`, broadcasting `maximum minimum`,
comparisons `equal less greater` (bool results) and `where(cond, a, b)`; on floats `floor ceil
round` (halves to even) `sin cos tan asin acos atan sinh cosh asinh acosh atanh`, `isnan` and
`isinf(detect_negative=1, detect_positive=1)` (bool results); broadcasting `mod(fmod=0|1)` (0:
the remainder has the divisor's sign, as Python's %; 1: the dividend's, as C's fmod and %); on
integers `bitwise_not`, broadcasting `bitwise_and bitwise_or bitwise_xor` and `shift_left
shift_right` (the count an operand of the same dtype; a count outside [0, bits) shifts every bit
out: 0, or -1 for a right shift of a negative value; left shifts wrap).

Layout rule: unary ops run on NCHW[x]c data as is; a binary op does when its operands have one
shape or the other operand is a single element.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from compiler.graph.ir import TensorType
from compiler.graph.ops_util import broadcast_shapes, expect_inputs, fail
from compiler.graph.registry import Category, OpDef, register

Attrs = Mapping[str, Any]
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _unary_infer(op: str, float_only: bool) -> Callable[..., list[TensorType]]:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        expect_inputs(op, inputs, 1)
        if float_only and not np.issubdtype(np.dtype(inputs[0].dtype), np.floating):
            raise fail(op, f"input must be a float tensor, got {inputs[0].dtype}")
        return [inputs[0]]

    return infer


def _unary_reference(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[..., list[np.ndarray]]:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x = inputs[0]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return [np.asarray(fn(x)).astype(x.dtype, copy=False)]

    return reference


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _hard_swish(x: np.ndarray) -> np.ndarray:
    return x * np.clip(x / 6 + 0.5, 0, 1)


def _always(inputs: Sequence[TensorType], attrs: Attrs) -> bool:
    return True


_UNARY: tuple[tuple[str, Callable[[np.ndarray], np.ndarray], bool, str | None], ...] = (
    ("relu", lambda x: np.maximum(x, 0), False, "relu"),
    ("sigmoid", _sigmoid, True, None),
    ("tanh", np.tanh, True, None),
    ("erf", _erf, True, None),
    ("sqrt", np.sqrt, True, None),
    ("exp", np.exp, True, None),
    ("log", np.log, True, None),
    ("neg", np.negative, False, None),
    ("hard_swish", _hard_swish, True, None),
    ("identity", lambda x: x, False, None),
    # beyond the shared contract: rounding (`round` halves to even) and trigonometry
    ("floor", np.floor, True, None),
    ("ceil", np.ceil, True, None),
    ("round", np.rint, True, None),
    ("sin", np.sin, True, None),
    ("cos", np.cos, True, None),
    ("tan", np.tan, True, None),
    ("asin", np.arcsin, True, None),
    ("acos", np.arccos, True, None),
    ("atan", np.arctan, True, None),
    ("sinh", np.sinh, True, None),
    ("cosh", np.cosh, True, None),
    ("asinh", np.arcsinh, True, None),
    ("acosh", np.arccosh, True, None),
    ("atanh", np.arctanh, True, None),
)

for _name, _fn, _float_only, _template in _UNARY:
    register(
        OpDef(
            _name,
            Category.INJECTIVE,
            _unary_infer(_name, _float_only),
            _unary_reference(_fn),
            layout=_always,
            template=_template,
            doc=f"elementwise {_name}",
        )
    )

# -- clip / cast ----------------------------------------------------------------------------------


def _clip_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("clip", inputs, 1)
    for key in ("min", "max"):
        value = attrs.get(key)
        if value is not None and not isinstance(value, int | float):
            raise fail("clip", f"attribute {key}={value!r} must be a number or None")
    return [inputs[0]]


def _clip_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    lo, hi = attrs.get("min"), attrs.get("max")
    y = x
    if lo is not None:
        y = np.maximum(y, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        y = np.minimum(y, np.asarray(hi, dtype=x.dtype))
    return [y]


register(
    OpDef(
        "clip",
        Category.INJECTIVE,
        _clip_infer,
        _clip_reference,
        layout=_always,
        doc="min(max(x, min), max); a bound of None is absent.",
    )
)


def _cast_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("cast", inputs, 1)
    dtype = attrs.get("dtype")
    try:
        name = str(np.dtype(dtype)) if isinstance(dtype, str) else None
    except TypeError:
        name = None
    if name is None:
        raise fail("cast", f"attribute dtype={dtype!r} must name a numpy dtype")
    return [TensorType(inputs[0].shape, name)]


def _cast_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    with np.errstate(invalid="ignore", over="ignore"):
        return [inputs[0].astype(str(attrs["dtype"]))]


register(
    OpDef(
        "cast",
        Category.INJECTIVE,
        _cast_infer,
        _cast_reference,
        layout=_always,
        doc="convert to attribute dtype (numpy casting; float -> int truncates).",
    )
)

# -- binary ---------------------------------------------------------------------------------------


def _binary_infer(op: str) -> Callable[..., list[TensorType]]:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        expect_inputs(op, inputs, 2)
        a, b = inputs
        if op != "pow" and a.dtype != b.dtype:
            raise fail(op, f"operands have different dtypes {a.dtype} and {b.dtype}")
        return [TensorType(broadcast_shapes(op, a.shape, b.shape), a.dtype)]

    return infer


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(np.divide(a, b)).astype(a.dtype)
    return np.divide(a, b)


def _binary_reference(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., Any]:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        a, b = inputs
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return [np.asarray(fn(a, b)).astype(a.dtype, copy=False)]

    return reference


def _binary_layout(inputs: Sequence[TensorType], attrs: Attrs) -> bool:
    a, b = inputs
    return a.shape == b.shape or a.size == 1 or b.size == 1


_BINARY: tuple[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray], str | None], ...] = (
    ("add", np.add, "add"),
    ("sub", np.subtract, None),
    ("mul", np.multiply, "multiply"),
    ("div", _div, None),
    ("pow", np.power, None),
    ("maximum", np.maximum, None),  # beyond the shared contract: ONNX Max / Min
    ("minimum", np.minimum, None),
)

for _name, _bfn, _template in _BINARY:
    register(
        OpDef(
            _name,
            Category.INJECTIVE,
            _binary_infer(_name),
            _binary_reference(_bfn),
            layout=_binary_layout,
            template=_template,
            doc=f"elementwise {_name} with numpy broadcasting",
        )
    )

# -- beyond the shared contract: more activations, min / max, comparisons, where ------------------


def _param_unary(op: str, fn: Callable[[np.ndarray, Attrs], np.ndarray], doc: str) -> None:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x = inputs[0]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return [np.asarray(fn(x, attrs)).astype(x.dtype, copy=False)]

    register(OpDef(op, Category.INJECTIVE, _unary_infer(op, True), reference, _always, doc=doc))


def _gelu(x: np.ndarray, attrs: Attrs) -> np.ndarray:
    if attrs.get("approximate", "none") == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / np.sqrt(2)))


_param_unary("abs", lambda x, a: np.abs(x), "elementwise |x|")
_param_unary("reciprocal", lambda x, a: 1 / x, "elementwise 1 / x")
_param_unary(
    "leaky_relu",
    lambda x, a: np.where(x >= 0, x, x * float(a.get("alpha", 0.01))),
    "x if x >= 0 else alpha * x",
)
_param_unary(
    "hard_sigmoid",
    lambda x, a: np.clip(x * float(a.get("alpha", 0.2)) + float(a.get("beta", 0.5)), 0, 1),
    "max(0, min(1, alpha * x + beta))",
)
_param_unary("gelu", _gelu, "x * Phi(x); approximate='tanh' uses the tanh form")


def _compare_infer(op: str) -> Callable[..., list[TensorType]]:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        (t,) = _binary_infer(op)(inputs, attrs)
        return [TensorType(t.shape, "bool")]

    return infer


def _compare_reference(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., Any]:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        return [np.asarray(fn(inputs[0], inputs[1]))]

    return reference


for _name, _bfn in (("equal", np.equal), ("less", np.less), ("greater", np.greater)):
    register(
        OpDef(
            _name,
            Category.INJECTIVE,
            _compare_infer(_name),
            _compare_reference(_bfn),
            layout=_binary_layout,
            doc=f"elementwise {_name} -> bool, with numpy broadcasting",
        )
    )


def _where_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    expect_inputs("where", inputs, 3)
    cond, a, b = inputs
    if cond.dtype != "bool":
        raise fail("where", f"condition must be bool, got {cond.dtype}")
    if a.dtype != b.dtype:
        raise fail("where", f"branches have different dtypes {a.dtype} and {b.dtype}")
    return [TensorType(broadcast_shapes("where", cond.shape, a.shape, b.shape), a.dtype)]


def _where_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return [np.where(inputs[0], inputs[1], inputs[2])]


register(
    OpDef(
        "where",
        Category.INJECTIVE,
        _where_infer,
        _where_reference,
        doc="cond ? a : b elementwise, with numpy broadcasting of all three",
    )
)


# -- float tests, integer bits, mod ----------------------------------------------------------------


def _float_test_infer(op: str) -> Callable[..., list[TensorType]]:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        (t,) = _unary_infer(op, True)(inputs, attrs)
        for key, value in attrs.items():
            if value not in (0, 1):
                raise fail(op, f"attribute {key}={value!r} must be 0 or 1")
        return [TensorType(t.shape, "bool")]

    return infer


def _isinf(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    negative = bool(attrs.get("detect_negative", 1)) & np.isneginf(x)
    return [negative | (bool(attrs.get("detect_positive", 1)) & np.isposinf(x))]


register(
    OpDef(
        "isnan",
        Category.INJECTIVE,
        _float_test_infer("isnan"),
        lambda inputs, attrs: [np.isnan(inputs[0])],
        layout=_always,
        doc="elementwise isnan -> bool",
    )
)
register(
    OpDef(
        "isinf",
        Category.INJECTIVE,
        _float_test_infer("isinf"),
        _isinf,
        layout=_always,
        doc="elementwise x == -inf (detect_negative) or x == +inf (detect_positive) -> bool",
    )
)


def _integer_infer(op: str, arity: int) -> Callable[..., list[TensorType]]:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        expect_inputs(op, inputs, arity)
        for t in inputs:
            if not np.issubdtype(np.dtype(t.dtype), np.integer):
                raise fail(op, f"operands must be integer tensors, got {t.dtype}")
        return _binary_infer(op)(inputs, attrs) if arity == 2 else [inputs[0]]

    return infer


def _shift(left: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def shift(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        bits = a.dtype.itemsize * 8
        inside = (b >= 0) & (b < bits)
        count = np.where(inside, b, 0).astype(a.dtype)
        if left:  # on the unsigned bits, so a signed value wraps instead of overflowing
            unsigned = np.dtype(f"uint{bits}")
            moved = np.left_shift(a.astype(unsigned), count.astype(unsigned)).astype(a.dtype)
            return np.where(inside, moved, 0).astype(a.dtype)
        gone = np.where(a < 0, -1, 0) if np.issubdtype(a.dtype, np.signedinteger) else 0
        return np.where(inside, np.right_shift(a, count), gone).astype(a.dtype)

    return shift


register(
    OpDef(
        "bitwise_not",
        Category.INJECTIVE,
        _integer_infer("bitwise_not", 1),
        _unary_reference(np.invert),
        layout=_always,
        doc="elementwise ~x of integers",
    )
)
_INTEGER_BINARY: tuple[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]], ...] = (
    ("bitwise_and", np.bitwise_and),
    ("bitwise_or", np.bitwise_or),
    ("bitwise_xor", np.bitwise_xor),
    ("shift_left", _shift(left=True)),
    ("shift_right", _shift(left=False)),
)
for _name, _bfn in _INTEGER_BINARY:
    register(
        OpDef(
            _name,
            Category.INJECTIVE,
            _integer_infer(_name, 2),
            _binary_reference(_bfn),
            layout=_binary_layout,
            doc=f"elementwise {_name} of integers, with numpy broadcasting",
        )
    )


def _mod_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    if attrs.get("fmod", 0) not in (0, 1):
        raise fail("mod", f"attribute fmod={attrs['fmod']!r} must be 0 or 1")
    return _binary_infer("mod")(inputs, attrs)


def _mod_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return _binary_reference(np.fmod if attrs.get("fmod", 0) else np.mod)(inputs, attrs)


register(
    OpDef(
        "mod",
        Category.INJECTIVE,
        _mod_infer,
        _mod_reference,
        layout=_binary_layout,
        doc="elementwise remainder with numpy broadcasting; its sign: the divisor's "
        "(fmod=0, numpy's mod), the dividend's (fmod=1, C's fmod and %)",
    )
)

"""Expressions of the loop IR.

Nodes are immutable and compare by identity, so a `Var` can key a dict: two loops that both name
their variable "i" are still two variables. Python operators build nodes (`i * 4 + j`); Python ints
and floats are converted to constants of the other operand's dtype. `structural_key` gives a
hashable value that two structurally equal expressions share (the simplifier compares by it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

# How IR nodes print: compiler.ir.printer (which imports this module) installs its `to_str` here
# when it loads, and `compiler.ir` loads it, so every user of the IR gets the printer's text.
# The hook keeps the nodes' modules from importing the printer back.
node_text: Callable[[object], str] = object.__repr__

if TYPE_CHECKING:
    from compiler.ir.buffer import Buffer

INDEX_DTYPE = "int32"
FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})
INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})


class Expr:
    """Base of every expression; subclasses provide `dtype`."""

    __slots__ = ()

    @property
    def dtype(self) -> str:
        raise NotImplementedError

    def __add__(self, other: Expr | int | float) -> Expr:
        return Add(self, convert(other, self.dtype))

    def __radd__(self, other: int | float) -> Expr:
        return Add(convert(other, self.dtype), self)

    def __sub__(self, other: Expr | int | float) -> Expr:
        return Sub(self, convert(other, self.dtype))

    def __rsub__(self, other: int | float) -> Expr:
        return Sub(convert(other, self.dtype), self)

    def __mul__(self, other: Expr | int | float) -> Expr:
        return Mul(self, convert(other, self.dtype))

    def __rmul__(self, other: int | float) -> Expr:
        return Mul(convert(other, self.dtype), self)

    def __floordiv__(self, other: Expr | int) -> Expr:
        return FloorDiv(self, convert(other, self.dtype))

    def __mod__(self, other: Expr | int) -> Expr:
        return FloorMod(self, convert(other, self.dtype))

    # Comparisons build nodes (== and != keep Python identity: Vars key dicts).
    def __lt__(self, other: Expr | int | float) -> Expr:
        return LT(self, convert(other, self.dtype))

    def __le__(self, other: Expr | int | float) -> Expr:
        return LE(self, convert(other, self.dtype))

    def __gt__(self, other: Expr | int | float) -> Expr:
        return LT(convert(other, self.dtype), self)

    def __ge__(self, other: Expr | int | float) -> Expr:
        return LE(convert(other, self.dtype), self)

    def __neg__(self) -> Expr:
        return Sub(convert(0, self.dtype), self)

    def __str__(self) -> str:
        return node_text(self)


def convert(value: Expr | int | float, dtype_hint: str = INDEX_DTYPE) -> Expr:
    """An Expr for `value`; a Python number becomes a constant of `dtype_hint`'s kind."""
    if isinstance(value, Expr):
        return value
    if isinstance(getattr(value, "var", None), Var):  # a te IterVar stands for its variable
        return value.var  # type: ignore[union-attr]
    if isinstance(value, bool):
        raise TypeError("booleans are not expressions; use a comparison node")
    if isinstance(value, int):
        if dtype_hint in FLOAT_DTYPES:
            return FloatImm(float(value), dtype_hint)
        return IntImm(value, dtype_hint if dtype_hint in INT_DTYPES else INDEX_DTYPE)
    if isinstance(value, float):
        return FloatImm(value, dtype_hint if dtype_hint in FLOAT_DTYPES else "float32")
    raise TypeError(f"cannot convert {type(value).__name__} to an expression")


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A scalar variable; loop variables are Vars."""

    name: str
    dtype: str = INDEX_DTYPE


@dataclass(frozen=True, eq=False)
class IntImm(Expr):
    value: int
    dtype: str = INDEX_DTYPE


@dataclass(frozen=True, eq=False)
class FloatImm(Expr):
    value: float
    dtype: str = "float32"


@dataclass(frozen=True, eq=False)
class BinaryOp(Expr):
    """Two operands of one dtype; the result has that dtype."""

    a: Expr
    b: Expr
    # The operands' dtype, kept at construction: read through the left spine each time, building
    # a chain of n additions (a canonical sum) cost O(n^2).
    _dtype: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        dtype = self.a.dtype
        if dtype != self.b.dtype:
            raise TypeError(
                f"{type(self).__name__} of {dtype} and {self.b.dtype}: cast one side first"
            )
        object.__setattr__(self, "_dtype", dtype)

    @property
    def dtype(self) -> str:
        return self._dtype


class Add(BinaryOp):
    pass


class Sub(BinaryOp):
    pass


class Mul(BinaryOp):
    pass


class Div(BinaryOp):
    """C's `/`: true division of floats, division truncating toward zero of integers."""


class Mod(BinaryOp):
    """C's `%` on integers: the remainder that matches truncating division."""


class FloorDiv(BinaryOp):
    """Division rounding toward minus infinity (C's `/` truncates; codegen handles the difference)."""


class FloorMod(BinaryOp):
    """The remainder that matches FloorDiv: its sign follows the divisor."""


class Min(BinaryOp):
    pass


class Max(BinaryOp):
    pass


class CmpOp(BinaryOp):
    """A comparison, of dtype bool."""

    @property
    def dtype(self) -> str:
        return "bool"


class LT(CmpOp):
    """a < b."""


class LE(CmpOp):
    """a <= b."""


class EQ(CmpOp):
    """a == b."""


class NE(CmpOp):
    """a != b."""


class And(CmpOp):
    """Logical and of two bools."""


class Or(CmpOp):
    """Logical or of two bools."""


@dataclass(frozen=True, eq=False)
class Not(Expr):
    """Logical negation of a bool."""

    a: Expr

    @property
    def dtype(self) -> str:
        return "bool"


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    """`value` converted to `dtype` (C's conversion rules)."""

    to: str
    value: Expr

    @property
    def dtype(self) -> str:
        return self.to


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """`true_value` where `condition` holds, else `false_value`; both sides are evaluated."""

    condition: Expr
    true_value: Expr
    false_value: Expr

    _dtype: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        dtype = self.true_value.dtype
        if dtype != self.false_value.dtype:
            raise TypeError(f"select of {dtype} and {self.false_value.dtype}: cast one side")
        object.__setattr__(self, "_dtype", dtype)

    @property
    def dtype(self) -> str:
        return self._dtype


# Pure math functions a Call may name, with their arity; each backend maps them to its library.
# `rint` rounds half to even (the default rounding mode); `isnan` is a bool. The BIT_FUNCTIONS
# take integers of one dtype and wrap to it; a shift by a count outside [0, bits) gives 0, or
# for `shift_right` of a negative signed value -1 (ONNX BitShift), never C's undefined result.
MATH_FUNCTIONS = {
    "exp": 1, "log": 1, "sqrt": 1, "tanh": 1, "fabs": 1, "pow": 2, "erf": 1,
    "floor": 1, "ceil": 1, "rint": 1, "fmod": 2, "copysign": 2, "isnan": 1,
    "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1,
    "sinh": 1, "cosh": 1, "asinh": 1, "acosh": 1, "atanh": 1,
    "bitwise_and": 2, "bitwise_or": 2, "bitwise_xor": 2, "bitwise_not": 1,
    "shift_left": 2, "shift_right": 2,
}  # fmt: skip
BIT_FUNCTIONS = frozenset(
    {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "shift_left", "shift_right"}
)
BOOL_FUNCTIONS = frozenset({"isnan"})


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A pure function of MATH_FUNCTIONS: float arguments of one dtype, or integers of one
    dtype for the BIT_FUNCTIONS; the result has their dtype (bool for BOOL_FUNCTIONS)."""

    name: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if MATH_FUNCTIONS.get(self.name) != len(self.args):
            raise ValueError(f"call of {self.name!r} with {len(self.args)} arguments is unknown")
        if self.name in BIT_FUNCTIONS:
            dtypes = {a.dtype for a in self.args}
            if len(dtypes) != 1 or not dtypes <= INT_DTYPES:
                raise TypeError(f"{self.name} takes integers of one dtype, got {sorted(dtypes)}")

    @property
    def dtype(self) -> str:
        return "bool" if self.name in BOOL_FUNCTIONS else self.args[0].dtype


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """Element `index` of a buffer viewed as flat, row-major memory."""

    buffer: Buffer
    index: Expr

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


@dataclass(frozen=True, eq=False)
class BufferLoad(Expr):
    """Element `indices` of a multi-dimensional buffer (storage flatten turns it into a Load)."""

    buffer: Buffer
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


def children(expr: Expr) -> tuple[Expr, ...]:
    """Direct sub-expressions of an IR expression."""
    if isinstance(expr, BinaryOp):
        return (expr.a, expr.b)
    if isinstance(expr, Load):
        return (expr.index,)
    if isinstance(expr, BufferLoad):
        return expr.indices
    if isinstance(expr, Not):
        return (expr.a,)
    if isinstance(expr, Cast):
        return (expr.value,)
    if isinstance(expr, Select):
        return (expr.condition, expr.true_value, expr.false_value)
    if isinstance(expr, Call):
        return expr.args
    return ()


def free_vars(expr: Expr) -> set[Var]:
    """Every Var that `expr` reads."""
    found: set[Var] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, Var):
            found.add(node)
        stack.extend(children(node))
    return found


def structural_key(expr: Expr) -> tuple[object, ...]:
    """A hashable value equal for structurally equal expressions (Vars and Buffers by identity)."""
    if isinstance(expr, Var):
        return ("var", id(expr))
    if isinstance(expr, IntImm | FloatImm):
        return (type(expr).__name__, expr.value, expr.dtype)
    if isinstance(expr, Load | BufferLoad):
        return (type(expr).__name__, id(expr.buffer), *(structural_key(c) for c in children(expr)))
    if isinstance(expr, Cast):
        return ("cast", expr.dtype, structural_key(expr.value))
    if isinstance(expr, Call):
        return ("call", expr.name, *(structural_key(a) for a in expr.args))
    return (type(expr).__name__, *(structural_key(c) for c in children(expr)))


def rebuild(expr: Expr, kids: list[Expr]) -> Expr:
    """A node like `expr` with its children replaced by `kids` (in `children` order)."""
    if isinstance(expr, BinaryOp):
        return type(expr)(kids[0], kids[1])
    if isinstance(expr, Load):
        return Load(expr.buffer, kids[0])
    if isinstance(expr, BufferLoad):
        return BufferLoad(expr.buffer, tuple(kids))
    if isinstance(expr, Not):
        return Not(kids[0])
    if isinstance(expr, Cast):
        return Cast(expr.to, kids[0])
    if isinstance(expr, Select):
        return Select(kids[0], kids[1], kids[2])
    if isinstance(expr, Call):
        return Call(expr.name, tuple(kids))
    return expr


def substitute(expr: Expr, mapping: dict[Var, Expr]) -> Expr:
    """`expr` with every Var of `mapping` replaced by its value."""
    if not mapping:
        return expr
    if isinstance(expr, Var):
        return mapping.get(expr, expr)
    if isinstance(expr, Select):
        decided = _decided(substitute(expr.condition, mapping))
        if decided is not None:  # keep only the branch taken (unrolling a table of constants)
            return substitute(expr.true_value if decided else expr.false_value, mapping)
    kids = children(expr)
    if not kids:
        return expr
    new = [substitute(k, mapping) for k in kids]
    if all(a is b for a, b in zip(new, kids, strict=True)):
        return expr
    return rebuild(expr, new)


def _decided(condition: Expr) -> bool | None:
    """The value of a condition that is a constant or compares two integer constants."""
    if isinstance(condition, IntImm):
        return bool(condition.value)
    if isinstance(condition, EQ | NE | LT | LE):
        a, b = condition.a, condition.b
        if isinstance(a, IntImm) and isinstance(b, IntImm):
            if isinstance(condition, EQ):
                return a.value == b.value
            if isinstance(condition, NE):
                return a.value != b.value
            return a.value < b.value if isinstance(condition, LT) else a.value <= b.value
    return None

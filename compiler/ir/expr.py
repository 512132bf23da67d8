"""Expressions of the loop IR.

Nodes are immutable and compare by identity, so a `Var` can key a dict: two loops that both name
their variable "i" are still two variables. Python operators build nodes (`i * 4 + j`); Python ints
and floats are converted to constants of the other operand's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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

    def __str__(self) -> str:
        from compiler.ir.printer import to_str  # the printer imports this module

        return to_str(self)


def convert(value: Expr | int | float, dtype_hint: str = INDEX_DTYPE) -> Expr:
    """An Expr for `value`; a Python number becomes a constant of `dtype_hint`'s kind."""
    if isinstance(value, Expr):
        return value
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

    def __post_init__(self) -> None:
        if self.a.dtype != self.b.dtype:
            raise TypeError(
                f"{type(self).__name__} of {self.a.dtype} and {self.b.dtype}: cast one side first"
            )

    @property
    def dtype(self) -> str:
        return self.a.dtype


class Add(BinaryOp):
    pass


class Sub(BinaryOp):
    pass


class Mul(BinaryOp):
    pass


class FloorDiv(BinaryOp):
    """Division rounding toward minus infinity (C's `/` truncates; codegen handles the difference)."""


class FloorMod(BinaryOp):
    """The remainder that matches FloorDiv: its sign follows the divisor."""


class Min(BinaryOp):
    pass


class Max(BinaryOp):
    pass


class LT(BinaryOp):
    """a < b, of dtype bool."""

    @property
    def dtype(self) -> str:
        return "bool"


class And(BinaryOp):
    """Logical and of two bools."""

    @property
    def dtype(self) -> str:
        return "bool"


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """Element `index` of a buffer viewed as flat, row-major memory."""

    buffer: Buffer
    index: Expr

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


def children(expr: Expr) -> tuple[Expr, ...]:
    """Direct sub-expressions of an IR expression."""
    if isinstance(expr, BinaryOp):
        return (expr.a, expr.b)
    if isinstance(expr, Load):
        return (expr.index,)
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

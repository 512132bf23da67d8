"""Elementwise helpers for compute bodies: maximum, minimum, select, cast, math functions, float
tests (isnan, isinf), integer bit operations and index bounds (clamp, in_range)."""

from __future__ import annotations

from compiler.ir import expr as E


def _pair(a: E.Expr | float, b: E.Expr | float) -> tuple[E.Expr, E.Expr]:
    if isinstance(a, E.Expr):
        return a, E.convert(b, a.dtype)
    if isinstance(b, E.Expr):
        return E.convert(a, b.dtype), b
    return E.convert(a, "float32"), E.convert(b, "float32")


def maximum(a: E.Expr | float, b: E.Expr | float) -> E.Expr:
    """max(a, b) elementwise (ReLU is `maximum(x, 0.0)`)."""
    return E.Max(*_pair(a, b))


def minimum(a: E.Expr | float, b: E.Expr | float) -> E.Expr:
    """min(a, b) elementwise."""
    return E.Min(*_pair(a, b))


def if_then_else(cond: E.Expr, a: E.Expr | float, b: E.Expr | float) -> E.Expr:
    """`a` where `cond` holds, else `b` (both evaluated: keep `b` in bounds, e.g. padding)."""
    return E.Select(cond, *_pair(a, b))


def cast(dtype: str, value: E.Expr) -> E.Expr:
    """`value` converted to `dtype`."""
    return E.Cast(dtype, value)


def exp(x: E.Expr) -> E.Expr:
    return E.Call("exp", (x,))


def log(x: E.Expr) -> E.Expr:
    return E.Call("log", (x,))


def sqrt(x: E.Expr) -> E.Expr:
    return E.Call("sqrt", (x,))


def tanh(x: E.Expr) -> E.Expr:
    return E.Call("tanh", (x,))


def erf(x: E.Expr) -> E.Expr:
    return E.Call("erf", (x,))


def floor(x: E.Expr) -> E.Expr:
    return E.Call("floor", (x,))


def ceil(x: E.Expr) -> E.Expr:
    return E.Call("ceil", (x,))


def round_half_even(x: E.Expr) -> E.Expr:
    """`x` rounded to the nearest integer, halves to the even one (2.5 -> 2, -1.5 -> -2)."""
    return E.Call("rint", (x,))


def fmod(a: E.Expr, b: E.Expr) -> E.Expr:
    """C's fmod: the remainder of truncating division, with the sign of `a`."""
    return E.Call("fmod", (a, b))


def isnan(x: E.Expr) -> E.Expr:
    """Whether float `x` is NaN (a bool)."""
    return E.Call("isnan", (x,))


def isinf(x: E.Expr, negative: bool = True, positive: bool = True) -> E.Expr:
    """Whether float `x` is -inf (when `negative`) or +inf (when `positive`), a bool."""
    inf = E.FloatImm(float("inf"), x.dtype)
    if negative and positive:
        return E.EQ(E.Call("fabs", (x,)), inf)
    if positive:
        return E.EQ(x, inf)
    if negative:
        return E.EQ(x, E.FloatImm(float("-inf"), x.dtype))
    return E.IntImm(0, "bool")


def bitwise_and(a: E.Expr, b: E.Expr) -> E.Expr:
    return E.Call("bitwise_and", (a, b))


def bitwise_or(a: E.Expr, b: E.Expr) -> E.Expr:
    return E.Call("bitwise_or", (a, b))


def bitwise_xor(a: E.Expr, b: E.Expr) -> E.Expr:
    return E.Call("bitwise_xor", (a, b))


def bitwise_not(a: E.Expr) -> E.Expr:
    return E.Call("bitwise_not", (a,))


def shift_left(a: E.Expr, b: E.Expr) -> E.Expr:
    """`a` shifted left by `b` bits, wrapping to its dtype (0 when `b` is outside [0, bits))."""
    return E.Call("shift_left", (a, b))


def shift_right(a: E.Expr, b: E.Expr) -> E.Expr:
    """`a` shifted right by `b` bits, arithmetic for signed `a`; a count outside [0, bits) gives
    what shifting out every bit would: -1 for a negative `a`, else 0."""
    return E.Call("shift_right", (a, b))


def clamp(i: E.Expr, size: int) -> E.Expr:
    """Index `i` clamped into [0, size) (a padded read that stays inside its tensor)."""
    return E.Min(E.Max(i, E.IntImm(0)), E.IntImm(size - 1))


def in_range(i: E.Expr, size: int) -> E.Expr:
    """Whether 0 <= i < size."""
    return E.And(E.LE(E.IntImm(0), i), E.LT(i, E.IntImm(size)))


def all_of(*conds: E.Expr) -> E.Expr:
    """The conjunction of boolean `conds` (at least one)."""
    result = conds[0]
    for c in conds[1:]:
        result = E.And(result, c)
    return result


def less(a: E.Expr | int, b: E.Expr | int) -> E.Expr:
    return E.LT(E.convert(a), E.convert(b))


def greater_equal(a: E.Expr | int, b: E.Expr | int) -> E.Expr:
    return E.LE(E.convert(b), E.convert(a))

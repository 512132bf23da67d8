"""Interval analysis of integer index expressions.

Two views, both rule-based and conservative (a bound may be loose, never wrong):
- `const_bounds`: constant [lo, hi] (inclusive) of an expression when its variables range over
  constant intervals; what the simplifier and loop partition use to prove conditions.
- `symbolic_interval`: [lo, lo + extent) with a symbolic `lo` and a constant `extent` when some
  variables are relaxed over ranges and the others stay fixed; what bound inference uses to find
  the region of a producer that one iteration of a consumer's attach loop reads.
"""

from __future__ import annotations

from compiler.arith.canonical import to_sum
from compiler.ir import expr as E

Bounds = tuple[int, int]
VarRanges = dict[E.Var, Bounds]


def const_bounds(expr: E.Expr, ranges: VarRanges) -> Bounds | None:
    """Inclusive constant bounds of integer `expr`, or None when some part is unknown.

    Args:
        expr: an integer expression.
        ranges: inclusive bounds of the variables it may read.
    """
    if isinstance(expr, E.IntImm):
        return expr.value, expr.value
    if isinstance(expr, E.Var):
        return ranges.get(expr)
    if isinstance(expr, E.Cast):
        return const_bounds(expr.value, ranges) if expr.dtype in E.INT_DTYPES else None
    if isinstance(expr, E.Select):
        a = const_bounds(expr.true_value, ranges)
        b = const_bounds(expr.false_value, ranges)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if not isinstance(expr, E.BinaryOp) or expr.dtype not in E.INT_DTYPES:
        return None
    a = const_bounds(expr.a, ranges)
    if a is None:
        return None
    if isinstance(expr, E.FloorDiv | E.FloorMod) and isinstance(expr.b, E.IntImm):
        c = expr.b.value
        if c <= 0:
            return None
        if isinstance(expr, E.FloorDiv):
            return a[0] // c, a[1] // c
        if a[0] // c == a[1] // c:
            return a[0] % c, a[1] % c
        return 0, c - 1
    b = const_bounds(expr.b, ranges)
    if b is None:
        return None
    if isinstance(expr, E.Add):
        return a[0] + b[0], a[1] + b[1]
    if isinstance(expr, E.Sub):
        return a[0] - b[1], a[1] - b[0]
    if isinstance(expr, E.Mul):
        corners = [x * y for x in a for y in b]
        return min(corners), max(corners)
    if isinstance(expr, E.Min):
        return min(a[0], b[0]), min(a[1], b[1])
    if isinstance(expr, E.Max):
        return max(a[0], b[0]), max(a[1], b[1])
    return None


def symbolic_interval(
    expr: E.Expr, relaxed: dict[E.Var, tuple[E.Expr, int]]
) -> tuple[E.Expr, int] | None:
    """(lo, extent) such that every value of `expr` lies in [lo, lo + extent).

    Args:
        expr: an integer expression.
        relaxed: variables that range over [lo, lo + extent); other variables stay fixed.

    Returns:
        The interval, or None when `expr` is beyond these rules (the caller then takes the
        whole dimension).
    """
    if isinstance(expr, E.Var):
        return relaxed.get(expr, (expr, 1))
    if not E.free_vars(expr) & relaxed.keys():
        return expr, 1
    if isinstance(expr, E.Add | E.Sub):
        a = symbolic_interval(expr.a, relaxed)
        b = symbolic_interval(expr.b, relaxed)
        if a is None or b is None:
            return None
        if isinstance(expr, E.Add):
            return E.Add(a[0], b[0]), a[1] + b[1] - 1
        return E.Sub(a[0], E.Add(b[0], E.IntImm(b[1] - 1))), a[1] + b[1] - 1
    if isinstance(expr, E.Mul):
        for const, other in ((expr.b, expr.a), (expr.a, expr.b)):
            if isinstance(const, E.IntImm):
                inner = symbolic_interval(other, relaxed)
                if inner is None:
                    return None
                c = const.value
                if c >= 0:
                    return E.Mul(inner[0], const), (inner[1] - 1) * c + 1
                hi = E.Add(inner[0], E.IntImm(inner[1] - 1))
                return E.Mul(hi, const), (inner[1] - 1) * -c + 1
        return None
    if isinstance(expr, E.FloorDiv) and isinstance(expr.b, E.IntImm) and expr.b.value > 0:
        inner = symbolic_interval(expr.a, relaxed)
        if inner is None:
            return None
        c = expr.b.value
        if inner[1] == 1:
            return E.FloorDiv(inner[0], expr.b), 1
        residue = _residue(inner[0], c)
        if residue is not None:
            # lo = r (mod c): exactly the quotients of [r, r + n), so a split's `o * c + i`
            # over its inner loop divided by c is one quotient, not two.
            return E.FloorDiv(inner[0], expr.b), (residue + inner[1] - 1) // c + 1
        # [lo, lo + n) divided by c spans at most ceil((n - 1) / c) + 1 quotients.
        return E.FloorDiv(inner[0], expr.b), -(-(inner[1] - 1) // c) + 1
    if isinstance(expr, E.FloorMod) and isinstance(expr.b, E.IntImm) and expr.b.value > 0:
        inner = symbolic_interval(expr.a, relaxed)
        if inner is None:
            return None
        if inner[1] == 1:
            return E.FloorMod(inner[0], expr.b), 1
        return E.IntImm(0), expr.b.value
    return None


def _residue(expr: E.Expr, c: int) -> int | None:
    """`expr` mod `c` when every variable part is a multiple of `c`, else None."""
    form = to_sum(expr)
    if any(coef % c for coef, _ in form.nonzero()):
        return None
    return form.const % c

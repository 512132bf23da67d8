"""A small rule-based simplifier of IR expressions.

Integer +, -, * become linear canonical forms (so terms cancel); floordiv and floormod by a
constant split off the part that is a multiple of the divisor when the rest provably stays inside
one period; min, max and comparisons fold when interval analysis decides them. Float arithmetic
is left as written (folding it would change rounding). Boolean constants are IntImm of dtype
"bool" (TRUE / FALSE).
"""

from __future__ import annotations

from compiler.arith.canonical import LinearSum, from_sum, to_sum
from compiler.arith.interval import VarRanges, const_bounds
from compiler.ir import expr as E

TRUE = E.IntImm(1, "bool")
FALSE = E.IntImm(0, "bool")


def is_const(e: E.Expr, value: int | None = None) -> bool:
    """Whether `e` is an integer (or bool) constant, equal to `value` if given."""
    return isinstance(e, E.IntImm) and (value is None or e.value == value)


def simplify(expr: E.Expr, ranges: VarRanges | None = None) -> E.Expr:
    """A simpler expression equal to `expr` for every variable value inside `ranges`.

    Args:
        expr: any IR expression.
        ranges: inclusive bounds of loop variables, which let min/max/compare/div fold.
    """
    return _Simplifier(ranges or {}).visit(expr)


def difference(a: E.Expr, b: E.Expr) -> E.Expr:
    """The canonical form of a - b for integers."""
    s = to_sum(a)
    s.add(to_sum(b), -1)
    return from_sum(s)


class _Simplifier:
    def __init__(self, ranges: VarRanges) -> None:
        self.ranges = ranges

    def bounds(self, e: E.Expr) -> tuple[int, int] | None:
        return const_bounds(e, self.ranges)

    def visit(self, e: E.Expr) -> E.Expr:
        if isinstance(e, E.Select):
            # Condition first: a decided select keeps only its branch, so a table of constants
            # indexed by an unrolled axis (a Select chain) costs one leaf, not all of them.
            condition = self.visit(e.condition)
            if isinstance(condition, E.IntImm):
                return self.visit(e.true_value if condition.value else e.false_value)
        if isinstance(e, E.Add | E.Sub | E.Mul) and e.dtype in E.INT_DTYPES:
            return from_sum(self.linear(e))
        kids = E.children(e)
        if not kids:
            return e
        new = [self.visit(k) for k in kids]
        if not all(a is b for a, b in zip(new, kids, strict=True)):
            e = E.rebuild(e, new)
        if isinstance(e, E.FloorDiv | E.FloorMod) and e.dtype in E.INT_DTYPES:
            return self.divmod(e)
        if isinstance(e, E.Min | E.Max) and e.dtype in E.INT_DTYPES:
            return self.minmax(e)
        if isinstance(e, E.LT | E.LE | E.EQ | E.NE) and e.a.dtype in E.INT_DTYPES:
            return self.compare(e)
        if isinstance(e, E.And | E.Or | E.Not | E.Select):
            return self.logic(e)
        return e

    def linear(self, e: E.Expr) -> LinearSum:
        """The linear form of integer `e` with every atom simplified, built bottom-up in one walk.

        Equal to `to_sum` of `e` with its children simplified, but a chain of n additions costs
        O(n), not the O(n^2) of canonicalizing every prefix of it on the way up.
        """
        if isinstance(e, E.Add | E.Sub):
            s = self.linear(e.a)
            s.add(self.linear(e.b), 1 if isinstance(e, E.Add) else -1)
            return s
        if isinstance(e, E.Mul):
            a, b = self.linear(e.a), self.linear(e.b)
            if not b.nonzero():
                return a.scaled(b.const)
            if not a.nonzero():
                return b.scaled(a.const)
            return to_sum(E.Mul(from_sum(a), from_sum(b)))
        return to_sum(self.visit(e))

    def divmod(self, e: E.FloorDiv | E.FloorMod) -> E.Expr:
        if not isinstance(e.b, E.IntImm) or e.b.value <= 0:
            return e
        c = e.b.value
        if c == 1:
            return e.a if isinstance(e, E.FloorDiv) else E.IntImm(0, e.dtype)
        if isinstance(e, E.FloorDiv) and isinstance(e.a, E.FloorDiv) and is_const(e.a.b):
            inner = e.a.b
            assert isinstance(inner, E.IntImm)
            if inner.value > 0:
                return self.divmod(E.FloorDiv(e.a.a, E.IntImm(inner.value * c, e.dtype)))
        s = to_sum(e.a)
        whole, rest = LinearSum(dtype=e.dtype), LinearSum(dtype=e.dtype)
        for key, (coef, atom) in s.terms.items():
            if coef % c == 0:
                whole.terms[key] = (coef // c, atom)
            else:
                rest.terms[key] = (coef, atom)
        whole.const, rest.const = divmod(s.const, c)
        rest_expr = from_sum(rest)
        rb = self.bounds(rest_expr)
        if rb is not None and rb[0] // c == rb[1] // c:
            k = rb[0] // c
            if isinstance(e, E.FloorDiv):
                whole.const += k
                return from_sum(whole)
            rest.const -= k * c
            return from_sum(rest)
        if not whole.nonzero() and whole.const == 0:
            return type(e)(rest_expr, e.b) if rest_expr is not e.a else e
        return e

    def minmax(self, e: E.Min | E.Max) -> E.Expr:
        d = self.bounds(difference(e.a, e.b))
        if d is None:
            return e
        a_smaller = d[1] <= 0
        b_smaller = d[0] >= 0
        if isinstance(e, E.Min):
            return e.a if a_smaller else e.b if b_smaller else e
        return e.b if a_smaller else e.a if b_smaller else e

    def compare(self, e: E.LT | E.LE | E.EQ | E.NE) -> E.Expr:
        d = self.bounds(difference(e.a, e.b))
        if d is None:
            return e
        lo, hi = d
        if isinstance(e, E.LT):
            return TRUE if hi < 0 else FALSE if lo >= 0 else e
        if isinstance(e, E.LE):
            return TRUE if hi <= 0 else FALSE if lo > 0 else e
        if lo == hi:
            return TRUE if (lo == 0) == isinstance(e, E.EQ) else FALSE
        if lo > 0 or hi < 0:
            return FALSE if isinstance(e, E.EQ) else TRUE
        return e

    def logic(self, e: E.Expr) -> E.Expr:
        if isinstance(e, E.Not):
            return E.IntImm(1 - e.a.value, "bool") if isinstance(e.a, E.IntImm) else e
        if isinstance(e, E.Select):
            if isinstance(e.condition, E.IntImm):
                return e.true_value if e.condition.value else e.false_value
            return e
        assert isinstance(e, E.And | E.Or)
        absorbing = FALSE if isinstance(e, E.And) else TRUE
        for side, other in ((e.a, e.b), (e.b, e.a)):
            if isinstance(side, E.IntImm):
                return absorbing if side.value == absorbing.value else other
        return e

"""Linear forms: write an index expression as `coef * var + rest` with `rest` free of `var`."""

from __future__ import annotations

from compiler.ir import expr as E


def linear_form(expr: E.Expr, var: E.Var) -> tuple[int, E.Expr] | None:
    """(coef, rest) with `expr == coef * var + rest`, or None when `expr` is not linear in `var`.

    Only +, - and multiplication by integer constants are understood; anything else that reads
    `var` (floordiv, min, a load indexed by it) makes the form unknown.
    """
    # One walk: a subtree free of `var` comes back as itself (not a copy), and only the leaves
    # the walk cannot see through ask which variables they read. Asking at every level first
    # walked each sum once per level above it: 9% of lowering a dense candidate.
    if expr is var:
        return 1, E.IntImm(0, expr.dtype)
    if isinstance(expr, E.Add | E.Sub):
        left = linear_form(expr.a, var)
        right = linear_form(expr.b, var)
        if left is None or right is None:
            return None
        if left[0] == 0 == right[0] and left[1] is expr.a and right[1] is expr.b:
            return 0, expr
        if isinstance(expr, E.Add):
            return left[0] + right[0], _add(left[1], right[1])
        return left[0] - right[0], _sub(left[1], right[1])
    if isinstance(expr, E.Mul):
        for const, other in ((expr.a, expr.b), (expr.b, expr.a)):
            if isinstance(const, E.IntImm):
                inner = linear_form(other, var)
                if inner is None:
                    return None
                if inner[0] == 0 and inner[1] is other:
                    return 0, expr
                return const.value * inner[0], _mul(const, inner[1])
    return (0, expr) if var not in E.free_vars(expr) else None


def _is_zero(e: E.Expr) -> bool:
    return isinstance(e, E.IntImm) and e.value == 0


def _add(a: E.Expr, b: E.Expr) -> E.Expr:
    if _is_zero(b):
        return a
    return b if _is_zero(a) else E.Add(a, b)


def _sub(a: E.Expr, b: E.Expr) -> E.Expr:
    return a if _is_zero(b) else E.Sub(a, b)


def _mul(const: E.IntImm, e: E.Expr) -> E.Expr:
    return E.IntImm(0, e.dtype) if _is_zero(e) else E.Mul(const, e)

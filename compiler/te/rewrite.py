"""Rewriting tensor expressions: substitute variables and replace tensor reads."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import expr as E
from compiler.te.tensor import Reduce, TensorLoad


def rewrite(
    expr: E.Expr,
    variables: dict[E.Var, E.Expr] | None = None,
    loads: Callable[[TensorLoad], E.Expr | None] | None = None,
) -> E.Expr:
    """`expr` with Vars of `variables` replaced and each tensor read replaced by `loads(read)`.

    `loads` sees a read whose indices are already rewritten and returns its replacement, or None
    to keep it.
    """
    variables = variables or {}

    def visit(e: E.Expr) -> E.Expr:
        if isinstance(e, E.Var):
            return variables.get(e, e)
        if isinstance(e, TensorLoad):
            read = TensorLoad(e.tensor, tuple(visit(i) for i in e.indices))
            if loads is not None:
                new = loads(read)
                if new is not None:
                    return new
            return read
        if isinstance(e, Reduce):
            return Reduce(visit(e.source), e.axis, e.combiner)
        kids = E.children(e)
        if not kids:
            return e
        return E.rebuild(e, [visit(k) for k in kids])

    return visit(expr)

"""The intrinsics pass: lower operations to what the targets do cheaply.

Floor division and modulo by a positive constant of a provably non-negative integer become C's
truncating `/` and `%` (Div, Mod), which compile to shifts and masks for powers of two instead of
the sign-correcting helpers.
"""

from __future__ import annotations

import dataclasses

from compiler.arith import const_bounds
from compiler.ir import expr as E
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import For, Stmt
from compiler.ir.transform import StmtMutator


class _Intrinsics(StmtMutator):
    def __init__(self) -> None:
        self.ranges: dict[E.Var, tuple[int, int]] = {}

    def visit_for(self, s: For) -> Stmt:
        bounds = const_bounds(s.extent, self.ranges)
        if bounds is not None:
            self.ranges[s.var] = (0, max(bounds[1] - 1, 0))
        body = self.visit(s.body)
        self.ranges.pop(s.var, None)
        extent = self.expr(s.extent)
        if body is s.body and extent is s.extent:
            return s
        return dataclasses.replace(s, extent=extent, body=body)

    def expr(self, e: E.Expr) -> E.Expr:
        kids = E.children(e)
        if not kids:
            return e
        new = [self.expr(k) for k in kids]
        if not all(a is b for a, b in zip(new, kids, strict=True)):
            e = E.rebuild(e, new)
        if isinstance(e, E.FloorDiv | E.FloorMod) and isinstance(e.b, E.IntImm) and e.b.value > 0:
            bounds = const_bounds(e.a, self.ranges)
            if bounds is not None and bounds[0] >= 0:
                return (E.Div if isinstance(e, E.FloorDiv) else E.Mod)(e.a, e.b)
        return e


def lower_intrinsics(func: PrimFunc) -> PrimFunc:
    """`func` with floor division of non-negative values made truncating."""
    return PrimFunc(func.name, func.params, _Intrinsics().visit(func.body))

"""The simplify pass: simplify every expression knowing each loop variable's range, fold decided
branches, drop empty loops, and replace single-iteration loops by their body."""

from __future__ import annotations

import dataclasses

from compiler.arith import const_bounds, simplify
from compiler.ir import expr as E
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import For, ForKind, IfThenElse, Seq, Stmt, seq
from compiler.ir.transform import StmtMutator, substitute_stmt

EMPTY: Stmt = Seq(())


class StmtSimplifier(StmtMutator):
    """Simplifies a statement; `ranges` are inclusive bounds of variables bound outside it."""

    def __init__(self, ranges: dict[E.Var, tuple[int, int]] | None = None) -> None:
        self.ranges = dict(ranges or {})

    def expr(self, e: E.Expr) -> E.Expr:
        return simplify(e, self.ranges)

    def visit_for(self, s: For) -> Stmt:
        extent = self.expr(s.extent)
        bounds = const_bounds(extent, self.ranges)
        if bounds is not None and bounds[1] <= 0:
            return EMPTY
        if (
            isinstance(extent, E.IntImm)
            and extent.value == 1
            and s.kind is not ForKind.THREAD_BINDING
        ):
            return self.visit(substitute_stmt(s.body, {s.var: E.IntImm(0)}))
        hi = bounds[1] - 1 if bounds is not None else None
        if hi is not None:
            self.ranges[s.var] = (0, hi)
        body = self.visit(s.body)
        self.ranges.pop(s.var, None)
        if isinstance(body, Seq) and not body.stmts:
            return EMPTY
        if extent is s.extent and body is s.body:
            return s
        return dataclasses.replace(s, extent=extent, body=body)

    def visit_if(self, s: IfThenElse) -> Stmt:
        cond = self.expr(s.condition)
        if isinstance(cond, E.IntImm):
            if cond.value:
                return self.visit(s.then_case)
            return self.visit(s.else_case) if s.else_case is not None else EMPTY
        then = self.visit(s.then_case)
        other = self.visit(s.else_case) if s.else_case is not None else None
        return IfThenElse(cond, then, other)

    def visit_seq(self, s: Seq) -> Stmt:
        stmts = [self.visit(c) for c in s.stmts]
        return seq(*(c for c in stmts if not (isinstance(c, Seq) and not c.stmts)))


def simplify_pass(func: PrimFunc) -> PrimFunc:
    """`func` with its body simplified."""
    return PrimFunc(func.name, func.params, StmtSimplifier().visit(func.body))

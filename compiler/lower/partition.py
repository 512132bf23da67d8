"""Loop partition: split a loop where a bound or guard inside it becomes decided, so the hot part
runs with constant extents and no branches and the tail becomes its own loop (never masks or
min() in the hot loop).

For a loop over v with a constant extent, a candidate is a min() loop extent or an `if`
condition inside it that is linear in v, `c * v + rest <= 0`, where the rest ranges over known
bounds. The points where the candidate becomes provably true and provably false cut the loop
into up to three pieces; each piece is a loop of its own (or, when one iteration long, its body
with v replaced by the constant), simplified with v's narrower range so that the candidate folds.
Pieces are partitioned again for further candidates; every cut lies strictly inside its loop, so
the recursion ends. A partitioned parallel loop gives several parallel loops, which the C
renderer runs in one parallel region. Loops bound to GPU grid axes are never cut: their extent
is the launch dimension, a one-iteration piece would lose its loop (every thread would run it),
and a guard on a thread index costs no loop of its own anyway.
"""

from __future__ import annotations

import dataclasses
import itertools

from compiler.arith import const_bounds, difference, linear_form, simplify
from compiler.ir import expr as E
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import Allocate, For, ForKind, IfThenElse, Seq, Stmt, seq
from compiler.ir.transform import StmtMutator, substitute_stmt
from compiler.lower.simplify import StmtSimplifier

# Beyond this many pieces of one loop nest the code grows more than a tail is worth.
MAX_PIECES = 64


def partition(func: PrimFunc) -> PrimFunc:
    """`func` with loops cut where their bounds and guards become decided."""
    return PrimFunc(func.name, func.params, _Partition().visit(func.body))


class _Partition(StmtMutator):
    def __init__(self) -> None:
        self.ranges: dict[E.Var, tuple[int, int]] = {}
        self.pieces = 0

    def visit_for(self, s: For) -> Stmt:
        if (
            isinstance(s.extent, E.IntImm)
            and s.extent.value > 1
            and s.kind is not ForKind.THREAD_BINDING
            and self.pieces < MAX_PIECES
        ):
            cuts = _cuts(s, self.ranges)
            if cuts:
                return self.split(s, cuts)
        bounds = const_bounds(s.extent, self.ranges)
        if bounds is not None:
            self.ranges[s.var] = (0, bounds[1] - 1)
        body = self.visit(s.body)
        self.ranges.pop(s.var, None)
        return s if body is s.body else dataclasses.replace(s, body=body)

    def split(self, s: For, cuts: list[int]) -> Stmt:
        assert isinstance(s.extent, E.IntImm)
        points = [0, *cuts, s.extent.value]
        parts: list[Stmt] = []
        for lo, hi in itertools.pairwise(points):
            self.pieces += 1
            if hi - lo == 1:
                piece = substitute_stmt(s.body, {s.var: E.IntImm(lo)})
            else:
                body = substitute_stmt(s.body, {s.var: s.var + lo}) if lo else s.body
                piece = dataclasses.replace(s, extent=E.IntImm(hi - lo), body=body)
            piece = StmtSimplifier(self.ranges).visit(piece)
            parts.append(self.visit(piece))
        return seq(*parts)


def _cuts(loop: For, outer: dict[E.Var, tuple[int, int]]) -> list[int]:
    """Points strictly inside `loop` where one candidate inside it becomes decided."""
    assert isinstance(loop.extent, E.IntImm)
    n = loop.extent.value
    ranges = dict(outer)
    ranges[loop.var] = (0, n - 1)
    for diff in _candidates(loop.body, ranges):
        form = linear_form(diff, loop.var)
        if form is None or form[0] == 0:
            continue
        c, rest = form
        rb = const_bounds(
            simplify(rest, ranges), {k: v for k, v in ranges.items() if k is not loop.var}
        )
        if rb is None:
            continue
        points = set()
        # c*v + rest <= 0 for every rest iff c*v <= -rhi; false for every rest iff c*v > -rlo.
        for bound in (-rb[1], -rb[0]):
            # c > 0: first v with c*v > bound; c < 0: first v with c*v <= bound (ceil(bound / c)).
            p = bound // c + 1 if c > 0 else -(-bound // c)
            if 0 < p < n:
                points.add(p)
        if points:
            return sorted(points)
    return []


def _candidates(s: Stmt, ranges: dict[E.Var, tuple[int, int]]) -> list[E.Expr]:
    """Integer expressions d inside `s` whose sign decides a bound or a guard (d <= 0: true)."""
    out: list[E.Expr] = []

    def cond(e: E.Expr) -> None:
        if isinstance(e, E.And):
            cond(e.a)
            cond(e.b)
        elif isinstance(e, E.LT) and e.a.dtype in E.INT_DTYPES:
            out.append(simplify(difference(e.a, e.b) + 1))
        elif isinstance(e, E.LE) and e.a.dtype in E.INT_DTYPES:
            out.append(difference(e.a, e.b))

    def visit(node: Stmt) -> None:
        if isinstance(node, For):
            if isinstance(node.extent, E.Min):
                out.append(difference(node.extent.a, node.extent.b))
            bounds = const_bounds(node.extent, ranges)
            if bounds is not None:
                ranges[node.var] = (0, max(bounds[1] - 1, 0))
            visit(node.body)
        elif isinstance(node, Seq):
            for c in node.stmts:
                visit(c)
        elif isinstance(node, IfThenElse):
            cond(node.condition)
            visit(node.then_case)
            if node.else_case is not None:
                visit(node.else_case)
        elif isinstance(node, Allocate):
            visit(node.body)

    visit(s)
    return out

"""Double buffering: a buffer allocated inside a loop, filled and then read in each iteration,
gets two halves; iteration i reads half i % 2 while the copy for iteration i + 1 fills the other.

    for i in range(n):            buf2 = allocate(2 * size)
      buf = allocate(size)        fill(0) -> half 0
      fill(i) -> buf              for i in range(n):
      use(i) <- buf         =>      barrier()
                                    if i + 1 < n: fill(i + 1) -> half (i + 1) % 2
                                    use(i) <- half i % 2

One barrier per iteration separates the use of a half from its next fill on GPUs (the previous
use of half (i + 1) % 2 was in iteration i - 1, before this iteration's barrier). The pass
applies to Allocates marked double_buffer whose body is (fill, [barrier], use...) directly inside
a serial loop with a constant extent; others stay single-buffered (correct, only slower).
"""

from __future__ import annotations

import dataclasses

from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import (
    Allocate,
    Barrier,
    For,
    ForKind,
    IfThenElse,
    IntrinCall,
    Seq,
    Stmt,
    Store,
    seq,
)
from compiler.ir.transform import StmtMutator, substitute_stmt


class _Retarget(StmtMutator):
    """Accesses of `old` go to `new` at `offset` more."""

    def __init__(self, old: Buffer, new: Buffer, offset: E.Expr) -> None:
        self.old, self.new, self.offset = old, new, offset

    def expr(self, e: E.Expr) -> E.Expr:
        kids = E.children(e)
        new_kids = [self.expr(k) for k in kids]
        if isinstance(e, E.Load) and e.buffer is self.old:
            return E.Load(self.new, new_kids[0] + self.offset)
        if not kids or all(a is b for a, b in zip(new_kids, kids, strict=True)):
            return e
        return E.rebuild(e, new_kids)

    def visit_store(self, s: Store) -> Stmt:
        index, value = self.expr(s.index), self.expr(s.value)
        if s.buffer is self.old:
            return Store(self.new, index + self.offset, value)
        return Store(s.buffer, index, value)

    def visit_intrin(self, s: IntrinCall) -> Stmt:
        ops = tuple(
            (self.new, self.expr(off) + self.offset, st)
            if b is self.old
            else (b, self.expr(off), st)
            for b, off, st in s.operands
        )
        return dataclasses.replace(s, operands=ops)


class _DoubleBuffer(StmtMutator):
    def visit_for(self, s: For) -> Stmt:
        body = self.visit(s.body)
        if (
            s.kind in (ForKind.SERIAL, ForKind.UNROLLED)
            and isinstance(s.extent, E.IntImm)
            and s.extent.value > 1
            and isinstance(body, Allocate)
            and body.double_buffer
            and isinstance(body.body, Seq)
            and len(body.body.stmts) >= 2
        ):
            return _transform(s, body)
        return s if body is s.body else dataclasses.replace(s, body=body)


def _transform(loop: For, alloc: Allocate) -> Stmt:
    assert isinstance(alloc.body, Seq) and isinstance(loop.extent, E.IntImm)
    fill, rest = alloc.body.stmts[0], list(alloc.body.stmts[1:])
    if rest and isinstance(rest[0], Barrier):
        rest = rest[1:]
    if rest and isinstance(rest[-1], Barrier):
        rest = rest[:-1]
    old = alloc.buffer
    size = old.size
    new = Buffer(old.name, (2 * size,), old.dtype, old.scope)
    i, n = loop.var, loop.extent.value
    half_now = E.FloorMod(i, E.IntImm(2)) * size
    half_next = E.FloorMod(i + 1, E.IntImm(2)) * size
    prologue = _Retarget(old, new, E.IntImm(0)).visit(substitute_stmt(fill, {i: E.IntImm(0)}))
    prefetch = _Retarget(old, new, half_next).visit(substitute_stmt(fill, {i: i + 1}))
    use = _Retarget(old, new, half_now).visit(seq(*rest))
    body = seq(Barrier(), IfThenElse(E.LT(i + 1, E.IntImm(n)), prefetch), use)
    return Allocate(new, seq(prologue, dataclasses.replace(loop, body=body)))


def double_buffer(func: PrimFunc) -> PrimFunc:
    """`func` with marked buffers double-buffered."""
    return PrimFunc(func.name, func.params, _DoubleBuffer().visit(func.body))

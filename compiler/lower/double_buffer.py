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
a serial loop with a constant extent, and to a nest of such Allocates (a GEMM's A and B tiles)
whose body fills each of them in turn, (fill A, [barrier], fill B, [barrier], use...); others
stay single-buffered (correct, only slower).
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
        ):
            allocs = _marked_allocations(body)
            parts = _fills_and_use(allocs) if allocs else None
            if parts is not None:
                return _transform(s, allocs, *parts)
        return s if body is s.body else dataclasses.replace(s, body=body)


def _marked_allocations(body: Stmt) -> list[Allocate]:
    """The chain of nested Allocates marked double_buffer that `body` starts with."""
    chain: list[Allocate] = []
    while isinstance(body, Allocate) and body.double_buffer:
        chain.append(body)
        body = body.body
    return chain


class _Accesses(StmtMutator):
    """Buffers a statement stores into and loads from."""

    def __init__(self) -> None:
        self.stored: set[Buffer] = set()
        self.loaded: set[Buffer] = set()

    def expr(self, e: E.Expr) -> E.Expr:
        if isinstance(e, E.Load):
            self.loaded.add(e.buffer)
        for k in E.children(e):
            self.expr(k)
        return e

    def visit_store(self, s: Store) -> Stmt:
        self.stored.add(s.buffer)
        self.expr(s.index)
        self.expr(s.value)
        return s

    def visit_intrin(self, s: IntrinCall) -> Stmt:
        # an intrinsic writes its first operand (its output) and reads the others
        (out, offset, _), *ins = s.operands
        self.stored.add(out)
        self.expr(offset)
        for buf, index, _ in ins:
            self.loaded.add(buf)
            self.expr(index)
        return s


def _fills_and_use(allocs: list[Allocate]) -> tuple[list[Stmt], list[Stmt]] | None:
    """(one fill per buffer in `allocs`' order of filling, the statements that use them), or
    None when the innermost body is not fills then uses."""
    inner = allocs[-1].body
    if not isinstance(inner, Seq) or len(inner.stmts) < 2:
        return None
    stmts = list(inner.stmts)
    if len(allocs) == 1:  # one buffer: its fill is the first statement
        fills, rest = [stmts[0]], stmts[1:]
    else:
        buffers = {a.buffer for a in allocs}
        filled: set[Buffer] = set()
        fills, rest = [], []
        for k, st in enumerate(stmts):
            if len(fills) == len(allocs):
                rest = stmts[k:]
                break
            if isinstance(st, Barrier):
                continue
            acc = _Accesses()
            acc.visit(st)
            if (
                len(acc.stored) != 1
                or not acc.stored <= buffers
                or acc.stored & filled
                or acc.loaded & buffers
            ):
                return None
            filled |= acc.stored
            fills.append(st)
        if len(fills) != len(allocs) or not rest:
            return None
    while rest and isinstance(rest[0], Barrier):
        rest = rest[1:]
    if rest and isinstance(rest[-1], Barrier):
        rest = rest[:-1]
    return fills, rest


def _transform(loop: For, allocs: list[Allocate], fills: list[Stmt], rest: list[Stmt]) -> Stmt:
    assert isinstance(loop.extent, E.IntImm)
    i, n = loop.var, loop.extent.value
    prologue, prefetch, use = seq(*fills), seq(*fills), seq(*rest)
    prologue = substitute_stmt(prologue, {i: E.IntImm(0)})
    prefetch = substitute_stmt(prefetch, {i: i + 1})
    doubled = []
    for alloc in allocs:
        old = alloc.buffer
        size = old.size
        new = Buffer(old.name, (2 * size,), old.dtype, old.scope)
        half_now = E.FloorMod(i, E.IntImm(2)) * size
        half_next = E.FloorMod(i + 1, E.IntImm(2)) * size
        prologue = _Retarget(old, new, E.IntImm(0)).visit(prologue)
        prefetch = _Retarget(old, new, half_next).visit(prefetch)
        use = _Retarget(old, new, half_now).visit(use)
        doubled.append(new)
    body = seq(Barrier(), IfThenElse(E.LT(i + 1, E.IntImm(n)), prefetch), use)
    out: Stmt = seq(prologue, dataclasses.replace(loop, body=body))
    for new in reversed(doubled):
        out = Allocate(new, out)
    return out


def double_buffer(func: PrimFunc) -> PrimFunc:
    """`func` with marked buffers double-buffered."""
    return PrimFunc(func.name, func.params, _DoubleBuffer().visit(func.body))

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

Staging through registers (`Allocate.stage_registers`, stage.double_buffer(stage_registers=True)):
a fill that stores global values straight into shared memory makes each thread wait for its
global loads before its FMAs start (a shared store needs the loaded value), so only other warps
hide that latency. A staged fill is cut in two around the use, as CUTLASS's SIMT mainloop does:

    for i in range(n):
      barrier()
      if i + 1 < n: reg[j] = global(i + 1, j)          (the loads, in flight during the use)
      use(i) <- half i % 2
      if i + 1 < n: half (i + 1) % 2 [j] = reg[j]      (the stores, once the loads are back)

`reg` is a thread's "local" buffer, one element per iteration of the fill's own loops (those
not bound to threads), indexed by them row-major; those loops are unrolled, so register
promotion keeps `reg` in registers (a vectorized lane loop stays a vector slot). Still one
barrier an iteration: half (i + 1) % 2 was last read in use(i - 1), before this iteration's
barrier, and the next barrier orders the stores before use(i + 1). Each Store of a fill (a
partitioned copy has a main part and a tail) gets its own run of `reg`. A fill that is not
loops, guards and sequences around Stores into its buffer (an intrinsic's copy such as
`cp.async`, which is already asynchronous), or whose own loops have a variable extent or hold
more than MAX_STAGED elements, is prefetched as above, unstaged.
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


def _fills_and_use(
    allocs: list[Allocate],
) -> tuple[list[tuple[Allocate, Stmt]], list[Stmt]] | None:
    """(each fill with the allocation it fills, in the order of filling; the statements that use
    them), or None when the innermost body is not fills then uses."""
    inner = allocs[-1].body
    if not isinstance(inner, Seq) or len(inner.stmts) < 2:
        return None
    stmts = list(inner.stmts)
    fills: list[tuple[Allocate, Stmt]]
    if len(allocs) == 1:  # one buffer: its fill is the first statement
        fills, rest = [(allocs[0], stmts[0])], stmts[1:]
    else:
        by_buffer = {a.buffer: a for a in allocs}
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
                or not acc.stored <= by_buffer.keys()
                or acc.stored & filled
                or acc.loaded & by_buffer.keys()
            ):
                return None
            filled |= acc.stored
            (buf,) = acc.stored
            fills.append((by_buffer[buf], st))
        if len(fills) != len(allocs) or not rest:
            return None
    while rest and isinstance(rest[0], Barrier):
        rest = rest[1:]
    if rest and isinstance(rest[-1], Barrier):
        rest = rest[:-1]
    return fills, rest


MAX_STAGED = 64  # elements of one fill staged in a thread's registers (else it is not staged)


def _stage(fill: Stmt, target: Buffer) -> tuple[Stmt, Stmt, Buffer] | None:
    """(the fill's loads into a register buffer, its stores from it, that buffer), or None when
    `fill` is not loops, guards and sequences around Stores into `target` (module doc). Each
    Store gets its own run of registers, indexed row-major by its loops not bound to threads."""
    size = 0
    # sized once every Store has its run: until then the runs go into a stand-in
    scratch = Buffer(f"{target.name}_reg", (MAX_STAGED,), target.dtype, "local")

    def split(node: Stmt, own: tuple[For, ...]) -> tuple[Stmt, Stmt] | None:
        nonlocal size
        if isinstance(node, Store):
            if node.buffer is not target:
                return None
            flat: E.Expr = E.IntImm(size)
            count = 1
            for loop in own:
                assert isinstance(loop.extent, E.IntImm)
                count *= loop.extent.value
            stride = count
            for loop in own:
                assert isinstance(loop.extent, E.IntImm)
                stride //= loop.extent.value
                flat = flat + loop.var * stride
            size += count
            staged = Store(scratch, flat, node.value)
            return staged, Store(target, node.index, E.Load(scratch, flat))
        if isinstance(node, Seq):
            halves = [split(child, own) for child in node.stmts]
            if any(h is None for h in halves):
                return None
            return seq(*(h[0] for h in halves if h)), seq(*(h[1] for h in halves if h))
        if isinstance(node, IfThenElse):
            if node.else_case is not None:
                return None
            inner = split(node.then_case, own)
            if inner is None:
                return None
            return (
                dataclasses.replace(node, then_case=inner[0]),
                dataclasses.replace(node, then_case=inner[1]),
            )
        if isinstance(node, For):
            kind: ForKind = node.kind
            if kind is ForKind.THREAD_BINDING:
                inner = split(node.body, own)
            elif isinstance(node.extent, E.IntImm) and kind is not ForKind.PARALLEL:
                inner = split(node.body, (*own, node))
                # unrolled, so that every register index is a constant (register promotion)
                kind = ForKind.VECTORIZED if node.kind is ForKind.VECTORIZED else ForKind.UNROLLED
            else:
                return None
            if inner is None:
                return None
            return (
                dataclasses.replace(node, body=inner[0], kind=kind),
                dataclasses.replace(node, body=inner[1], kind=kind),
            )
        return None

    halves = split(fill, ())
    if halves is None or not 0 < size <= MAX_STAGED:
        return None
    reg = Buffer(scratch.name, (size,), target.dtype, "local")
    to_reg = _Retarget(scratch, reg, E.IntImm(0))
    return to_reg.visit(halves[0]), to_reg.visit(halves[1]), reg


def _transform(
    loop: For, allocs: list[Allocate], fills: list[tuple[Allocate, Stmt]], rest: list[Stmt]
) -> Stmt:
    assert isinstance(loop.extent, E.IntImm)
    i, n = loop.var, loop.extent.value
    prologue, use = seq(*(fill for _, fill in fills)), seq(*rest)
    prologue = substitute_stmt(prologue, {i: E.IntImm(0)})
    # the next iteration's fills: straight into shared memory, or loads now and stores after use
    direct: list[Stmt] = []
    loads: list[Stmt] = []
    stores: list[Stmt] = []
    staging: list[Buffer] = []
    for alloc, fill in fills:
        staged = _stage(fill, alloc.buffer) if alloc.stage_registers else None
        if staged is None:
            direct.append(fill)
        else:
            load, store, reg = staged
            loads.append(load)
            stores.append(store)
            staging.append(reg)
    prefetch = substitute_stmt(seq(*direct, *loads), {i: i + 1})
    after = substitute_stmt(seq(*stores), {i: i + 1}) if stores else None
    doubled = []
    for alloc in allocs:
        old = alloc.buffer
        size = old.size
        new = Buffer(old.name, (2 * size,), old.dtype, old.scope)
        half_now = E.FloorMod(i, E.IntImm(2)) * size
        half_next = E.FloorMod(i + 1, E.IntImm(2)) * size
        prologue = _Retarget(old, new, E.IntImm(0)).visit(prologue)
        prefetch = _Retarget(old, new, half_next).visit(prefetch)
        if after is not None:
            after = _Retarget(old, new, half_next).visit(after)
        use = _Retarget(old, new, half_now).visit(use)
        doubled.append(new)
    more = E.LT(i + 1, E.IntImm(n))
    parts = [Barrier(), IfThenElse(more, prefetch), use]
    if after is not None:
        parts.append(IfThenElse(more, after))
    out: Stmt = seq(prologue, dataclasses.replace(loop, body=seq(*parts)))
    for reg in staging:
        out = Allocate(reg, out)
    for new in reversed(doubled):
        out = Allocate(new, out)
    return out


def double_buffer(func: PrimFunc) -> PrimFunc:
    """`func` with marked buffers double-buffered."""
    return PrimFunc(func.name, func.params, _DoubleBuffer().visit(func.body))

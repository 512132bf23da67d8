"""Virtual threads: a loop bound to "vthread.*" becomes its threads' statements interleaved.

`stage.bind(axis, "vthread.x")` says that the iterations of `axis` are independent streams of
work (they write disjoint outputs through buffers of their own). This pass, TVM's
InjectVirtualThread rebuilt small, removes such a loop and pushes the thread index inward:

    for t in [0, V):                     for k in [0, K):            (loops shared by the threads)
      for k in [0, K):           ->        load(t=0); load(t=1)
        load(t); compute(t)                compute(t=0); compute(t=1)

- a buffer allocated inside the loop gets one copy per thread (a leading dimension of V;
  thread t's accesses move by t times the buffer's size), so the threads never share storage;
- a loop whose extent does not depend on the thread (and that holds more than one perfect
  nest) is kept once and the threads are pushed into its body, an `if` on a condition free of
  the thread likewise;
- anything else (a leaf statement, or a *perfect* loop nest: loops around a single leaf, which
  an accelerator back end turns into one instruction) is replicated, thread by thread, with the
  thread index substituted. In a sequence, a run of consecutive statements that are independent
  of each other (none reads or writes what another writes: the loads of a step's input and
  weights) is replicated as a unit, so each thread's loads stay together and its compute can
  start while the next thread's loads run (above, `load` may be several DMAs);
- where the vthread loop's extent is not constant (a tail) each copy is guarded by
  `t < extent`.

Interleaving changes the order of independent iterations only, so the function computes the
same values (the interpreter checks it). What it buys on a decoupled access-execute machine is
that thread 1's loads sit between thread 0's loads and computes, into other buffers: with the
dependency tokens the VTA code generator derives from the buffers each instruction touches
(`compiler/codegen/vta_deps.py`), one thread's loads run while another computes, i.e. double
buffering. Run it after storage flatten (indices are flat).
"""

from __future__ import annotations

import dataclasses

from compiler.errors import LowerError
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import (
    Allocate,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    IntrinCall,
    Seq,
    Stmt,
    Store,
    seq,
)
from compiler.ir.transform import StmtMutator


def inject_virtual_threads(func: PrimFunc) -> PrimFunc:
    """`func` with every "vthread.*" loop replaced by its threads' interleaved statements.

    Raises:
        LowerError: a vthread loop's extent has no constant upper bound, or the function was not
            flattened.
    """
    return PrimFunc(func.name, func.params, _Finder().visit(func.body))


def is_vthread(s: Stmt) -> bool:
    """Whether `s` is a loop bound to a virtual thread."""
    return (
        isinstance(s, For)
        and s.kind is ForKind.THREAD_BINDING
        and s.thread_tag.startswith("vthread")
    )


def is_perfect_nest(s: Stmt) -> bool:
    """Whether `s` is loops around one leaf statement (a store or an intrinsic call)."""
    while isinstance(s, For):
        s = s.body
    return isinstance(s, Store | IntrinCall)


class _Finder(StmtMutator):
    """Rewrites vthread loops, innermost first."""

    def visit_for(self, s: For) -> Stmt:
        if not is_vthread(s):
            return super().visit_for(s)
        body = self.visit(s.body)
        bound = _upper_bound(s.extent)
        if bound is None:
            raise LowerError(f"vthread loop {s.var.name}: extent {s.extent} has no constant bound")
        return _Inject(s.var, s.extent, bound).visit(body)


def _upper_bound(extent: E.Expr) -> int | None:
    """A constant bound on `extent`: itself, or the constant side of a tail's min()."""
    if isinstance(extent, E.IntImm):
        return extent.value
    if isinstance(extent, E.Min):
        bounds = [b for b in (_upper_bound(extent.a), _upper_bound(extent.b)) if b is not None]
        return min(bounds) if bounds else None
    return None


class _Inject:
    """The threads of one vthread loop `var` in [0, extent), at most `threads` of them."""

    def __init__(self, var: E.Var, extent: E.Expr, threads: int) -> None:
        self.var = var
        self.extent = extent
        self.threads = threads
        self.expanded: dict[Buffer, Buffer] = {}

    def visit(self, s: Stmt) -> Stmt:
        if isinstance(s, Allocate):
            buf = s.buffer
            wide = Buffer(buf.name, (self.threads, *buf.shape), buf.dtype, buf.scope)
            self.expanded[buf] = wide
            return dataclasses.replace(s, buffer=wide, body=self.visit(s.body))
        if isinstance(s, Seq):
            out: list[Stmt] = []
            run: list[Stmt] = []
            for child in s.stmts:
                if self._shared(child):
                    out += [self._replicate(run), self.visit(child)]
                    run = []
                elif run and not _independent(run, child):
                    out.append(self._replicate(run))
                    run = [child]
                else:
                    run.append(child)
            return seq(*out, self._replicate(run))
        if self._shared(s):
            if isinstance(s, For):
                return dataclasses.replace(s, body=self.visit(s.body))
            assert isinstance(s, IfThenElse)
            other = self.visit(s.else_case) if s.else_case is not None else None
            return IfThenElse(s.condition, self.visit(s.then_case), other)
        if isinstance(s, BufferStore):
            raise LowerError("inject_virtual_threads runs after storage flatten")
        return self._replicate([s])

    def _shared(self, s: Stmt) -> bool:
        """Whether the threads share `s` itself and meet inside it (a loop or an `if` free of
        the thread index, around more than one instruction)."""
        if isinstance(s, For):
            return not is_perfect_nest(s) and self.var not in E.free_vars(s.extent)
        if isinstance(s, IfThenElse):
            return self.var not in E.free_vars(s.condition)
        return isinstance(s, Allocate)

    def _replicate(self, run: list[Stmt]) -> Stmt:
        """`run` (statements independent of each other) once per thread, thread by thread: a
        thread's loads of two buffers stay together, so its compute can start on them while the
        next thread's loads proceed."""
        return (
            seq(*(self._thread(x, t) for t in range(self.threads) for x in run)) if run else seq()
        )

    def _thread(self, s: Stmt, t: int) -> Stmt:
        """`s` as thread `t` runs it: the index substituted, expanded buffers offset."""
        one = _OneThread(self.var, t, self.expanded).visit(s)
        if isinstance(self.extent, E.IntImm):
            return one
        return IfThenElse(E.LT(E.IntImm(t), self.extent), one)


def _independent(run: list[Stmt], s: Stmt) -> bool:
    """Whether `s` neither reads nor writes what `run` writes, nor writes what it reads."""
    reads, writes = _touched(s)
    for other in run:
        other_reads, other_writes = _touched(other)
        if writes & (other_reads | other_writes) or reads & other_writes:
            return False
    return True


def _touched(s: Stmt) -> tuple[set[Buffer], set[Buffer]]:
    """(buffers read, buffers written) by `s`."""
    reads: set[Buffer] = set()
    writes: set[Buffer] = set()

    def exprs(e: E.Expr) -> None:
        if isinstance(e, E.Load):
            reads.add(e.buffer)
        for k in E.children(e):
            exprs(k)

    todo = [s]
    while todo:
        x = todo.pop()
        if isinstance(x, For):
            todo.append(x.body)
        elif isinstance(x, Seq):
            todo += x.stmts
        elif isinstance(x, IfThenElse):
            exprs(x.condition)
            todo += [x.then_case] + ([x.else_case] if x.else_case else [])
        elif isinstance(x, Allocate):
            todo.append(x.body)
        elif isinstance(x, Store):
            writes.add(x.buffer)
            exprs(x.index)
            exprs(x.value)
        elif isinstance(x, IntrinCall):
            writes.add(x.operands[0][0])
            reads.update(buf for buf, _, _ in x.operands)
    return reads, writes


class _OneThread(StmtMutator):
    def __init__(self, var: E.Var, t: int, expanded: dict[Buffer, Buffer]) -> None:
        self.mapping: dict[E.Var, E.Expr] = {var: E.IntImm(t, var.dtype)}
        self.t = t
        self.expanded = expanded

    def _place(self, buf: Buffer, index: E.Expr) -> tuple[Buffer, E.Expr]:
        wide = self.expanded.get(buf)
        if wide is None:
            return buf, index
        return wide, index + E.IntImm(self.t * buf.size) if self.t else index

    def expr(self, e: E.Expr) -> E.Expr:
        if isinstance(e, E.Load):
            buf, index = self._place(e.buffer, self.expr(e.index))
            return E.Load(buf, index)
        if isinstance(e, E.BufferLoad):
            raise LowerError("inject_virtual_threads runs after storage flatten")
        if isinstance(e, E.Var):
            return self.mapping.get(e, e)
        kids = E.children(e)
        if not kids:
            return e
        return E.rebuild(e, [self.expr(k) for k in kids])

    def visit_store(self, s: Store) -> Stmt:
        buf, index = self._place(s.buffer, self.expr(s.index))
        return Store(buf, index, self.expr(s.value))

    def visit_intrin(self, s: IntrinCall) -> Stmt:
        operands = []
        for buf, offset, strides in s.operands:
            wide, moved = self._place(buf, self.expr(offset))
            operands.append((wide, moved, strides))
        return dataclasses.replace(s, operands=tuple(operands))

    def visit_allocate(self, s: Allocate) -> Stmt:
        raise LowerError(
            f"buffer {s.buffer.name} is allocated inside a statement a virtual thread replicates"
        )

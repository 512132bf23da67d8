"""Register promotion: small "local" buffers whose every access has a constant element offset
(or a constant base plus the lane variable of a vectorized loop) live in named registers.

    C.local = allocate(float32[2, 16], local)      C.local = allocate(float32[2, 16], local)
    for v in vectorized(16):                  =>      # registers [0:16] [16:32]
      C.local[v + 16] = ...                       (the same body)

The pass records on the buffer (`Buffer.registers`) the slots its accesses cut it into: one
(first element, lanes) per scalar element or per vector-wide slice read or written as a whole by
a vectorized loop, e.g. the rows of a register-tile accumulator, `acc[c * 16 + oci]` with `c`
unrolled and `oci` vectorized. The C renderer then declares one variable per slot (a scalar, or
one `kiln_vec_*` vector per register-wide chunk of a slice) instead of an array, so nothing is
indexed in memory; the interpreter still runs the buffer as an array and checks that each access
lands in a slot.

A buffer qualifies when it is allocated in "local" scope, no intrinsic takes its address, its
slots are pairwise identical or disjoint, there are at most MAX_REGISTERS of them (a slice
counts one per MAX_VECTOR_BYTES), and every access is one of:
- an index that is a constant (scalar slot);
- `base + lane` (base constant) in the store, or a load of that store's value, that is the whole
  body of a vectorized loop over `lane` with a constant extent of 1 or a power of two up to
  MAX_LANES (vector slot; only dtypes with vector types) - the form the vector renderer takes.
Anything else (an index reading the variable of a loop that stays a loop, a lane with another
coefficient, a tail loop of variable extent) leaves the buffer an array.

Order: TVM promotes before unrolling, marking what the unroller will make constant. Here the
pass runs right after unroll instead: the IR has no register variables, so the promise must be
kept in the output of unroll anyway, and checking constant offsets on the replicated code keeps
the decision in one place (a pipeline run without unroll, `lower(passes=...)`, simply promotes
less) instead of the pass predicting the unroller and the renderer checking it again.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from compiler.arith import const_bounds
from compiler.arith.linear import linear_form
from compiler.codegen.vector import MAX_LANES, MAX_VECTOR_BYTES, VECTOR_DTYPES
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import (
    Allocate,
    Barrier,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    IntrinCall,
    Seq,
    Stmt,
    Store,
)
from compiler.ir.transform import StmtMutator

MAX_REGISTERS = 64  # register slots (scalars, or MAX_VECTOR_BYTES pieces of slices) per buffer

Slot = tuple[int, int]  # (first element, lanes)


class _NotPromotable(Exception):
    """An access of the buffer that no register slot can serve."""


def register_count(buf: Buffer, slots: tuple[Slot, ...]) -> int:
    """Registers the slots take: one per scalar, one per MAX_VECTOR_BYTES of a slice."""
    item = np.dtype(buf.dtype).itemsize
    return sum(1 if lanes == 1 else -(-lanes * item // MAX_VECTOR_BYTES) for _, lanes in slots)


class _Slots:
    """Collects the slots of every access of `buf` in a statement, or raises _NotPromotable."""

    def __init__(self, buf: Buffer) -> None:
        self.buf = buf
        self.slots: set[Slot] = set()

    def stmt(self, s: Stmt, lane: For | None, whole: bool) -> None:
        """`lane`: the innermost enclosing vectorized loop; `whole`: `s` is its entire body."""
        if isinstance(s, For):
            self.expr(s.extent, lane, False)
            if s.kind is ForKind.VECTORIZED:
                self.stmt(s.body, s, isinstance(s.body, Store))
            else:
                self.stmt(s.body, lane, False)
        elif isinstance(s, Store):
            if s.buffer is self.buf:
                self.access(s.index, lane, whole)
            self.expr(s.index, lane, False)
            self.expr(s.value, lane, whole)
        elif isinstance(s, Seq):
            for child in s.stmts:
                self.stmt(child, lane, False)
        elif isinstance(s, IfThenElse):
            self.expr(s.condition, lane, False)
            self.stmt(s.then_case, lane, False)
            if s.else_case is not None:
                self.stmt(s.else_case, lane, False)
        elif isinstance(s, Allocate):
            self.stmt(s.body, lane, False)
        elif isinstance(s, IntrinCall):
            for buf, offset, _ in s.operands:
                if buf is self.buf:
                    raise _NotPromotable(f"intrinsic {s.name} takes its address")
                self.expr(offset, lane, False)
        elif isinstance(s, BufferStore):
            raise _NotPromotable("multi-dimensional store: run storage flatten first")
        elif not isinstance(s, Barrier):
            raise _NotPromotable(f"unknown statement {type(s).__name__}")

    def expr(self, e: E.Expr, lane: For | None, whole: bool) -> None:
        stack = [e]
        while stack:
            node = stack.pop()
            if isinstance(node, E.Load) and node.buffer is self.buf:
                self.access(node.index, lane, whole)
            elif isinstance(node, E.BufferLoad) and node.buffer is self.buf:
                raise _NotPromotable("multi-dimensional load: run storage flatten first")
            stack.extend(E.children(node))

    def access(self, index: E.Expr, lane: For | None, whole: bool) -> None:
        used = E.free_vars(index)
        if lane is not None and lane.var in used:
            self.slots.add(self.lane_slot(index, lane, whole))
            return
        bounds = None if used else const_bounds(index, {})
        if bounds is None or bounds[0] != bounds[1]:
            raise _NotPromotable(f"index {index} is not constant")
        self.slots.add(self.check((bounds[0], 1)))

    def lane_slot(self, index: E.Expr, lane: For, whole: bool) -> Slot:
        if not whole:
            raise _NotPromotable(f"lane {lane.var.name} indexes it outside a one-store loop")
        if not isinstance(lane.extent, E.IntImm):
            raise _NotPromotable(f"vectorized loop {lane.var.name} has a variable extent")
        lanes = lane.extent.value
        if lanes != 1 and (
            self.buf.dtype not in VECTOR_DTYPES or lanes > MAX_LANES or lanes & (lanes - 1)
        ):
            raise _NotPromotable(f"{lanes} lanes of {self.buf.dtype} make no vector register")
        form = linear_form(index, lane.var)
        if form is None or form[0] != 1 or E.free_vars(form[1]):
            raise _NotPromotable(f"index {index} is not a constant plus {lane.var.name}")
        base = const_bounds(form[1], {})
        if base is None or base[0] != base[1]:
            raise _NotPromotable(f"index {index} is not a constant plus {lane.var.name}")
        return self.check((base[0], lanes))

    def check(self, slot: Slot) -> Slot:
        if slot[0] < 0 or slot[0] + slot[1] > self.buf.size:
            raise _NotPromotable(f"slot {slot} leaves the buffer")
        return slot


def promotable_slots(alloc: Allocate) -> tuple[Slot, ...] | None:
    """The register slots of `alloc`'s buffer in order, or None when it must stay an array."""
    buf = alloc.buffer
    if buf.scope != "local" or buf.registers:
        return None
    collector = _Slots(buf)
    try:
        collector.stmt(alloc.body, None, False)
    except _NotPromotable:
        return None
    slots = tuple(sorted(collector.slots))
    if not slots:
        return None
    for (start, lanes), (nxt, _) in itertools.pairwise(slots):
        if start + lanes > nxt:  # overlapping slices: no one variable per element
            return None
    if register_count(buf, slots) > MAX_REGISTERS:
        return None
    return slots


class _Retarget(StmtMutator):
    """Every access of `old` goes to `new` (same indices)."""

    def __init__(self, old: Buffer, new: Buffer) -> None:
        self.old, self.new = old, new

    def expr(self, e: E.Expr) -> E.Expr:
        kids = E.children(e)
        new_kids = [self.expr(k) for k in kids]
        if isinstance(e, E.Load) and e.buffer is self.old:
            return E.Load(self.new, new_kids[0])
        if not kids or all(a is b for a, b in zip(new_kids, kids, strict=True)):
            return e
        return E.rebuild(e, new_kids)

    def visit_store(self, s: Store) -> Stmt:
        index, value = self.expr(s.index), self.expr(s.value)
        buf = self.new if s.buffer is self.old else s.buffer
        if buf is s.buffer and index is s.index and value is s.value:
            return s
        return Store(buf, index, value)


class _Promote(StmtMutator):
    def visit_allocate(self, s: Allocate) -> Stmt:
        body = self.visit(s.body)
        if body is not s.body:
            s = dataclasses.replace(s, body=body)
        slots = promotable_slots(s)
        if slots is None:
            return s
        old = s.buffer
        new = Buffer(old.name, old.shape, old.dtype, old.scope, registers=slots)
        return dataclasses.replace(s, buffer=new, body=_Retarget(old, new).visit(s.body))


def promote_registers(func: PrimFunc) -> PrimFunc:
    """`func` with small local buffers of constant accesses marked to live in registers."""
    return PrimFunc(func.name, func.params, _Promote().visit(func.body))

"""Dependency tokens for an instruction stream: decoupled access-execute made safe.

The load, compute and store modules each run their instructions in program order; across modules
only tokens order them (`protos.vta`). Two modules conflict on a buffer where one writes what
the other reads: load writes INP / WGT that compute reads, compute writes ACC that store reads.
`insert_tokens` walks a stream in program order and, for every instruction, finds the latest
instruction of the neighbouring module that it conflicts with (read after write: the data must
have arrived; write after read: the reader must have finished) on an overlapping range of
entries. Unless an earlier pop of the same queue already waited for that instruction or a later
one (modules run in order, so that covers it), the conflicting instruction pushes a token to
this one's module and this one pops it.

Why this is enough, and exact:
- every cross-module conflict gets a happens-before edge (the simulator's hazard check);
- a push is set only together with the pop that takes it, and both come in increasing program
  order per queue, so the i-th push of a queue is the one the i-th pop was meant for (queues
  count tokens, they do not name them), and no token is left over;
- every wait is for an instruction earlier in program order, so no deadlock;
- the push sits on the conflicting instruction itself, not on the module's latest one: with
  virtual threads, thread 0's next load waits for thread 0's GEMM only, and runs while thread
  1's GEMM does (the latency hiding).
Ranges are intervals of entries (a GEMM's are the hull of its micro-op loop nest): a
conservative overlap test can only add waits, never miss one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from protos.vta import (
    Alu,
    Buffer,
    Deps,
    Finish,
    Gemm,
    Insn,
    Load,
    Module,
    Store,
    Uop,
    module_of,
)

# Per shared buffer: (the module that writes it, the module that reads it) across modules.
_SHARED = {
    Buffer.INP: (Module.LOAD, Module.COMPUTE),
    Buffer.WGT: (Module.LOAD, Module.COMPUTE),
    Buffer.ACC: (Module.COMPUTE, Module.STORE),
}
_Access = tuple[Buffer, int, int, bool]  # buffer, first entry, end entry, written


def insert_tokens(insns: Sequence[Insn], uops: Sequence[Uop]) -> tuple[Insn, ...]:
    """`insns` with the dependency flags of the module docstring (existing flags are dropped).

    `uops` is the micro-op table the GEMM and ALU instructions index.
    """
    flags = [
        dict.fromkeys(("pop_prev", "pop_next", "push_prev", "push_next"), False) for _ in insns
    ]
    covered: dict[tuple[Module, Module], int] = {}
    writes: dict[Buffer, list[tuple[int, int, int]]] = {b: [] for b in _SHARED}
    reads: dict[Buffer, list[tuple[int, int, int]]] = {b: [] for b in _SHARED}
    last_store = -1
    for j, insn in enumerate(insns):
        module = module_of(insn)
        waits: dict[Module, int] = {}
        accesses = accesses_of(insn, uops)
        for buf, lo, hi, written in accesses:
            writer, reader = _SHARED[buf]
            if module == reader and not written:
                _latest(writes[buf], lo, hi, covered.get((writer, reader), -1), writer, waits)
            if module == writer and written:
                _latest(reads[buf], lo, hi, covered.get((reader, writer), -1), reader, waits)
        if isinstance(insn, Finish) and last_store > covered.get((Module.STORE, module), -1):
            waits[Module.STORE] = last_store
        for other, i in waits.items():
            later = other > module
            flags[i]["push_prev" if later else "push_next"] = True
            flags[j]["pop_next" if later else "pop_prev"] = True
            covered[(other, module)] = i
            for buf, pair in _SHARED.items():  # what is covered never needs a token again
                if pair == (other, module):  # this module reads what `other` wrote
                    writes[buf][:] = [h for h in writes[buf] if h[0] > i]
                elif pair == (module, other):  # this module overwrites what `other` read
                    reads[buf][:] = [h for h in reads[buf] if h[0] > i]
        for buf, lo, hi, written in accesses:
            writer, reader = _SHARED[buf]
            if written and module == writer:
                writes[buf].append((j, lo, hi))
            elif not written and module == reader:
                reads[buf].append((j, lo, hi))
        if isinstance(insn, Store):
            last_store = j
    return tuple(replace(insn, deps=Deps(**f)) for insn, f in zip(insns, flags, strict=True))


def _latest(
    history: list[tuple[int, int, int]],
    lo: int,
    hi: int,
    covered: int,
    module: Module,
    waits: dict[Module, int],
) -> None:
    """Record in `waits` the latest instruction of `history` after `covered` that overlaps
    [lo, hi)."""
    for i, a, b in reversed(history):
        if i <= covered or i <= waits.get(module, -1):
            return
        if a < hi and lo < b:
            waits[module] = i
            return


def accesses_of(insn: Insn, uops: Sequence[Uop]) -> list[_Access]:
    """The cross-module buffer ranges `insn` touches: (buffer, first, end, written)."""
    if isinstance(insn, Load):
        if insn.buffer == Buffer.UOP:
            return []
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        cols = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        return [(insn.buffer, insn.sram_base, insn.sram_base + rows * cols, True)]
    if isinstance(insn, Store):
        return [(Buffer.ACC, insn.sram_base, insn.sram_base + insn.y_size * insn.x_size, False)]
    if isinstance(insn, Gemm | Alu):
        table = uops[insn.uop_bgn : insn.uop_end]
        if not table:
            return []
        out = [(Buffer.ACC, *_hull([u.dst for u in table], insn, "dst"), True)]
        if isinstance(insn, Gemm) and not insn.reset:
            out.append((Buffer.INP, *_hull([u.src for u in table], insn, "src"), False))
            out.append((Buffer.WGT, *_hull([u.wgt for u in table], insn, "wgt"), False))
        return out
    return []


def _hull(bases: list[int], insn: Gemm | Alu, field: str) -> tuple[int, int]:
    """[first, end) of the entries the loop nest over `bases` reaches through `field`'s factors."""
    lo, hi = min(bases), max(bases)
    for iters, factor in (
        (insn.iter_out, getattr(insn, f"{field}_factor_out")),
        (insn.iter_in, getattr(insn, f"{field}_factor_in")),
    ):
        step = factor * (iters - 1)
        lo, hi = lo + min(0, step), hi + max(0, step)
    return lo, hi + 1

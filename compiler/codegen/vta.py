"""Instruction streams for the VTA-like accelerator: a tiled int8 GEMM with its epilogue.

`gemm_program(m, n, k, tiling)` turns one point of the GEMM's schedule space (tile sizes along M,
N and K in the accelerator's blocks, and a virtual-thread count) into a `protos.vta_program`
program that computes, for x: int8[m, k], w: int8[n, k], bias: int32[n] into y: int8[m, n],

    y = int8(min(max(x @ w.T + bias, 0) >> shift, 127))

the compute of `compiler.ops.vta_dense` (its tensor expression is the reference definition).

How the schedule maps to instructions. K and N are padded to the GEMM block (16) by the DRAM
layouts; rows are never padded (one INP entry is one row's 16 values). The output is cut into
tiles of `tile_m` rows x `tile_n` column blocks, N tiles outside M tiles; a tile reduces over K
in steps of `tile_k` blocks. Per K step the load module DMAs the tile's input rows
(`tile_m x tile_k` INP entries, DRAM rows `kb` entries apart) and weights (`tile_n x tile_k`
WGT entries) into a buffer slot: the `cache_read` into "vta.inp" / "vta.wgt". The compute module
runs one GEMM over a micro-op loop nest (the tensorized block: iter_out walks the tile's rows,
iter_in its column blocks, the micro-ops the K step's blocks), after a GEMM reset of the tile's
accumulators (the `cache_write` into "vta.acc"); after the last K step, four ALU instructions
(add the bias, preloaded into ACC; max 0; shift right; min 127) and the store module's STORE of
the int8 tile. Partial tiles (the last along each axis) use the same micro-ops with their own
loop bounds and factors, so the buffers hold each tile's entries densely.

Virtual threads (`vthreads` V = 1, 2, 4). Output tiles are dealt to V threads in groups of V
consecutive tiles; each thread owns one input/weight slot and one accumulator slot, and the
threads' streams are interleaved instruction by instruction: all threads' resets, then per K
step every thread's load and GEMM, then every thread's epilogue and store. The slots are
synchronised with dependency tokens (decoupled access-execute):

    load -> compute   each step's WGT load pushes; its GEMM pops (the data arrived)
    compute -> load   a GEMM pushes when a later step reuses its slot; that step's INP load pops
    compute -> store  a tile's last ALU pushes; its STORE pops
    store -> compute  a STORE pushes when a later tile reuses its accumulator slot; that tile's
                      reset pops (and FINISH pops the last STORE's)

Token queues are FIFOs of counts, so the i-th push on a queue must be meant for the i-th pop:
`_reuse_tokens` checks that every slot's next user comes in push order. With V = 1 the one slot
serialises load and compute (a load waits for the previous GEMM); with V = 2 or 4 the load of
one thread's next step runs while another thread computes, and a tile's store overlaps the next
group: the double buffering the cycles show.

Imports only `protos.vta*` of ours (the compiler's one exception): the agent decodes the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from protos.vta import (
    UOP_BYTES,
    Alu,
    AluOp,
    Buffer,
    Deps,
    Finish,
    Gemm,
    Insn,
    Load,
    Store,
    Uop,
    VtaSpec,
    format_insn,
)
from protos.vta_program import ArgLayout, Program

VTHREAD_CHOICES = (1, 2, 4)
_ALIGN = 4096  # DRAM regions start on this, a multiple of every entry size


@dataclass(frozen=True)
class GemmTiling:
    """A point of the GEMM's schedule space: tiles in GEMM blocks, and virtual threads.

    `tile_m` counts rows (the spec's batch is 1), `tile_n` and `tile_k` blocks of `block_out`
    and `block_in` elements.
    """

    tile_m: int
    tile_n: int
    tile_k: int
    vthreads: int = 1


@dataclass(frozen=True)
class GemmShape:
    """The GEMM's sizes and its blocked sizes on `spec`."""

    m: int
    n: int
    k: int
    nb: int  # column blocks (N / block_out, rounded up)
    kb: int  # reduction blocks (K / block_in, rounded up)


def gemm_shape(m: int, n: int, k: int, spec: VtaSpec) -> GemmShape:
    """The blocked sizes of an m x n x k GEMM on `spec`."""
    return GemmShape(m, n, k, math.ceil(n / spec.block_out), math.ceil(k / spec.block_in))


def tiling_problem(m: int, n: int, k: int, tiling: GemmTiling, spec: VtaSpec) -> str | None:
    """Why `tiling` cannot run an m x n x k GEMM on `spec` (a buffer overflows, a field does not
    fit its bits), or None when it can."""
    if spec.batch != 1:
        return "the GEMM generator needs a spec of batch 1"
    if min(m, n, k) < 1:
        return f"GEMM sizes must be positive, got {m} x {n} x {k}"
    g = gemm_shape(m, n, k, spec)
    tm, tn, tk = min(tiling.tile_m, m), min(tiling.tile_n, g.nb), min(tiling.tile_k, g.kb)
    v = tiling.vthreads
    if min(tiling.tile_m, tiling.tile_n, tiling.tile_k) < 1 or v not in VTHREAD_CHOICES:
        return f"tiles must be positive and vthreads one of {VTHREAD_CHOICES}: {tiling}"
    tiles = math.ceil(g.nb / tn)
    needs = (
        ("INP", v * tm * tk, spec.depth(Buffer.INP)),
        ("WGT", v * tn * tk, spec.depth(Buffer.WGT)),
        ("ACC", v * tm * tn + g.nb, spec.depth(Buffer.ACC)),
        ("UOP", v * (1 + tk + tiles), spec.depth(Buffer.UOP)),
    )
    for name, entries, depth in needs:
        if entries > depth:
            return f"{name} needs {entries} entries, the buffer holds {depth}"
    if tk >= 1 << 10 or tm >= 1 << 14:  # wgt factor (10 bits), iter_out (14 bits)
        return f"tiles {tiling} overflow an instruction field"
    return None


@dataclass(frozen=True)
class _Tile:
    """One output tile: its thread (= slot), first row / column block, rows and column blocks."""

    thread: int
    n_tile: int
    row0: int
    rows: int
    col0: int
    cols: int


class _Layout:
    """DRAM regions: micro-ops, x [m][kb*bi], w blocks [nb][kb][bo][bi], bias, y [m][nb*bo]."""

    def __init__(self, spec: VtaSpec, g: GemmShape, n_uops: int) -> None:
        kp, np_ = g.kb * spec.block_in, g.nb * spec.block_out
        self.uop_offset = 0
        self.x = _up(n_uops * UOP_BYTES)
        self.w = _up(self.x + g.m * kp)
        self.bias = _up(self.w + np_ * kp)
        self.y = _up(self.bias + np_ * 4)
        self.end = _up(self.y + g.m * np_)
        bi, bo = spec.block_in, spec.block_out
        self.args = (
            ArgLayout("x", (g.m, g.k), "int8", self.x, (g.m, kp)),
            ArgLayout("w", (g.n, g.k), "int8", self.w, (np_, kp), (g.nb, bo, g.kb, bi), (0, 2, 1, 3)),
            ArgLayout("bias", (g.n,), "int32", self.bias, (np_,)),
            ArgLayout("y", (g.m, g.n), "int8", self.y, (g.m, np_)),
        )  # fmt: skip


def _up(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def gemm_program(
    m: int,
    n: int,
    k: int,
    tiling: GemmTiling,
    shift: int,
    spec: VtaSpec | None = None,
) -> Program:
    """The program of the module docstring for `tiling`.

    Raises:
        ValueError: `tiling_problem` names why the tiling cannot run, or `shift` is not 0..31.
    """
    spec = spec or VtaSpec()
    problem = tiling_problem(m, n, k, tiling, spec)
    if problem:
        raise ValueError(f"vta gemm {m}x{n}x{k}: {problem}")
    if not 0 <= shift <= 31:
        raise ValueError(f"a requantisation shift is 0..31, got {shift}")
    g = gemm_shape(m, n, k, spec)
    tm, tn, tk = min(tiling.tile_m, m), min(tiling.tile_n, g.nb), min(tiling.tile_k, g.kb)
    v = tiling.vthreads
    n_tiles = math.ceil(g.nb / tn)

    # ACC: bias [0, nb), then one slot of tm x tn entries per thread; INP / WGT: a slot each.
    acc_slot = [g.nb + t * tm * tn for t in range(v)]
    inp_slot = [t * tm * tk for t in range(v)]
    wgt_slot = [t * tn * tk for t in range(v)]
    uops: list[Uop] = []
    reset_uop, gemm_uop, bias_uop = [], [], []
    for t in range(v):
        reset_uop.append(len(uops))
        uops.append(Uop(acc_slot[t]))
        gemm_uop.append(len(uops))
        uops += [Uop(acc_slot[t], inp_slot[t] + j, wgt_slot[t] + j) for j in range(tk)]
        bias_uop.append(len(uops))
        uops += [Uop(acc_slot[t], nt * tn) for nt in range(n_tiles)]
    layout = _Layout(spec, g, len(uops))
    x_base = layout.x // spec.inp_entry_bytes
    w_base = layout.w // spec.wgt_entry_bytes
    y_base = layout.y // spec.out_entry_bytes

    tiles = [
        _Tile(0, nt, r0, min(tm, m - r0), nt * tn, min(tn, g.nb - nt * tn))
        for nt in range(n_tiles)
        for r0 in range(0, m, tm)
    ]
    groups = [tiles[i : i + v] for i in range(0, len(tiles), v)]
    groups = [[replace(tile, thread=t) for t, tile in enumerate(grp)] for grp in groups]
    k_steps = [(k0, min(tk, g.kb - k0)) for k0 in range(0, g.kb, tk)]
    # Slot users in the interleaved order: load steps (group, K step, thread), tiles (group,
    # thread). A user pops a token when its slot had an earlier user and pushes one when a later
    # user takes its slot.
    step_slots = [tile.thread for grp in groups for _ in k_steps for tile in grp]
    tile_slots = [tile.thread for grp in groups for tile in grp]
    step_pop, step_push = _reuse_tokens(step_slots)
    tile_pop, tile_push = _reuse_tokens(tile_slots)

    insns: list[Insn] = [
        Load(Buffer.UOP, 0, layout.uop_offset // UOP_BYTES, 1, len(uops), len(uops)),
        Load(Buffer.ACC, 0, layout.bias // spec.acc_entry_bytes, 1, g.nb, g.nb),
    ]
    step = tile_no = 0
    for grp in groups:
        for tile in grp:
            insns.append(
                Gemm(reset_uop[tile.thread], reset_uop[tile.thread] + 1, reset=True,
                     **_nest(tile), deps=Deps(pop_next=tile_pop[tile_no + tile.thread]))
            )  # fmt: skip
        for k0, kk in k_steps:
            for tile in grp:
                t = tile.thread
                insns += [
                    Load(Buffer.INP, inp_slot[t], x_base + tile.row0 * g.kb + k0, tile.rows, kk,
                         g.kb, deps=Deps(pop_next=step_pop[step])),
                    Load(Buffer.WGT, wgt_slot[t], w_base + tile.col0 * g.kb + k0, tile.cols, kk,
                         g.kb, deps=Deps(push_next=True)),
                    Gemm(gemm_uop[t], gemm_uop[t] + kk, **_nest(tile), src_factor_out=kk,
                         wgt_factor_in=kk, deps=Deps(pop_prev=True, push_prev=step_push[step])),
                ]  # fmt: skip
                step += 1
        for tile in grp:
            t, last = tile.thread, tile_no + tile.thread == len(tiles) - 1
            nest = _nest(tile)
            b = bias_uop[t] + tile.n_tile
            r = reset_uop[t]
            insns += [
                Alu(AluOp.ADD, b, b + 1, src_factor_in=1, **nest),
                Alu(AluOp.MAX, r, r + 1, use_imm=True, imm=0, **nest),
                Alu(AluOp.SHR, r, r + 1, use_imm=True, imm=shift, **nest),
                Alu(AluOp.MIN, r, r + 1, use_imm=True, imm=127, **nest,
                    deps=Deps(push_next=True)),
                Store(Buffer.ACC, acc_slot[t], y_base + tile.row0 * g.nb + tile.col0, tile.rows,
                      tile.cols, g.nb,
                      deps=Deps(pop_prev=True, push_prev=tile_push[tile_no + t] or last)),
            ]  # fmt: skip
        tile_no += len(grp)
    insns.append(Finish(deps=Deps(pop_next=True)))
    return Program(spec, tuple(insns), tuple(uops), layout.end, layout.uop_offset, layout.args)


def _nest(tile: _Tile) -> dict[str, Any]:
    """The loop nest over a tile's accumulators: rows outside, column blocks inside."""
    return {
        "iter_out": tile.rows,
        "iter_in": tile.cols,
        "dst_factor_out": tile.cols,
        "dst_factor_in": 1,
    }


def _reuse_tokens(slots: Sequence[int]) -> tuple[list[bool], list[bool]]:
    """Per user of `slots` (in program order): whether it pops a token (its slot had a user
    before) and whether it pushes one (a later user takes its slot).

    Raises:
        AssertionError: the pushes would reach their pops out of order (tokens are counted, not
            named, so the i-th push must be for the i-th pop).
    """
    last: dict[int, int] = {}
    next_user: list[int | None] = [None] * len(slots)
    pops = [False] * len(slots)
    for i, slot in enumerate(slots):
        if slot in last:
            next_user[last[slot]] = i
            pops[i] = True
        last[slot] = i
    order = [u for u in next_user if u is not None]
    assert order == sorted(order), "slot reuse out of token order"
    return pops, [u is not None for u in next_user]


def disassemble(program: Program, limit: int | None = None) -> list[str]:
    """The program's instructions as text, one per line (the first `limit`)."""
    insns = program.insns if limit is None else program.insns[:limit]
    return [f"{i:4d}  {format_insn(insn)}" for i, insn in enumerate(insns)]

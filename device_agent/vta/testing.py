"""Test kit: a hand-written accelerator program, for tests and benchmarks of the simulator and agent.

`gemm_program` computes, for `x: int8[m, k]`, `w: int8[n, k]`, `bias: int32[n]` (INPUTs) and
`y: int8[m, n]` (OUTPUT), what `gemm_reference` computes with numpy:

    y = int8(min((max(x @ w.T + bias, 0) >> shift), 127))

by tiles of `tile_rows` rows: a LOAD of the tile's inputs (load module), a GEMM reset, a GEMM over
a micro-op loop nest, ALU add (bias), max 0, shift right, min 127 (compute), and a STORE (store
module), the modules handing each other tiles through tokens. With `double_buffer` the tiles
alternate between two input and two accumulator slots, so the load of tile t+1 and the store of
tile t-1 run while tile t computes; without, one slot each serialises them more. Both give the
same bits. Weights and bias are loaded once. `k` and `n` are padded to the spec's blocks by the
layouts (the pad is zeros, sliced off on the way back). The spec's batch must be 1.

`build_gemm_reference` compiles the same computation in C for the host (the SHARED_OBJECT ABI),
the reference a correctness check on a vta_sim device runs; `program_artifact` packs programs
into an ACCEL_PROGRAM artifact.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
from typing import Any

import numpy as np

from device_agent.domain import ArgRole, ArtifactMeta, EntryPoint, TensorSpec
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
)
from protos.vta_program import ArgLayout, Program, encode_programs

_ALIGN = 4096  # DRAM regions start on this, a multiple of every entry size


def gemm_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, shift: int) -> np.ndarray:
    """What `gemm_program` computes, in numpy (int32 arithmetic, int8 narrowing by truncation)."""
    acc = (x.astype(np.int64) @ w.astype(np.int64).T + bias.astype(np.int64)).astype(np.int32)
    acc = np.minimum(np.maximum(acc, 0) >> shift, 127)
    return acc.astype(np.int8)


def gemm_program(
    m: int,
    n: int,
    k: int,
    tile_rows: int | None = None,
    double_buffer: bool = False,
    shift: int = 2,
    spec: VtaSpec | None = None,
) -> Program:
    """The program described in the module docstring.

    Raises:
        ValueError: the spec's batch is not 1, or the tiles do not fit the buffers.
    """
    spec = spec or VtaSpec()
    if spec.batch != 1:
        raise ValueError("gemm_program needs a spec of batch 1")
    kb, nb = math.ceil(k / spec.block_in), math.ceil(n / spec.block_out)
    rows = min(tile_rows or m, m)
    slots = 2 if double_buffer else 1
    tiles = math.ceil(m / rows)
    inp_slot, acc_slot = rows * kb, rows * nb
    if slots * inp_slot > spec.depth(Buffer.INP) or nb + slots * acc_slot > spec.depth(Buffer.ACC):
        raise ValueError(f"{slots} tile(s) of {rows} rows do not fit the INP / ACC buffers")
    if nb * kb > spec.depth(Buffer.WGT):
        raise ValueError(f"{nb * kb} weight blocks do not fit the WGT buffer")

    uops: list[Uop] = []
    slot_uops = []  # per slot: (reset, gemm begin, gemm end, bias, imm) micro-op indices
    for s in range(slots):
        acc_base, inp_base = nb + s * acc_slot, s * inp_slot
        first = len(uops)
        uops.append(Uop(acc_base))
        uops += [Uop(acc_base, inp_base + j, j) for j in range(kb)]
        uops.append(Uop(acc_base, 0))  # bias: src walks acc[0:nb]
        slot_uops.append((first, first + 1, first + 1 + kb, first + 1 + kb))

    layout = _Layout(spec, m, n, k, kb, nb, len(uops))
    insns: list[Insn] = [
        Load(Buffer.UOP, 0, layout.uop_offset // UOP_BYTES, 1, len(uops), len(uops)),
        Load(Buffer.ACC, 0, layout.bias // spec.acc_entry_bytes, 1, nb, nb),
        Load(Buffer.WGT, 0, layout.w // spec.wgt_entry_bytes, 1, nb * kb, nb * kb),
    ]
    loads: list[Insn] = []
    computes: list[Insn] = []
    stores: list[Insn] = []
    for t in range(tiles):
        s, row0 = t % slots, t * rows
        r = min(rows, m - row0)
        reset_u, gemm_bgn, gemm_end, bias_u = slot_uops[s]
        reuses = t >= slots  # this tile's slot held tile t - slots
        frees = t + slots < tiles  # a later tile reuses this slot
        loads.append(
            Load(Buffer.INP, s * inp_slot, layout.x // spec.inp_entry_bytes + row0 * kb, r, kb, kb,
                 deps=Deps(pop_next=reuses, push_next=True))
        )  # fmt: skip
        nest: dict[str, Any] = {
            "iter_out": r,
            "iter_in": nb,
            "dst_factor_out": nb,
            "dst_factor_in": 1,
        }
        computes += [
            Gemm(reset_u, reset_u + 1, reset=True, **nest,
                 deps=Deps(pop_prev=True, pop_next=reuses)),
            Gemm(gemm_bgn, gemm_end, src_factor_out=kb, wgt_factor_in=kb, **nest,
                 deps=Deps(push_prev=frees)),
            Alu(AluOp.ADD, bias_u, bias_u + 1, src_factor_in=1, **nest),
            Alu(AluOp.MAX, reset_u, reset_u + 1, use_imm=True, imm=0, **nest),
            Alu(AluOp.SHR, reset_u, reset_u + 1, use_imm=True, imm=shift, **nest),
            Alu(AluOp.MIN, reset_u, reset_u + 1, use_imm=True, imm=127, **nest,
                deps=Deps(push_next=True)),
        ]  # fmt: skip
        stores.append(
            Store(Buffer.ACC, nb + s * acc_slot, layout.y // spec.out_entry_bytes + row0 * nb, r,
                  nb, nb, deps=Deps(pop_prev=True, push_prev=frees or t == tiles - 1))
        )  # fmt: skip
    # Program order interleaves the modules' streams tile by tile; each module sees its own in
    # order whatever the interleaving, so this order only has to be one a fetch stage could issue.
    per_tile = len(computes) // tiles
    for t in range(tiles):
        insns.append(loads[t])
        insns += computes[t * per_tile : (t + 1) * per_tile]
        insns.append(stores[t])
    insns.append(Finish(deps=Deps(pop_next=True)))
    return Program(spec, tuple(insns), tuple(uops), layout.end, layout.uop_offset, layout.args)


class _Layout:
    """DRAM regions of the GEMM program: micro-ops, x, w, bias, y."""

    def __init__(
        self, spec: VtaSpec, m: int, n: int, k: int, kb: int, nb: int, n_uops: int
    ) -> None:
        kp, np_ = kb * spec.block_in, nb * spec.block_out
        self.uop_offset = 0
        self.x = _up(n_uops * UOP_BYTES)
        self.w = _up(self.x + m * kp)
        self.bias = _up(self.w + np_ * kp)
        self.y = _up(self.bias + np_ * 4)
        self.end = _up(self.y + m * np_)
        bi, bo = spec.block_in, spec.block_out
        self.args = (
            ArgLayout("x", (m, k), "int8", self.x, (m, kp)),
            # w[n, k] -> blocks [nb][kb][bo][bi]: one WGT entry per (n block, k block)
            ArgLayout("w", (n, k), "int8", self.w, (np_, kp), (nb, bo, kb, bi), (0, 2, 1, 3)),
            ArgLayout("bias", (n,), "int32", self.bias, (np_,)),
            ArgLayout("y", (m, n), "int8", self.y, (m, np_)),
        )


def _up(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def gemm_entry(symbol: str, m: int, n: int, k: int) -> EntryPoint:
    """The entry point of a GEMM program (or of a reference with the same args)."""
    return EntryPoint(
        symbol,
        "",
        (
            TensorSpec("x", (m, k), "int8", ArgRole.INPUT),
            TensorSpec("w", (n, k), "int8", ArgRole.INPUT),
            TensorSpec("bias", (n,), "int32", ArgRole.INPUT),
            TensorSpec("y", (m, n), "int8", ArgRole.OUTPUT),
        ),
        flop=2.0 * m * n * k,
    )


def program_artifact(
    programs: dict[str, Program], shapes: dict[str, tuple[int, int, int]]
) -> tuple[bytes, ArtifactMeta]:
    """An ACCEL_PROGRAM artifact of GEMM programs, with entries of `shapes[symbol]` = (m, n, k)."""
    data = encode_programs(programs)
    meta = ArtifactMeta(
        sha256=hashlib.sha256(data).hexdigest(),
        format="ACCEL_PROGRAM",
        target="vta",
        entries=tuple(gemm_entry(s, *shapes[s]) for s in programs),
        size_bytes=len(data),
    )
    return data, meta


REFERENCE_C = r"""
#include <stdint.h>
int32_t %(symbol)s(void **args) {
  const int8_t *x = args[0], *w = args[1];
  const int32_t *bias = args[2];
  int8_t *y = args[3];
  for (int i = 0; i < %(m)d; i++)
    for (int j = 0; j < %(n)d; j++) {
      uint32_t acc = (uint32_t)bias[j];
      for (int k = 0; k < %(k)d; k++) acc += (uint32_t)(x[i * %(k)d + k] * w[j * %(k)d + k]);
      int32_t v = (int32_t)acc;
      v = v < 0 ? 0 : v >> %(shift)d;
      y[i * %(n)d + j] = (int8_t)(v > 127 ? 127 : v);
    }
  return 0;
}
"""


def build_gemm_reference(
    directory: str, m: int, n: int, k: int, shift: int = 2, symbol: str = "gemm_ref"
) -> tuple[bytes, ArtifactMeta]:
    """A host shared object computing `gemm_reference` (entry `symbol`), and its meta."""
    source = os.path.join(directory, f"{symbol}.c")
    output = os.path.join(directory, f"{symbol}.so")
    with open(source, "w", encoding="utf-8") as f:
        f.write(REFERENCE_C % {"symbol": symbol, "m": m, "n": n, "k": k, "shift": shift})
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", "-o", output, source],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with open(output, "rb") as f:
        data = f.read()
    meta = ArtifactMeta(
        sha256=hashlib.sha256(data).hexdigest(),
        format="SHARED_OBJECT",
        target="host",
        entries=(gemm_entry(symbol, m, n, k),),
        size_bytes=len(data),
    )
    return data, meta

"""The VTA-like accelerator: its parameterised spec and its instruction set, encoded bit for bit.

This is a wire contract (an ACCEL_PROGRAM artifact is a `protos.vta_program` container of these
instructions), so it lives with the other contracts and imports only the standard library: the
agent's simulator decodes what a code generator encodes. `device_agent/backends/vta_sim.c`
decodes the same bits; a change here is a change there.

The machine (VTA's decoupled access-execute design): three modules run concurrently, each over its
own in-order instruction queue, fed in program order by a fetch stage.

    load     LOAD into INP / WGT                        (DRAM -> input, weight buffers)
    compute  LOAD into UOP / ACC, GEMM, ALU, FINISH      (micro-ops and accumulators are its own)
    store    STORE from ACC, narrowed to int8           (accumulator buffer -> DRAM)

Neighbours talk through four dependency-token queues: load->compute, compute->load,
compute->store, store->compute. Every instruction carries four flags: `pop_prev` / `pop_next`
wait for (and take) a token from the previous / next module before it starts; `push_prev` /
`push_next` give one after it ends. load has no previous and store no next module, so those flags
are invalid there.

Buffers hold entries, and every address (SRAM index, DRAM address, micro-op field) counts entries
of its buffer, never bytes:

    INP  batch x block_in   int8      WGT  block_out x block_in int8 (row o is output o)
    ACC  batch x block_out  int32     UOP  one 32-bit micro-op
    DRAM address of a LOAD counts entries of the destination buffer; of a STORE, entries of
    batch x block_out int8 (what an ACC entry narrows to, by keeping the low 8 bits).

Instructions are 128 bits, little-endian (two uint64, low word first). Bit fields, from bit 0:

    all      opcode:3  pop_prev:1  pop_next:1  push_prev:1  push_next:1
    LOAD(0), STORE(1)
             buffer:3  sram_base:16  dram_base:32  y_size:16  x_size:16  x_stride:16
             y_pad_0:4  y_pad_1:4  x_pad_0:4  x_pad_1:4          (STORE: ACC only, pads 0)
    GEMM(2)  reset:1  uop_bgn:13  uop_end:14  iter_out:14  iter_in:14
             dst_factor_out:11 dst_factor_in:11 src_factor_out:11 src_factor_in:11
             wgt_factor_out:10 wgt_factor_in:10
    ALU(3)   alu_op:3  use_imm:1  imm:16 (two's complement)  uop_bgn:13  uop_end:14
             iter_out:14  iter_in:14  dst_factor_out:11 dst_factor_in:11
             src_factor_out:11 src_factor_in:11
    FINISH(4)
    opcodes 5..7 are unknown; unused high bits are ignored.

A micro-op is 32 bits: dst:11 (ACC index) src:11 (INP index for GEMM, ACC for ALU) wgt:10.

LOAD writes a (y_pad_0 + y_size + y_pad_1) x (x_pad_0 + x_size + x_pad_1) block of entries,
row-major from `sram_base`, the inner y_size x x_size from DRAM rows `x_stride` entries apart
starting at `dram_base`, the pad ring zeros. STORE writes y_size x x_size ACC entries, row-major
from `sram_base`, to DRAM rows `x_stride` apart. GEMM and ALU run the loop nest

    for i in range(iter_out): for j in range(iter_in): for u in uops[uop_bgn:uop_end]:
        dst = u.dst + i * dst_factor_out + j * dst_factor_in    (and src, wgt alike)

GEMM: acc[dst] = 0 when `reset`, else acc[dst] += inp[src] @ wgt[wgt].T (int32, wrapping).
ALU on each int32 lane, with b = imm or acc[src]: ADD a+b (wrapping), MAX, MIN, SHR a >> b
(arithmetic; b < 0 shifts left by -b; shift counts clamp at 31).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

# The compiler target of programs for this accelerator: an ACCEL_PROGRAM artifact's `target`,
# and what a device tagged arch=vta (the vta_sim backend) runs.
VTA_TARGET = "vta"
INSN_BYTES = 16
UOP_BYTES = 4
ACC_ELEM_BYTES = 4  # int32 accumulators


class Opcode(enum.IntEnum):
    LOAD = 0
    STORE = 1
    GEMM = 2
    ALU = 3
    FINISH = 4


class Buffer(enum.IntEnum):
    """On-chip buffers, by their ids in LOAD / STORE."""

    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3


class AluOp(enum.IntEnum):
    MIN = 0
    MAX = 1
    ADD = 2
    SHR = 3


class Module(enum.IntEnum):
    """The three concurrent modules, in pipeline order (load is compute's previous)."""

    LOAD = 0
    COMPUTE = 1
    STORE = 2


# Widest index each micro-op / loop field can hold: a spec's buffer depths must fit them.
MAX_INP_DEPTH = 1 << 11
MAX_ACC_DEPTH = 1 << 11
MAX_WGT_DEPTH = 1 << 10
MAX_UOP_DEPTH = 1 << 13


@dataclass(frozen=True)
class VtaSpec:
    """The accelerator's parameters. Sizes in bytes, times in cycles of its clock.

    Attributes:
        batch, block_in, block_out: the GEMM block: (batch x block_in) @ (block_in x block_out)
            int8 into int32 accumulators, one micro-op iteration per `gemm_cycles_per_uop`.
        inp_buffer_bytes, wgt_buffer_bytes, acc_buffer_bytes, uop_buffer_bytes: on-chip buffers.
        dram_bytes_per_cycle: the DRAM channel's bandwidth, shared by all three modules.
        dram_latency_cycles: from a DMA's last byte on the channel to its completion.
        gemm_cycles_per_uop, alu_cycles_per_uop: issue interval of the compute pipelines.
        insn_overhead_cycles: fetch and decode of each instruction in its module.
        clock_mhz: the clock that converts cycles to seconds.
    """

    batch: int = 1
    block_in: int = 16
    block_out: int = 16
    inp_buffer_bytes: int = 32 * 1024
    wgt_buffer_bytes: int = 256 * 1024
    acc_buffer_bytes: int = 128 * 1024
    uop_buffer_bytes: int = 32 * 1024
    dram_bytes_per_cycle: int = 8
    dram_latency_cycles: int = 64
    gemm_cycles_per_uop: int = 1
    alu_cycles_per_uop: int = 1
    insn_overhead_cycles: int = 4
    clock_mhz: int = 100

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name in _MAY_BE_ZERO else 1
            if not isinstance(value, int) or not low <= value < 1 << 32:
                raise ValueError(f"spec {f.name} must be an integer {low}..2**32-1, got {value!r}")
        for name, entry, limit in (
            ("inp", self.inp_entry_bytes, MAX_INP_DEPTH),
            ("wgt", self.wgt_entry_bytes, MAX_WGT_DEPTH),
            ("acc", self.acc_entry_bytes, MAX_ACC_DEPTH),
            ("uop", UOP_BYTES, MAX_UOP_DEPTH),
        ):
            size = getattr(self, f"{name}_buffer_bytes")
            if size % entry or not 1 <= size // entry <= limit:
                raise ValueError(
                    f"spec {name}_buffer_bytes must be 1..{limit} entries of {entry} bytes, "
                    f"got {size}"
                )

    @property
    def inp_entry_bytes(self) -> int:
        return self.batch * self.block_in

    @property
    def wgt_entry_bytes(self) -> int:
        return self.block_out * self.block_in

    @property
    def acc_entry_bytes(self) -> int:
        return self.batch * self.block_out * ACC_ELEM_BYTES

    @property
    def out_entry_bytes(self) -> int:
        """Bytes of a STORE's DRAM entry: one ACC entry narrowed to int8."""
        return self.batch * self.block_out

    def entry_bytes(self, buffer: Buffer) -> int:
        """Bytes of one entry of `buffer`, on chip and in DRAM."""
        return {
            Buffer.UOP: UOP_BYTES,
            Buffer.WGT: self.wgt_entry_bytes,
            Buffer.INP: self.inp_entry_bytes,
            Buffer.ACC: self.acc_entry_bytes,
        }[buffer]

    def depth(self, buffer: Buffer) -> int:
        """Entries `buffer` holds."""
        size = {
            Buffer.UOP: self.uop_buffer_bytes,
            Buffer.WGT: self.wgt_buffer_bytes,
            Buffer.INP: self.inp_buffer_bytes,
            Buffer.ACC: self.acc_buffer_bytes,
        }[buffer]
        return size // self.entry_bytes(buffer)

    def key(self) -> str:
        """A short name of the spec for device tags: equal keys mean equal specs."""
        return "-".join(str(getattr(self, f.name)) for f in fields(self))

    @classmethod
    def from_key(cls, key: str) -> VtaSpec:
        """The spec whose `key` is `key`.

        Raises:
            ValueError: `key` is not one (wrong count of fields, not integers, or a spec
                `__post_init__` refuses).
        """
        parts = key.split("-")
        names = [f.name for f in fields(cls)]
        if len(parts) != len(names) or not all(p.isdigit() for p in parts):
            raise ValueError(f"{key!r} is not a VTA spec key ({len(names)} integers joined by -)")
        return cls(*(int(p) for p in parts))

    def values(self) -> tuple[int, ...]:
        """The fields in declaration order (the container's and the simulator's order)."""
        return tuple(getattr(self, f.name) for f in fields(self))


_MAY_BE_ZERO = frozenset(
    {"dram_latency_cycles", "gemm_cycles_per_uop", "alu_cycles_per_uop", "insn_overhead_cycles"}
)


@dataclass(frozen=True)
class Deps:
    """Dependency-token flags: wait for / give a token to the previous / next module."""

    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False


NO_DEPS = Deps()


@dataclass(frozen=True)
class Load:
    """2-D strided DMA from DRAM into `buffer`, with a ring of zero padding."""

    opcode: ClassVar[Opcode] = Opcode.LOAD
    buffer: Buffer
    sram_base: int
    dram_base: int
    y_size: int
    x_size: int
    x_stride: int
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0
    deps: Deps = NO_DEPS


@dataclass(frozen=True)
class Store:
    """2-D strided DMA of ACC entries, narrowed to int8, into DRAM (`buffer` must be ACC)."""

    opcode: ClassVar[Opcode] = Opcode.STORE
    buffer: Buffer
    sram_base: int
    dram_base: int
    y_size: int
    x_size: int
    x_stride: int
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0
    deps: Deps = NO_DEPS


@dataclass(frozen=True)
class Gemm:
    """acc[dst] (+)= inp[src] @ wgt[wgt].T over a two-level micro-op loop nest (see module doc)."""

    opcode: ClassVar[Opcode] = Opcode.GEMM
    uop_bgn: int
    uop_end: int
    iter_out: int = 1
    iter_in: int = 1
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0
    reset: bool = False
    deps: Deps = NO_DEPS


@dataclass(frozen=True)
class Alu:
    """acc[dst] = op(acc[dst], imm or acc[src]) over a two-level micro-op loop nest."""

    opcode: ClassVar[Opcode] = Opcode.ALU
    op: AluOp
    uop_bgn: int
    uop_end: int
    iter_out: int = 1
    iter_in: int = 1
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0
    use_imm: bool = False
    imm: int = 0
    deps: Deps = NO_DEPS


@dataclass(frozen=True)
class Finish:
    """The end of the program (compute module)."""

    opcode: ClassVar[Opcode] = Opcode.FINISH
    deps: Deps = NO_DEPS


@dataclass(frozen=True)
class Unknown:
    """An instruction word whose opcode this ISA does not define, kept bit for bit."""

    word: int
    deps: Deps = field(default=NO_DEPS, compare=False)

    @property
    def opcode(self) -> int:
        return self.word & 0x7


Insn = Load | Store | Gemm | Alu | Finish | Unknown


@dataclass(frozen=True)
class Uop:
    """One micro-op: base indices into ACC (dst), INP or ACC (src) and WGT (wgt)."""

    dst: int
    src: int = 0
    wgt: int = 0


# (field, first bit, width) per instruction kind, after the 7 common bits.
_MEM_FIELDS = (
    ("buffer", 7, 3),
    ("sram_base", 10, 16),
    ("dram_base", 26, 32),
    ("y_size", 58, 16),
    ("x_size", 74, 16),
    ("x_stride", 90, 16),
    ("y_pad_0", 106, 4),
    ("y_pad_1", 110, 4),
    ("x_pad_0", 114, 4),
    ("x_pad_1", 118, 4),
)
_LOOP_FIELDS = (
    ("iter_out", 14),
    ("iter_in", 14),
    ("dst_factor_out", 11),
    ("dst_factor_in", 11),
    ("src_factor_out", 11),
    ("src_factor_in", 11),
)
_GEMM_FIELDS = (
    ("reset", 7, 1),
    ("uop_bgn", 8, 13),
    ("uop_end", 21, 14),
    *(
        (name, lo, width)
        for (name, width), lo in zip(_LOOP_FIELDS, (35, 49, 63, 74, 85, 96), strict=True)
    ),
    ("wgt_factor_out", 107, 10),
    ("wgt_factor_in", 117, 10),
)
_ALU_FIELDS = (
    ("op", 7, 3),
    ("use_imm", 10, 1),
    ("imm", 11, 16),
    ("uop_bgn", 27, 13),
    ("uop_end", 40, 14),
    *(
        (name, lo, width)
        for (name, width), lo in zip(_LOOP_FIELDS, (54, 68, 82, 93, 104, 115), strict=True)
    ),
)
_FIELDS: dict[Opcode, tuple[tuple[str, int, int], ...]] = {
    Opcode.LOAD: _MEM_FIELDS,
    Opcode.STORE: _MEM_FIELDS,
    Opcode.GEMM: _GEMM_FIELDS,
    Opcode.ALU: _ALU_FIELDS,
    Opcode.FINISH: (),
}
_CLASSES: dict[Opcode, type] = {
    Opcode.LOAD: Load,
    Opcode.STORE: Store,
    Opcode.GEMM: Gemm,
    Opcode.ALU: Alu,
    Opcode.FINISH: Finish,
}
_DEP_BITS = (("pop_prev", 3), ("pop_next", 4), ("push_prev", 5), ("push_next", 6))
_IMM_BITS = 16


def encode_insn(insn: Insn) -> bytes:
    """The instruction's 16 bytes.

    Raises:
        ValueError: a field does not fit its bits (the message names it).
    """
    if isinstance(insn, Unknown):
        if not 0 <= insn.word < 1 << 128:
            raise ValueError("an instruction word is 128 bits")
        return insn.word.to_bytes(INSN_BYTES, "little")
    word = int(insn.opcode)
    for name, bit in _DEP_BITS:
        word |= int(getattr(insn.deps, name)) << bit
    for name, lo, width in _FIELDS[insn.opcode]:
        value = int(getattr(insn, name))
        if name == "imm":
            if not -(1 << (width - 1)) <= value < 1 << (width - 1):
                raise ValueError(f"{type(insn).__name__}.imm {value} does not fit int{width}")
            value &= (1 << width) - 1
        elif not 0 <= value < 1 << width:
            raise ValueError(f"{type(insn).__name__}.{name} {value} does not fit {width} bits")
        word |= value << lo
    return word.to_bytes(INSN_BYTES, "little")


def decode_insn(data: bytes) -> Insn:
    """The instruction in 16 bytes; an undefined opcode decodes to `Unknown`.

    Raises:
        ValueError: not 16 bytes, or a LOAD/STORE names no buffer or an ALU no operation.
    """
    if len(data) != INSN_BYTES:
        raise ValueError(f"an instruction is {INSN_BYTES} bytes, got {len(data)}")
    word = int.from_bytes(data, "little")
    deps = Deps(**{name: bool(word >> bit & 1) for name, bit in _DEP_BITS})
    try:
        opcode = Opcode(word & 0x7)
    except ValueError:
        return Unknown(word, deps)
    values: dict[str, Any] = {}
    for name, lo, width in _FIELDS[opcode]:
        value = word >> lo & ((1 << width) - 1)
        if name == "imm" and value >= 1 << (width - 1):
            value -= 1 << width
        values[name] = value
    if "buffer" in values:
        values["buffer"] = Buffer(values["buffer"])
    if "op" in values:
        values["op"] = AluOp(values["op"])
    for flag in ("reset", "use_imm"):
        if flag in values:
            values[flag] = bool(values[flag])
    insn: Insn = _CLASSES[opcode](**values, deps=deps)
    return insn


def encode_uop(uop: Uop) -> bytes:
    """The micro-op's 4 bytes.

    Raises:
        ValueError: an index does not fit its bits.
    """
    for name, width in (("dst", 11), ("src", 11), ("wgt", 10)):
        value = getattr(uop, name)
        if not 0 <= value < 1 << width:
            raise ValueError(f"uop {name} {value} does not fit {width} bits")
    return (uop.dst | uop.src << 11 | uop.wgt << 22).to_bytes(UOP_BYTES, "little")


def decode_uop(data: bytes) -> Uop:
    """The micro-op in 4 bytes."""
    word = int.from_bytes(data, "little")
    return Uop(word & 0x7FF, word >> 11 & 0x7FF, word >> 22 & 0x3FF)


def module_of(insn: Insn) -> Module:
    """The module that executes `insn` (an unknown opcode goes nowhere; compute reports it)."""
    if isinstance(insn, Load):
        return Module.LOAD if insn.buffer in (Buffer.INP, Buffer.WGT) else Module.COMPUTE
    if isinstance(insn, Store):
        return Module.STORE
    return Module.COMPUTE


def loop_iterations(insn: Gemm | Alu) -> int:
    """Micro-op iterations of a GEMM or ALU instruction."""
    return insn.iter_out * insn.iter_in * max(insn.uop_end - insn.uop_bgn, 0)


def useful_gemm_cycles(insns: tuple[Insn, ...] | list[Insn], spec: VtaSpec) -> int:
    """Cycles the GEMM core spends multiplying (resets excluded): utilisation's numerator."""
    return spec.gemm_cycles_per_uop * sum(
        loop_iterations(i) for i in insns if isinstance(i, Gemm) and not i.reset
    )


def format_insn(insn: Insn) -> str:
    """One line of disassembly, e.g. `GEMM uop[0:16) 8x4 dst(4,1) src(16,0) wgt(0,16) +pop_prev`."""
    flags = " ".join(f"+{name}" for name, _ in _DEP_BITS if getattr(insn.deps, name))
    if isinstance(insn, Load | Store):
        pads = (insn.y_pad_0, insn.y_pad_1, insn.x_pad_0, insn.x_pad_1)
        pad = f" pad{pads}" if any(pads) else ""
        text = (
            f"{insn.opcode.name} {insn.buffer.name}[{insn.sram_base}] dram[{insn.dram_base}] "
            f"{insn.y_size}x{insn.x_size} stride {insn.x_stride}{pad}"
        )
    elif isinstance(insn, Gemm | Alu):
        name = "GEMM" + (" reset" if insn.reset else "") if isinstance(insn, Gemm) else "ALU"
        if isinstance(insn, Alu):
            operand = f"imm {insn.imm}" if insn.use_imm else "acc"
            name = f"ALU {insn.op.name} {operand}"
        text = (
            f"{name} uop[{insn.uop_bgn}:{insn.uop_end}) {insn.iter_out}x{insn.iter_in} "
            f"dst({insn.dst_factor_out},{insn.dst_factor_in}) "
            f"src({insn.src_factor_out},{insn.src_factor_in})"
        )
        if isinstance(insn, Gemm):
            text += f" wgt({insn.wgt_factor_out},{insn.wgt_factor_in})"
    elif isinstance(insn, Finish):
        text = "FINISH"
    else:
        text = f"UNKNOWN opcode {insn.opcode} word {insn.word:#034x}"
    return f"{text} {flags}".rstrip()

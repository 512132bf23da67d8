"""Instruction streams from lowered loop IR: a TE schedule for the VTA-like accelerator, compiled.

`lower_program(sch, args, layouts)` lowers a schedule whose stages live in the accelerator's
scopes ("vta.inp", "vta.wgt", "vta.acc"; `compiler.ir.buffer.VTA_SCOPES`) into a
`protos.vta_program.Program`:

    loop nest (bound inference, tensorize) -> storage flatten -> virtual threads
    (`compiler.lower.vthread`) -> this walk -> dependency tokens (`vta_deps`) -> program

The walk runs the host side of the stream the way VTA's runtime does: loops that are not part of
an instruction are executed here, with concrete values, and every *perfect* loop nest (loops
around one store or intrinsic call; the same notion the vthread pass keeps whole) becomes
instructions, by what it moves where:

    store into vta.inp / vta.wgt / vta.acc of a parameter's load   LOAD (2-D strided DMA; a
        select(in bounds, load, 0), what an inlined padding stage leaves, gives its zero ring)
    store of 0 into vta.acc                                        GEMM reset
    call of the GEMM intrinsic (`vta_intrin`, tensorize)           GEMM
    store into vta.acc of min / max / shift_right / + chains       ALU, one per operation,
        in place over the chain's first operand (VTA's ALU writes its destination), so the
        stage's buffer takes that operand's entries
    store into a parameter of a vta.acc load                       STORE (narrowed to int8)

Every index must be affine in the nest's loops (`linear_form`). The innermost loops that cover
one buffer entry (16 channels, a 16x16 weight block) must be contiguous on both sides; the other
loops of a DMA merge where their strides allow, the innermost two become the DMA's x and y (row
stride in DRAM, rows dense in SRAM; a tail tile's narrower rows are padded out to the buffer's
row), and any further loop repeats the instruction. For GEMM and ALU the two largest loops become the instruction's hardware loop
nest (iter_out, iter_in, with their factors) and the others are enumerated into its micro-ops;
equal micro-op lists share one slice of the table, which a LOAD of UOP brings in first. On-chip buffers get static entry ranges, one per buffer
(per thread after the vthread pass): the stream never reuses a region for two buffers.

Limits that raise `VtaLowerError` (a ValueError): a statement that is none of the above, an index
that is not affine, a buffer that overflows its on-chip memory, a field that does not fit.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from compiler.arith import linear_form
from compiler.codegen.vta_deps import insert_tokens
from compiler.codegen.vta_intrin import GEMM_INTRIN
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer as IrBuffer
from compiler.ir.function import PrimFunc
from compiler.ir.interpreter import BINARY_OPS
from compiler.ir.stmt import Allocate, Barrier, For, IfThenElse, IntrinCall, Seq, Stmt, Store
from compiler.lower.flatten import flatten
from compiler.lower.loop_nest import build_loop_nest
from compiler.lower.vthread import inject_virtual_threads, is_perfect_nest
from compiler.schedule.schedule import Schedule
from compiler.te.tensor import Tensor
from protos.vta import (
    UOP_BYTES,
    Alu,
    AluOp,
    Buffer,
    Finish,
    Gemm,
    Insn,
    Load,
    Uop,
    VtaSpec,
)
from protos.vta import (
    Store as StoreInsn,
)
from protos.vta_program import ArgLayout, Program

_ALIGN = 4096  # DRAM regions start on this, a multiple of every entry size
_SCOPE_BUFFER = {"vta.inp": Buffer.INP, "vta.wgt": Buffer.WGT, "vta.acc": Buffer.ACC}
# Widths of GEMM / ALU loop fields: iterations, and dst / src / wgt factors.
_ITER_LIMIT = 1 << 14
_FACTOR_LIMIT = {"dst": 1 << 11, "src": 1 << 11, "wgt": 1 << 10}
_MAX_PAD = 15


class VtaLowerError(ValueError):
    """A lowered function the instruction-stream generator cannot express."""


def lower_vta(sch: Schedule, args: Sequence[Tensor], name: str) -> PrimFunc:
    """The loop IR the stream is generated from: nest, flatten, virtual threads."""
    nest = build_loop_nest(sch, args, name)
    return inject_virtual_threads(flatten(PrimFunc(name, nest.params, nest.body)))


def lower_program(
    sch: Schedule,
    args: Sequence[Tensor],
    layouts: Sequence[ArgLayout],
    spec: VtaSpec | None = None,
    name: str = "vta_kernel",
) -> Program:
    """The program computing `sch` over parameters `args` (inputs, then the output).

    `layouts[i]` says how the entry's i-th argument becomes `args[i]`'s DRAM bytes (its offset
    is ignored: the generator places the arguments).

    Raises:
        VtaLowerError: the module docstring's limits.
    """
    spec = spec or VtaSpec()
    func = lower_vta(sch, args, name)
    if len(layouts) != len(func.params):
        raise VtaLowerError(f"{len(layouts)} layouts for {len(func.params)} arguments")
    offset, placed = 0, []
    for buf, layout in zip(func.params, layouts, strict=True):
        if layout.nbytes() != buf.nbytes:
            raise VtaLowerError(
                f"argument {buf.name}: layout of {layout.nbytes()} bytes for {buf.nbytes}"
            )
        placed.append(replace(layout, offset=offset))
        offset = _up(offset + buf.nbytes)
    walker = _Walker(spec, {b: p.offset for b, p in zip(func.params, placed, strict=True)})
    walker.visit(func.body)
    uop_offset = offset
    uops = tuple(walker.uops)
    if len(uops) > spec.depth(Buffer.UOP):
        raise VtaLowerError(f"UOP needs {len(uops)} entries, the buffer holds "
                            f"{spec.depth(Buffer.UOP)}")  # fmt: skip
    insns: list[Insn] = []
    if uops:
        insns.append(Load(Buffer.UOP, 0, uop_offset // UOP_BYTES, 1, len(uops), len(uops)))
    insns += walker.insns
    insns.append(Finish())
    dram = _up(uop_offset + len(uops) * UOP_BYTES)
    return Program(spec, insert_tokens(insns, uops), uops, dram, uop_offset, tuple(placed))


def _up(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _eval(e: E.Expr, env: dict[E.Var, int]) -> int:
    """An index expression's value (host-side loops are plain integers)."""
    kind = type(e)
    if kind is E.IntImm:
        return e.value  # type: ignore[attr-defined]
    if kind is E.Var:
        return env[e]  # type: ignore[index]
    op = BINARY_OPS.get(kind)
    if op is not None:
        return int(op(_eval(e.a, env), _eval(e.b, env)))  # type: ignore[attr-defined]
    if kind is E.Cast:
        return _eval(e.value, env)  # type: ignore[attr-defined]
    if kind is E.Not:
        return int(not _eval(e.a, env))  # type: ignore[attr-defined]
    if kind is E.Select:
        s: E.Select = e  # type: ignore[assignment]
        return _eval(s.true_value if _eval(s.condition, env) else s.false_value, env)
    raise VtaLowerError(f"index expression {e} is not one the host side evaluates")


@dataclass
class _Loop:
    """One loop of a nest as an instruction sees it: extent, strides per operand (entries)."""

    var: E.Var
    extent: int
    strides: dict[str, int]
    lo: int = 0  # valid range [lo, hi) under a padding condition
    hi: int = -1

    def __post_init__(self) -> None:
        if self.hi < 0:
            self.hi = self.extent

    @property
    def full(self) -> bool:
        return self.lo == 0 and self.hi == self.extent


class _Walker:
    """Runs the host side of the loop IR and collects instructions and micro-ops."""

    def __init__(self, spec: VtaSpec, dram: dict[IrBuffer, int]) -> None:
        self.spec = spec
        self.dram = dram
        self.env: dict[E.Var, int] = {}
        self.insns: list[Insn] = []
        self.uops: list[Uop] = []
        self.uop_slices: dict[tuple[Uop, ...], int] = {}
        self.sram: dict[IrBuffer, int] = {}
        self.free = dict.fromkeys(Buffer, 0)
        # Keyed by id: the expressions live as long as the function (or in `derived`).
        self.forms: dict[tuple[int, int], tuple[int, E.Expr] | None] = {}
        self.derived: dict[int, E.Expr] = {}
        self.elems = {
            Buffer.INP: spec.inp_entry_bytes,  # int8 elements
            Buffer.WGT: spec.wgt_entry_bytes,
            Buffer.ACC: spec.batch * spec.block_out,
        }

    # -- the host side ----------------------------------------------------------------------

    def visit(self, s: Stmt) -> None:
        if isinstance(s, For) and not is_perfect_nest(s):
            for value in range(_eval(s.extent, self.env)):
                self.env[s.var] = value
                self.visit(s.body)
            self.env.pop(s.var, None)
        elif isinstance(s, Seq):
            for child in s.stmts:
                self.visit(child)
        elif isinstance(s, Allocate):
            self.visit(s.body)
        elif isinstance(s, IfThenElse):
            if _eval(s.condition, self.env):
                self.visit(s.then_case)
            elif s.else_case is not None:
                self.visit(s.else_case)
        elif isinstance(s, Barrier):
            pass
        else:
            self.instruction(s)

    def instruction(self, s: Stmt) -> None:
        """The instructions of perfect nest `s`."""
        loops: list[tuple[E.Var, int]] = []
        while isinstance(s, For):
            inner = {v for v, _ in loops}
            if E.free_vars(s.extent) & inner:
                raise VtaLowerError(f"loop {s.var.name}: extent depends on its own nest")
            loops.append((s.var, _eval(s.extent, self.env)))
            s = s.body
        if any(n <= 0 for _, n in loops):
            return
        if isinstance(s, IntrinCall) and s.name.startswith(GEMM_INTRIN):
            self.gemm(loops, s)
            return
        if not isinstance(s, Store):
            raise VtaLowerError(f"no instruction does {type(s).__name__} {s}")
        scope = s.buffer.scope
        value = s.value
        while isinstance(value, E.Cast):
            value = value.value
        if scope in ("vta.inp", "vta.wgt") or (scope == "vta.acc" and _source(value)):
            self.dma_load(_SCOPE_BUFFER[scope], loops, s)
        elif scope == "vta.acc" and isinstance(value, E.IntImm) and value.value == 0:
            self.gemm_reset(loops, s)
        elif scope == "vta.acc":
            self.alu(loops, s, value)
        elif (
            s.buffer in self.dram and isinstance(value, E.Load) and value.buffer.scope == "vta.acc"
        ):
            self.store(loops, s, value)
        else:
            raise VtaLowerError(f"no instruction stores {s.value} into {s.buffer.name}")

    # -- indices ------------------------------------------------------------------------------

    def affine(self, expr: E.Expr, loops: Sequence[tuple[E.Var, int]]) -> tuple[int, list[int]]:
        """(value with the nest's loops at 0, stride of each loop) of an index expression."""
        strides = []
        for var, _ in loops:
            key = (id(expr), id(var))
            if key not in self.forms:
                self.forms[key] = linear_form(expr, var)
            form = self.forms[key]
            if form is None:
                raise VtaLowerError(f"index {expr} is not affine in loop {var.name}")
            strides.append(form[0])
        env = dict(self.env)
        env.update((var, 0) for var, _ in loops)
        return _eval(expr, env), strides

    def address(self, buf: IrBuffer, kind: Buffer) -> int:
        """The first entry of on-chip buffer `buf` (given one on first use)."""
        if buf not in self.sram:
            entries = -(-buf.size // self.elems[kind])
            self.sram[buf] = self.free[kind]
            self.free[kind] += entries
            if self.free[kind] > self.spec.depth(kind):
                raise VtaLowerError(
                    f"{kind.name} needs {self.free[kind]} entries, the buffer holds "
                    f"{self.spec.depth(kind)} (at {buf.name})"
                )
        return self.sram[buf]

    def entry_loops(
        self, loops: list[tuple[E.Var, int]], strides: dict[str, list[int]], elems: int, what: str
    ) -> list[_Loop]:
        """The nest's loops outside one entry, strides in entries; checks the entry's loops."""
        span, n = 1, len(loops)
        while span < elems and n > 0:
            n -= 1
            for side in strides.values():
                if side[n] != span:
                    raise VtaLowerError(f"{what}: an entry's elements are not contiguous")
            span *= loops[n][1]
        if span != elems:
            raise VtaLowerError(f"{what}: the innermost loops cover {span} elements, not an entry")
        out = []
        for i in range(n):
            if any(side[i] % elems for side in strides.values()):
                raise VtaLowerError(f"{what}: loop {loops[i][0].name} moves within an entry")
            out.append(
                _Loop(loops[i][0], loops[i][1], {k: v[i] // elems for k, v in strides.items()})
            )
        return out

    # -- DMA ----------------------------------------------------------------------------------

    def dma_load(self, kind: Buffer, loops: list[tuple[E.Var, int]], s: Store) -> None:
        value = s.value
        while isinstance(value, E.Cast):
            value = value.value
        load, cond = _source(value) or (None, None)
        assert load is not None
        elems = self.elems[kind]
        entry_bytes = self.spec.entry_bytes(kind)
        dst0, dst = self.affine(s.index, loops)
        index = load.index
        if cond is not None:  # where the condition holds, a padded read's clamps do nothing
            index = self.derived.setdefault(id(index), _unclamped(index))
        src0, src = self.affine(index, loops)
        outer = self.entry_loops(loops, {"sram": dst, "dram": src}, elems, f"load {s.buffer.name}")
        if dst0 % elems or src0 % elems or self.dram[load.buffer] % entry_bytes:
            raise VtaLowerError(f"load {s.buffer.name}: regions not aligned to entries")
        valid = self.valid_ranges(cond, outer) if cond is not None else True
        sram = self.address(s.buffer, kind) + dst0 // elems
        dram = self.dram[load.buffer] // entry_bytes + src0 // elems
        end = self.address(s.buffer, kind) + -(-s.buffer.size // elems)
        self.dma(kind, outer, sram, dram, valid, end)

    def valid_ranges(self, cond: E.Expr, loops: list[_Loop]) -> bool:
        """Narrow each loop's valid range by the padding condition; False: nothing is valid."""
        atoms: list[E.Expr] = []
        todo = [cond]
        while todo:
            c = todo.pop()
            if isinstance(c, E.And):
                todo += [c.a, c.b]
            else:
                atoms.append(c)
        nest = [(loop.var, loop.extent) for loop in loops]
        for atom in atoms:
            if not isinstance(atom, E.LT | E.LE):
                raise VtaLowerError(f"padding condition {atom} is not a bound")
            need = 1 if isinstance(atom, E.LT) else 0  # b - a >= need
            diff = self.derived.setdefault(id(atom), E.Sub(atom.b, atom.a))
            base, strides = self.affine(diff, nest)
            moving = [(i, coef) for i, coef in enumerate(strides) if coef]
            if len(moving) > 1:
                raise VtaLowerError(f"padding condition {atom} bounds two loops at once")
            if not moving:
                if base < need:
                    return False
                continue
            i, coef = moving[0]
            loop = loops[i]
            if coef > 0:
                loop.lo = max(loop.lo, -((base - need) // coef))
            else:
                loop.hi = min(loop.hi, (base - need) // -coef + 1)
        return all(loop.lo < loop.hi for loop in loops)

    def dma(
        self, kind: Buffer, loops: list[_Loop], sram: int, dram: int, valid: bool, end: int
    ) -> None:
        """LOADs of `loops` (strides "sram" and "dram") from the given first entries."""
        loops = _merged([loop for loop in loops if loop.extent > 1], ("sram", "dram"))
        x = loops.pop() if loops and loops[-1].strides == {"sram": 1, "dram": 1} else None
        x_ext = x.extent if x else 1
        y = loops.pop() if x and loops and loops[-1].strides["sram"] >= x_ext else None
        extra = 0
        if x is not None and y is not None:
            # Rows sit `row` entries apart in SRAM: a narrower (tail) block pads each row out to
            # it with zeros that nothing reads, when the pad field and the buffer allow.
            row = y.strides["sram"]
            if x_ext - x.hi + row - x_ext <= _MAX_PAD and sram + y.extent * row <= end:
                extra = row - x_ext
            else:
                loops.append(y)  # one LOAD per row
                y = None
        xlo, xhi = (x.lo, x.hi) if x else (0, 1)
        ylo, yhi, rows, stride = (y.lo, y.hi, y.extent, y.strides["dram"]) if y else (0, 1, 1, 1)
        ranges = [range(loop.extent) for loop in loops]
        for values in itertools.product(*ranges):
            at_sram, at_dram, inside = sram, dram, valid
            for v, loop in zip(values, loops, strict=True):
                at_sram += v * loop.strides["sram"]
                at_dram += v * loop.strides["dram"]
                inside = inside and loop.lo <= v < loop.hi
            if inside and ylo < yhi and xlo < xhi:
                self.emit_load(kind, at_sram, at_dram + ylo * stride + xlo, yhi - ylo, xhi - xlo,
                               stride, ylo, rows - yhi, xlo, x_ext - xhi + extra)  # fmt: skip
            else:
                self.emit_load(kind, at_sram, 0, 0, 0, 1, 0, rows, 0, x_ext + extra)

    def emit_load(
        self, kind: Buffer, sram: int, dram: int, y_size: int, x_size: int, stride: int,
        y_pad_0: int, y_pad_1: int, x_pad_0: int, x_pad_1: int,
    ) -> None:  # fmt: skip
        pads = (y_pad_0, y_pad_1, x_pad_0, x_pad_1)
        if max(pads) > _MAX_PAD:
            raise VtaLowerError(f"a LOAD needs pads {pads}: at most {_MAX_PAD} entries each")
        if y_size == 0 or x_size == 0:
            # Nothing from DRAM: the block is all padding; keep its shape in the pads.
            rows, cols = y_pad_0 + y_size + y_pad_1, x_pad_0 + x_size + x_pad_1
            y_size, x_size, y_pad_0, y_pad_1, x_pad_0, x_pad_1 = 0, cols, rows, 0, 0, 0
            dram, stride = 0, max(cols, 1)
            if rows > _MAX_PAD:
                raise VtaLowerError(f"an all-padding LOAD of {rows} rows")
        self.insns.append(
            Load(kind, sram, dram, y_size, x_size, max(stride, x_size), y_pad_0, y_pad_1, x_pad_0,
                 x_pad_1)
        )  # fmt: skip

    def store(self, loops: list[tuple[E.Var, int]], s: Store, load: E.Load) -> None:
        elems = self.elems[Buffer.ACC]
        entry_bytes = self.spec.out_entry_bytes
        dst0, dst = self.affine(s.index, loops)
        src0, src = self.affine(load.index, loops)
        outer = self.entry_loops(loops, {"sram": src, "dram": dst}, elems, f"store {s.buffer.name}")
        if dst0 % elems or src0 % elems or self.dram[s.buffer] % entry_bytes:
            raise VtaLowerError(f"store {s.buffer.name}: regions not aligned to entries")
        sram = self.address(load.buffer, Buffer.ACC) + src0 // elems
        dram = self.dram[s.buffer] // entry_bytes + dst0 // elems
        loops2 = _merged([loop for loop in outer if loop.extent > 1], ("sram", "dram"))
        x = loops2.pop() if loops2 and loops2[-1].strides == {"sram": 1, "dram": 1} else None
        x_ext = x.extent if x else 1
        y = loops2.pop() if x and loops2 and loops2[-1].strides["sram"] == x_ext else None
        for values in itertools.product(*(range(loop.extent) for loop in loops2)):
            at_sram = sram + sum(
                v * lp.strides["sram"] for v, lp in zip(values, loops2, strict=True)
            )
            at_dram = dram + sum(
                v * lp.strides["dram"] for v, lp in zip(values, loops2, strict=True)
            )
            rows, stride = (y.extent, y.strides["dram"]) if y else (1, x_ext)
            self.insns.append(
                StoreInsn(Buffer.ACC, at_sram, at_dram, rows, x_ext, max(stride, x_ext))
            )

    # -- GEMM and ALU -------------------------------------------------------------------------

    def gemm(self, loops: list[tuple[E.Var, int]], call: IntrinCall) -> None:
        (acc, acc_off, acc_st), (inp, inp_off, inp_st), (wgt, wgt_off, wgt_st) = call.operands
        bi = self.spec.block_in
        if acc_st != (1,) or inp_st != (1,) or wgt_st != (bi, 1):
            raise VtaLowerError(f"GEMM operands not in entry layout: {acc_st} {inp_st} {wgt_st}")
        bases, strides = {}, {}
        for field, buf, off, kind in (
            ("dst", acc, acc_off, Buffer.ACC),
            ("src", inp, inp_off, Buffer.INP),
            ("wgt", wgt, wgt_off, Buffer.WGT),
        ):
            elems = self.elems[kind]
            base, st = self.affine(off, loops)
            if base % elems or any(v % elems for v in st):
                raise VtaLowerError(f"GEMM operand {buf.name} not aligned to entries")
            bases[field] = self.address(buf, kind) + base // elems
            strides[field] = [v // elems for v in st]
        nest = [
            _Loop(var, n, {f: strides[f][i] for f in strides}) for i, (var, n) in enumerate(loops)
        ]
        fields, begin, end = self.uop_nest(nest, bases)
        self.insns.append(replace(Gemm(begin, end), **fields))

    def gemm_reset(self, loops: list[tuple[E.Var, int]], s: Store) -> None:
        elems = self.elems[Buffer.ACC]
        base, st = self.affine(s.index, loops)
        outer = self.entry_loops(loops, {"dst": st}, elems, f"reset {s.buffer.name}")
        fields, begin, end = self.uop_nest(
            outer, {"dst": self.address(s.buffer, Buffer.ACC) + base // elems}
        )
        self.insns.append(replace(Gemm(begin, end, reset=True), **fields))

    def alu(self, loops: list[tuple[E.Var, int]], s: Store, value: E.Expr) -> None:
        first, ops = _alu_chain(value)
        if first.buffer.scope != "vta.acc":
            raise VtaLowerError(f"ALU chain of {s.buffer.name} starts from {first.buffer.name}")
        elems = self.elems[Buffer.ACC]
        dst0, dst = self.affine(s.index, loops)
        src0, src = self.affine(first.index, loops)
        if dst != src:
            raise VtaLowerError(f"ALU stage {s.buffer.name} is not elementwise over its operand")
        at = self.address(first.buffer, Buffer.ACC) + (src0 - dst0) // elems
        if (src0 - dst0) % elems:
            raise VtaLowerError(f"ALU stage {s.buffer.name}: operand not aligned to entries")
        if s.buffer not in self.sram:
            self.sram[s.buffer] = at  # in place over the first operand
        elif self.sram[s.buffer] != at:
            raise VtaLowerError(f"ALU stage {s.buffer.name} cannot run in place")
        dst_base = at + dst0 // elems
        for op, operand in ops:
            strides = {"dst": dst}
            bases = {"dst": dst_base}
            if isinstance(operand, E.Load):
                if operand.buffer.scope != "vta.acc":
                    raise VtaLowerError(f"ALU operand {operand.buffer.name} is not in vta.acc")
                o0, ost = self.affine(operand.index, loops)
                if o0 % elems:
                    raise VtaLowerError(f"ALU operand {operand.buffer.name} not aligned")
                strides["src"] = ost
                bases["src"] = self.address(operand.buffer, Buffer.ACC) + o0 // elems
            outer = self.entry_loops(loops, strides, elems, f"ALU {s.buffer.name}")
            fields, begin, end = self.uop_nest(outer, bases)
            if isinstance(operand, int):
                self.insns.append(replace(Alu(op, begin, end, use_imm=True, imm=operand), **fields))
            else:
                self.insns.append(replace(Alu(op, begin, end), **fields))

    def uop_nest(
        self, loops: list[_Loop], bases: dict[str, int]
    ) -> tuple[dict[str, Any], int, int]:
        """(loop fields, uop_bgn, uop_end): the two largest loops in hardware, the rest in
        micro-ops."""
        loops = [loop for loop in loops if loop.extent > 1]
        fits = [
            loop for loop in loops
            if loop.extent < _ITER_LIMIT
            and all(0 <= loop.strides[f] < _FACTOR_LIMIT[f] for f in bases)
        ]  # fmt: skip
        hardware = sorted(fits, key=lambda loop: -loop.extent)[:2]
        hardware.sort(key=loops.index)
        rest = [loop for loop in loops if loop not in hardware]
        table = []
        for values in itertools.product(*(range(loop.extent) for loop in rest)):
            at = {f: bases[f] + sum(v * lp.strides[f] for v, lp in zip(values, rest, strict=True))
                  for f in bases}  # fmt: skip
            table.append(Uop(at["dst"], at.get("src", 0), at.get("wgt", 0)))
        key = tuple(table)
        if key not in self.uop_slices:
            self.uop_slices[key] = len(self.uops)
            self.uops += table
        begin = self.uop_slices[key]
        fields: dict[str, Any] = {}
        for level, loop in zip(("out", "in"), hardware, strict=False):
            fields[f"iter_{level}"] = loop.extent
            for f in bases:
                fields[f"{f}_factor_{level}"] = loop.strides[f]
        return fields, begin, begin + len(table)


def _source(value: E.Expr) -> tuple[E.Load, E.Expr | None] | None:
    """(the parameter load, the padding condition or None) of a DMA's stored value."""
    if isinstance(value, E.Load) and value.buffer.scope == "global":
        return value, None
    if (
        isinstance(value, E.Select)
        and isinstance(value.true_value, E.Load)
        and value.true_value.buffer.scope == "global"
        and isinstance(value.false_value, E.IntImm)
        and value.false_value.value == 0
    ):
        return value.true_value, value.condition
    return None


def _alu_chain(value: E.Expr) -> tuple[E.Load, list[tuple[AluOp, int | E.Load]]]:
    """(first operand, operations in order) of an elementwise min / max / shift / add chain.

    A cast is free: an ACC entry keeps 32 bits, and the STORE's narrowing to int8 keeps the low
    8, which is the cast's wrap.
    """
    ops: list[tuple[AluOp, int | E.Load]] = []
    while not isinstance(value, E.Load):
        if isinstance(value, E.Cast):
            value = value.value
            continue
        if isinstance(value, E.Call) and value.name == "shift_right":
            a, b = value.args
            op: AluOp = AluOp.SHR
        elif isinstance(value, E.Min | E.Max | E.Add):
            a, b = value.a, value.b
            op = {E.Min: AluOp.MIN, E.Max: AluOp.MAX, E.Add: AluOp.ADD}[type(value)]
            if isinstance(a, E.IntImm | E.Load) and not isinstance(b, E.IntImm | E.Load):
                a, b = b, a
        else:
            raise VtaLowerError(f"no ALU operation computes {value}")
        if isinstance(b, E.IntImm):
            ops.append((op, b.value))
        elif isinstance(b, E.Load) and op is not AluOp.SHR:
            ops.append((op, b))
        else:
            raise VtaLowerError(f"ALU operand {b} is neither an immediate nor an ACC entry")
        value = a
    return value, ops[::-1]


def _unclamped(e: E.Expr) -> E.Expr:
    """`e` with every clamp `min(max(i, 0), n)` (te.clamp) replaced by `i`."""
    if isinstance(e, E.Min) and isinstance(e.a, E.Max) and isinstance(e.b, E.IntImm):
        inner = e.a
        if isinstance(inner.b, E.IntImm) and inner.b.value == 0:
            return _unclamped(inner.a)
    kids = E.children(e)
    return E.rebuild(e, [_unclamped(k) for k in kids]) if kids else e


def _merged(loops: list[_Loop], sides: tuple[str, ...]) -> list[_Loop]:
    """Adjacent loops fused where every side's strides make them one (and no padding cuts)."""
    out: list[_Loop] = []
    for loop in loops:
        if out:
            prev = out[-1]
            if (
                prev.full
                and loop.full
                and all(prev.strides[s] == loop.strides[s] * loop.extent for s in sides)
            ):
                out[-1] = _Loop(loop.var, prev.extent * loop.extent, dict(loop.strides))
                continue
        out.append(loop)
    return out

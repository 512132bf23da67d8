"""The accelerator's ISA and artifact container (protos.vta, protos.vta_program): bits in, bits out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_agent.vta import image
from device_agent.vta.testing import gemm_program
from protos.vta import (
    Alu,
    AluOp,
    Buffer,
    Deps,
    Finish,
    Gemm,
    Insn,
    Load,
    Module,
    Store,
    Unknown,
    Uop,
    VtaSpec,
    decode_insn,
    decode_uop,
    encode_insn,
    encode_uop,
    format_insn,
    module_of,
    useful_gemm_cycles,
)
from protos.vta_program import ArgLayout, Program, ProgramError, decode_programs, encode_programs

deps = st.builds(Deps, st.booleans(), st.booleans(), st.booleans(), st.booleans())


def bits(width: int) -> st.SearchStrategy[int]:
    return st.integers(0, (1 << width) - 1)


mem_fields = {
    "buffer": st.sampled_from(Buffer),
    "sram_base": bits(16),
    "dram_base": bits(32),
    "y_size": bits(16),
    "x_size": bits(16),
    "x_stride": bits(16),
    "y_pad_0": bits(4),
    "y_pad_1": bits(4),
    "x_pad_0": bits(4),
    "x_pad_1": bits(4),
    "deps": deps,
}
loop_fields = {
    "uop_bgn": bits(13),
    "uop_end": bits(14),
    "iter_out": bits(14),
    "iter_in": bits(14),
    "dst_factor_out": bits(11),
    "dst_factor_in": bits(11),
    "src_factor_out": bits(11),
    "src_factor_in": bits(11),
    "deps": deps,
}
insns = st.one_of(
    st.builds(Load, **mem_fields),
    st.builds(Store, **mem_fields),
    st.builds(Gemm, **loop_fields, wgt_factor_out=bits(10), wgt_factor_in=bits(10),
              reset=st.booleans()),
    st.builds(Alu, op=st.sampled_from(AluOp), use_imm=st.booleans(),
              imm=st.integers(-(1 << 15), (1 << 15) - 1), **loop_fields),
    st.builds(Finish, deps=deps),
)  # fmt: skip


@given(insns)
def test_every_instruction_survives_encode_and_decode(insn: Insn) -> None:
    data = encode_insn(insn)
    assert len(data) == 16
    assert decode_insn(data) == insn


@given(bits(11), bits(11), bits(10))
def test_every_micro_op_survives_encode_and_decode(dst: int, src: int, wgt: int) -> None:
    uop = Uop(dst, src, wgt)
    assert decode_uop(encode_uop(uop)) == uop


def test_fields_sit_where_the_docstring_says() -> None:
    word = int.from_bytes(
        encode_insn(Gemm(3, 5, iter_out=7, wgt_factor_in=1, reset=True, deps=Deps(push_next=True))),
        "little",
    )
    assert word & 0x7 == 2  # opcode GEMM
    assert word >> 6 & 1 == 1  # push_next
    assert word >> 7 & 1 == 1  # reset
    assert word >> 8 & 0x1FFF == 3 and word >> 21 & 0x3FFF == 5 and word >> 35 & 0x3FFF == 7
    assert word >> 117 & 0x3FF == 1
    alu = int.from_bytes(encode_insn(Alu(AluOp.SHR, 0, 1, use_imm=True, imm=-2)), "little")
    assert alu >> 11 & 0xFFFF == 0xFFFE  # two's complement
    assert encode_uop(Uop(1, 2, 3)) == (1 | 2 << 11 | 3 << 22).to_bytes(4, "little")


def test_a_field_too_wide_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="iter_out"):
        encode_insn(Gemm(0, 1, iter_out=1 << 14))
    with pytest.raises(ValueError, match="imm"):
        encode_insn(Alu(AluOp.ADD, 0, 1, use_imm=True, imm=1 << 15))
    with pytest.raises(ValueError, match="wgt"):
        encode_uop(Uop(0, 0, 1 << 10))


def test_an_undefined_opcode_decodes_to_unknown_and_back() -> None:
    word = (0xABC << 40) | (1 << 3) | 6
    insn = decode_insn(word.to_bytes(16, "little"))
    assert isinstance(insn, Unknown) and insn.opcode == 6 and insn.deps.pop_prev
    assert encode_insn(insn) == word.to_bytes(16, "little")
    assert "UNKNOWN opcode 6" in format_insn(insn)


def test_modules_and_disassembly() -> None:
    assert module_of(Load(Buffer.INP, 0, 0, 1, 1, 1)) is Module.LOAD
    assert module_of(Load(Buffer.ACC, 0, 0, 1, 1, 1)) is Module.COMPUTE
    assert module_of(Store(Buffer.ACC, 0, 0, 1, 1, 1)) is Module.STORE
    assert module_of(Finish()) is Module.COMPUTE
    text = format_insn(Gemm(0, 4, 8, 2, 2, 1, 16, 0, 0, 4, deps=Deps(pop_prev=True)))
    assert text == "GEMM uop[0:4) 8x2 dst(2,1) src(16,0) wgt(0,4) +pop_prev"


def test_spec_checks_its_fields_and_the_encoding_limits() -> None:
    spec = VtaSpec()
    assert (spec.depth(Buffer.INP), spec.depth(Buffer.WGT), spec.depth(Buffer.ACC)) == (
        2048,
        1024,
        2048,
    )
    with pytest.raises(ValueError, match="wgt_buffer_bytes"):
        VtaSpec(wgt_buffer_bytes=512 * 1024)  # 2048 entries: more than a micro-op can name
    with pytest.raises(ValueError, match="dram_bytes_per_cycle"):
        VtaSpec(dram_bytes_per_cycle=0)
    assert VtaSpec(clock_mhz=200).key() != spec.key()


def test_the_container_round_trips_and_refuses_garbage() -> None:
    program = gemm_program(8, 20, 40, tile_rows=4, double_buffer=True)
    program = dataclasses.replace(program, constants=((program.dram_bytes - 3, b"abc"),))
    data = encode_programs({"gemm": program, "other": program})
    assert decode_programs(data) == {"gemm": program, "other": program}
    assert useful_gemm_cycles(program.insns, program.spec) == 8 * 2 * 3
    with pytest.raises(ProgramError, match="magic"):
        decode_programs(b"ELF!" + data[4:])
    with pytest.raises(ProgramError, match="truncated"):
        decode_programs(data[:-1])
    with pytest.raises(ProgramError, match="after the last program"):
        decode_programs(data + b"\0")
    outside = dataclasses.replace(program, constants=((program.dram_bytes - 2, b"abc"),))
    with pytest.raises(ProgramError, match="outside DRAM"):
        encode_programs({"gemm": outside})


def test_layouts_pad_block_and_come_back() -> None:
    layout = ArgLayout("w", (3, 5), "int8", 16, (4, 8), (2, 2, 2, 4), (0, 2, 1, 3))
    program = Program(VtaSpec(), (Finish(),), (), 64, 0, (layout,))
    w = np.arange(15, dtype=np.int8).reshape(3, 5)
    dram = image.make_image(program, [w])
    padded = np.zeros((4, 8), np.int8)
    padded[:3, :5] = w
    blocked = padded.reshape(2, 2, 2, 4).transpose(0, 2, 1, 3)
    assert dram[16:48].tobytes() == blocked.tobytes()
    back = np.zeros_like(w)
    image.read_back(program, dram, [back])
    np.testing.assert_array_equal(back, w)
    with pytest.raises(ValueError, match="wants int8"):
        image.make_image(program, [w.astype(np.int32)])
    bad = dataclasses.replace(layout, view_shape=(2, 2, 2, 2))
    with pytest.raises(ProgramError, match="does not hold"):
        dataclasses.replace(program, args=(bad,)).check()

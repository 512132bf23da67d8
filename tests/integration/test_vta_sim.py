"""The native VTA simulator, built with the real gcc: bit-exact results against numpy, timing that
rewards double buffering, and every hazard kind rejected with its cause by a broken program."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from device_agent.vta import image
from device_agent.vta.sim import HazardKind, Kernel, Simulator, VtaHazard, build, encode_code
from device_agent.vta.testing import gemm_program, gemm_reference
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
    useful_gemm_cycles,
)
from protos.vta_program import ArgLayout, Program

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SHIFT = 2


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Simulator:
    return Simulator(build(str(tmp_path_factory.mktemp("vta"))))


def gemm_args(m: int, n: int, k: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(-128, 128, (m, k), dtype=np.int8),
        rng.integers(-128, 128, (n, k), dtype=np.int8),
        rng.integers(-20000, 20000, (n,), dtype=np.int32),
        np.zeros((m, n), dtype=np.int8),
    ]


def run(
    sim: Simulator, program: Program, args: list[np.ndarray], kernel: Kernel = Kernel.AUTO
) -> int:
    dram = image.make_image(program, args)
    report = sim.run(program.spec, encode_code(program), dram, kernel)
    image.read_back(program, dram, args)
    return report.total_cycles


SIZES = [(1, 16, 16, None), (5, 40, 50, None), (64, 64, 64, 16), (33, 48, 96, 8)]


@pytest.mark.parametrize(("m", "n", "k", "tile_rows"), SIZES)
def test_gemm_matches_numpy_bit_exactly_with_every_kernel(
    sim: Simulator, m: int, n: int, k: int, tile_rows: int | None
) -> None:
    program = gemm_program(m, n, k, tile_rows=tile_rows, shift=SHIFT)
    kernels = sim.kernels(program.spec)
    assert Kernel.GENERIC in kernels
    for kernel in kernels:
        args = gemm_args(m, n, k)
        run(sim, program, args, kernel)
        np.testing.assert_array_equal(
            args[3], gemm_reference(args[0], args[1], args[2], SHIFT), kernel.name
        )


def test_another_block_shape_runs_the_generic_kernel_bit_exactly(sim: Simulator) -> None:
    spec = VtaSpec(block_in=8, block_out=32, inp_buffer_bytes=16 * 1024, clock_mhz=200)
    program = gemm_program(20, 70, 30, tile_rows=8, double_buffer=True, shift=SHIFT, spec=spec)
    assert sim.kernels(spec) == [Kernel.GENERIC]
    args = gemm_args(20, 70, 30, seed=3)
    run(sim, program, args)
    np.testing.assert_array_equal(args[3], gemm_reference(args[0], args[1], args[2], SHIFT))


def test_double_buffering_is_faster_and_gives_the_same_bits(sim: Simulator) -> None:
    m, n, k = 256, 64, 128
    serial = gemm_program(m, n, k, tile_rows=16, double_buffer=False)
    double = gemm_program(m, n, k, tile_rows=16, double_buffer=True)
    a, b = gemm_args(m, n, k, seed=1), gemm_args(m, n, k, seed=1)
    serial_cycles, double_cycles = run(sim, serial, a), run(sim, double, b)
    np.testing.assert_array_equal(a[3], b[3])
    np.testing.assert_array_equal(b[3], gemm_reference(b[0], b[1], b[2], 2))
    assert double_cycles < 0.9 * serial_cycles, (double_cycles, serial_cycles)


def test_the_report_adds_up_and_is_deterministic(sim: Simulator) -> None:
    program = gemm_program(64, 64, 64, tile_rows=16, double_buffer=True)
    reports = []
    for seed in (0, 1):
        dram = image.make_image(program, gemm_args(64, 64, 64, seed))
        reports.append(sim.run(program.spec, encode_code(program), dram))
    first, second = reports
    assert first == second  # the timing never looks at the data
    assert first.gemm_cycles == useful_gemm_cycles(program.insns, program.spec)
    for module in Module:
        cycles = first.modules[module]
        assert cycles.busy + cycles.token_stall + cycles.dram_wait <= first.total_cycles
    assert first.modules[Module.COMPUTE].insns == sum(
        isinstance(i, Gemm | Alu | Finish) or (isinstance(i, Load) and i.buffer in (0, 3))
        for i in program.insns
    )
    assert 0 < first.gemm_utilisation < first.utilisation(Module.COMPUTE) <= 1
    assert first.seconds == first.total_cycles / 100e6
    assert first.dram_write_bytes == 64 * 64


def alu_reference(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The ALU program's steps in numpy, int32 wrapping, shifts clamped at 31."""

    def shr(x: np.ndarray, s: Any) -> np.ndarray:
        s = np.broadcast_to(s, x.shape)
        right = x >> np.minimum(np.maximum(s, 0), 31)
        left = (x.astype(np.uint32) << np.minimum(np.maximum(-s, 0), 31).astype(np.uint32)).view(
            np.int32
        )
        return np.where(s >= 0, right, left)

    x = (a.astype(np.int64) + b).astype(np.int32)  # add (acc)
    x = shr(x, np.int32(-1))  # shift left by one (imm)
    x = np.maximum(x, -50)  # max (imm)
    x = np.minimum(x, b)  # min (acc)
    x = shr(x, c)  # shift by each lane of c, both ways, clamped (acc)
    x = shr(x, np.int32(1))
    return x.astype(np.int8)


def test_alu_operations_match_numpy_bit_exactly(sim: Simulator) -> None:
    rows, spec = 24, VtaSpec()
    shape = (rows, spec.block_out)
    layouts = tuple(
        ArgLayout(name, shape, dtype, 4096 * (i + 1))
        for i, (name, dtype) in enumerate(
            [("a", "int32"), ("b", "int32"), ("c", "int32"), ("out", "int8")]
        )
    )
    entry = spec.acc_entry_bytes
    nest: dict[str, Any] = {"iter_out": rows, "dst_factor_out": 1, "src_factor_out": 1}
    insns: list[Insn] = [
        Load(Buffer.UOP, 0, 0, 1, 2, 2),
        *(Load(Buffer.ACC, i * rows, layouts[i].offset // entry, 1, rows, rows) for i in range(3)),
        Alu(AluOp.ADD, 0, 1, **nest),
        Alu(AluOp.SHR, 0, 1, use_imm=True, imm=-1, **nest),
        Alu(AluOp.MAX, 0, 1, use_imm=True, imm=-50, **nest),
        Alu(AluOp.MIN, 0, 1, **nest),
        Alu(AluOp.SHR, 1, 2, **nest),
        Alu(AluOp.SHR, 0, 1, use_imm=True, imm=1, **nest, deps=Deps(push_next=True)),
        Store(Buffer.ACC, 0, layouts[3].offset // spec.out_entry_bytes, 1, rows, rows,
              deps=Deps(pop_prev=True, push_prev=True)),
        Finish(deps=Deps(pop_next=True)),
    ]  # fmt: skip
    uops = (Uop(0, rows), Uop(0, 2 * rows))  # src: b, then c
    program = Program(spec, tuple(insns), uops, 5 * 4096, 0, layouts)
    rng = np.random.default_rng(7)
    a = rng.integers(-(1 << 31), 1 << 31, shape, dtype=np.int32)
    b = rng.integers(-(1 << 20), 1 << 20, shape, dtype=np.int32)
    c = rng.integers(-40, 40, shape, dtype=np.int32)
    out = np.zeros(shape, np.int8)
    run(sim, program, [a, b, c, out])
    np.testing.assert_array_equal(out, alu_reference(a, b, c))


# ---- hazards: each kind from a deliberately broken copy of one good single-tile program ----

M, N, K = 8, 16, 32


def good() -> list[Insn]:
    """LOAD UOP, LOAD ACC, LOAD WGT, LOAD INP, GEMM reset, GEMM, 4 x ALU, STORE, FINISH."""
    return list(gemm_program(M, N, K, shift=SHIFT).insns)


def with_deps(insn: Insn, **flags: bool) -> Insn:
    return dataclasses.replace(insn, deps=dataclasses.replace(insn.deps, **flags))


def unknown_opcode(p: list[Insn]) -> list[Insn]:
    return [*p[:-1], Unknown(7), p[-1]]


def bad_instruction(p: list[Insn]) -> list[Insn]:
    p[3] = with_deps(p[3], push_prev=True)  # the load module has no previous module
    return p


def buffer_overflow(p: list[Insn]) -> list[Insn]:
    assert isinstance(p[3], Load)
    p[3] = dataclasses.replace(p[3], sram_base=VtaSpec().depth(Buffer.INP) - 4)
    return p


def dram_out_of_bounds(p: list[Insn]) -> list[Insn]:
    assert isinstance(p[10], Store)
    p[10] = dataclasses.replace(p[10], dram_base=1 << 24)
    return p


def unsynced_read(p: list[Insn]) -> list[Insn]:
    # The token goes after the weights instead of after the inputs: compute may read old inputs.
    p[2], p[3] = with_deps(p[2], push_next=True), with_deps(p[3], push_next=False)
    return p


def unsynced_write(p: list[Insn]) -> list[Insn]:
    # After handing the inputs over, load spends a long time on other weights, then overwrites
    # the inputs with no token from compute: compute has long read them, but nothing says so.
    assert isinstance(p[3], Load)
    long_load = Load(Buffer.WGT, 64, 0, 1, 200, 200)
    return [*p[:4], long_load, with_deps(p[3], push_next=False), *p[4:]]


def uninitialised_read(p: list[Insn]) -> list[Insn]:
    # No reset: the first GEMM accumulates into entries nothing wrote.
    return [*p[:4], with_deps(p[5], pop_prev=True), *p[6:]]


def token_underflow(p: list[Insn]) -> list[Insn]:
    p[2] = with_deps(p[2], pop_next=True)  # compute never pushes to load
    return p


def token_deadlock(p: list[Insn]) -> list[Insn]:
    # load waits for compute's GEMM, which waits (by its reset) for load's inputs.
    p[2], p[5] = with_deps(p[2], pop_next=True), with_deps(p[5], push_prev=True)
    return p


def token_left(p: list[Insn]) -> list[Insn]:
    p[7] = with_deps(p[7], push_prev=True)  # nobody pops it
    return p


BROKEN: dict[HazardKind, tuple[Callable[[list[Insn]], list[Insn]], str]] = {
    HazardKind.UNKNOWN_OPCODE: (unknown_opcode, "insn 11: unknown opcode 7"),
    HazardKind.BAD_INSTRUCTION: (bad_instruction, "push_prev on the load module"),
    HazardKind.BUFFER_OVERFLOW: (buffer_overflow, "load insn 3 (LOAD INP) accesses INP entries"),
    HazardKind.DRAM_OUT_OF_BOUNDS: (dram_out_of_bounds, "store insn 10 (STORE ACC) writes DRAM"),
    HazardKind.UNSYNCED_READ: (
        unsynced_read,
        "compute insn 5 (GEMM) reads INP[0], written by load insn 3 (LOAD INP) with no token "
        "from load since",
    ),
    HazardKind.UNSYNCED_WRITE: (
        unsynced_write,
        "load insn 5 (LOAD INP) overwrites INP[0], read by compute insn 7 (GEMM) with no token "
        "from compute since",
    ),
    HazardKind.UNINITIALISED_READ: (
        uninitialised_read,
        "compute insn 4 (GEMM) reads ACC[1], which nothing wrote",
    ),
    HazardKind.TOKEN_UNDERFLOW: (
        token_underflow,
        "load insn 2 (LOAD WGT) pops token 1 of queue compute->load, which only ever gets 0",
    ),
    HazardKind.TOKEN_DEADLOCK: (
        token_deadlock,
        "deadlock: load insn 2 (LOAD WGT) waits on compute->load; compute insn 4 (GEMM) waits on "
        "load->compute",
    ),
    HazardKind.TOKEN_LEFT: (token_left, "queue compute->load gets 1 tokens but only 0 are popped"),
}


@pytest.mark.parametrize("kind", list(BROKEN), ids=lambda k: k.name)
def test_each_hazard_is_rejected_with_its_cause(sim: Simulator, kind: HazardKind) -> None:
    assert set(BROKEN) == set(HazardKind) - {HazardKind.HOST_ERROR}
    breaker, cause = BROKEN[kind]
    program = gemm_program(M, N, K, shift=SHIFT)
    broken = dataclasses.replace(program, insns=tuple(breaker(good())), dram_bytes=1 << 20)
    run(sim, dataclasses.replace(program, dram_bytes=1 << 20), gemm_args(M, N, K))  # fine whole
    with pytest.raises(VtaHazard) as err:
        run(sim, broken, gemm_args(M, N, K))
    assert err.value.kind is kind
    assert cause in err.value.message, err.value.message
    assert str(err.value).startswith(kind.name)

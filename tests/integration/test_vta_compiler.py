"""The `vta` compiler target against the native simulator (real gcc builds it): every generated
program matches numpy bit for bit with no hazard, virtual threads hide latency, a program with a
token taken out is caught, and the tuner's builder makes ACCEL_PROGRAM candidates with a host
reference built from the tensor expression."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from compiler.codegen.vta import GemmTiling, gemm_program
from compiler.ops.vta_dense import SHIFT, VtaDenseTemplate
from device_agent.vta import image
from device_agent.vta.sim import HazardKind, SimReport, Simulator, VtaHazard, build, encode_code
from protos.vta import Buffer, Deps, Gemm, Load, VtaSpec
from protos.vta_program import Program, decode_programs
from tuner.measure.builder import build_unit
from tuner.measure.device_target import (
    TargetError,
    check_target,
    device_records_target,
    device_target,
)
from tuner.records import Workload

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

TEMPLATE = VtaDenseTemplate()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Simulator:
    return Simulator(build(str(tmp_path_factory.mktemp("vta"))))


def run(
    sim: Simulator, program: Program, shape: tuple[int, int, int], seed: int = 0
) -> tuple[np.ndarray, np.ndarray, SimReport]:
    """(simulated y, numpy's y, the report) on seeded full-range inputs."""
    inputs = TEMPLATE.random_inputs(shape, np.random.default_rng(seed))
    out = np.zeros((shape[0], shape[1]), np.int8)
    args = [*inputs, out]
    dram = image.make_image(program, args)
    report = sim.run(program.spec, encode_code(program), dram)
    image.read_back(program, dram, args)
    return out, TEMPLATE.reference(*inputs), report


# Shapes with K and N off the 16-element block, M off the tile, one-block and one-row extremes.
SHAPES = [(64, 48, 80), (33, 17, 19), (1, 16, 16), (100, 70, 300), (49, 40, 200)]
TILINGS = [(16, 2, 3), (32, 1, 8), (7, 3, 1)]


@pytest.mark.parametrize("vthreads", [1, 2, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_program_matches_numpy(
    sim: Simulator, shape: tuple[int, int, int], vthreads: int
) -> None:
    for tm, tn, tk in TILINGS:
        program = gemm_program(*shape, GemmTiling(tm, tn, tk, vthreads), SHIFT)
        got, expected, report = run(sim, program, shape)
        assert np.array_equal(got, expected), (shape, tm, tn, tk, vthreads)
        assert report.gemm_cycles > 0


def test_every_config_of_a_small_space_runs(sim: Simulator) -> None:
    shape = (40, 40, 72)
    space = TEMPLATE.config_space(shape)
    kept = [
        c for c in (space.get(i) for i in range(len(space))) if TEMPLATE.worth_measuring(shape, c)
    ]
    assert kept
    for config in kept[::7]:
        got, expected, _ = run(sim, TEMPLATE.program(shape, config), shape, seed=config.index)
        assert np.array_equal(got, expected), config


def test_virtual_threads_hide_latency_with_identical_bits(sim: Simulator) -> None:
    shape = (196, 256, 2304)  # ResNet-18's 14x14 3x3 convolution as an im2col GEMM
    results = {}
    for v in (1, 2, 4):
        results[v] = run(sim, gemm_program(*shape, GemmTiling(49, 8, 4, v), SHIFT), shape)
    for v, (got, expected, _) in results.items():
        assert np.array_equal(got, expected), v
        assert np.array_equal(got, results[1][0])
    cycles = {v: r[2].total_cycles for v, r in results.items()}
    assert cycles[2] < 0.8 * cycles[1]
    assert cycles[4] <= cycles[2]
    assert results[2][2].gemm_cycles == results[1][2].gemm_cycles  # same work, less waiting
    assert results[2][2].gemm_utilisation > 0.9


def _drop(program: Program, index: int, **flags: bool) -> Program:
    insns = list(program.insns)
    insns[index] = dataclasses.replace(
        insns[index], deps=dataclasses.replace(insns[index].deps, **flags)
    )
    return dataclasses.replace(program, insns=tuple(insns))


def test_a_dropped_token_is_a_hazard(sim: Simulator) -> None:
    shape = (64, 32, 64)
    program = gemm_program(*shape, GemmTiling(16, 2, 2, 2), SHIFT)
    # The first INP load that waits for compute to free its slot, and the GEMM that frees it.
    reload = next(
        i for i, x in enumerate(program.insns)
        if isinstance(x, Load) and x.buffer is Buffer.INP and x.deps.pop_next
    )  # fmt: skip
    freer = next(i for i, x in enumerate(program.insns) if isinstance(x, Gemm) and x.deps.push_prev)
    # Only the pop gone: the token is left over (counted before the run).
    with pytest.raises(VtaHazard) as left:
        run(sim, _drop(program, reload, pop_next=False), shape)
    assert left.value.kind is HazardKind.TOKEN_LEFT
    # Push and pop gone (counts balance): the load overwrites a slot compute may still read.
    broken = _drop(_drop(program, reload, pop_next=False), freer, push_prev=False)
    with pytest.raises(VtaHazard) as unsynced:
        run(sim, broken, shape)
    assert unsynced.value.kind is HazardKind.UNSYNCED_WRITE
    # The load->compute token of the first step gone: compute reads data that may not be there.
    first_wgt = next(
        i for i, x in enumerate(program.insns) if isinstance(x, Load) and x.buffer is Buffer.WGT
    )
    first_gemm = next(
        i for i, x in enumerate(program.insns) if isinstance(x, Gemm) and x.deps.pop_prev
    )
    starved = _drop(_drop(program, first_wgt, push_next=False), first_gemm, pop_prev=False)
    with pytest.raises(VtaHazard) as read:
        run(sim, starved, shape)
    assert read.value.kind is HazardKind.UNSYNCED_READ
    assert Deps() == Deps(False, False, False, False)


def test_builder_makes_accel_programs_with_host_references(sim: Simulator) -> None:
    workload = Workload("vta_dense", (300, 24, 520), "int8")
    space = TEMPLATE.config_space(workload.shape)
    fits = [TEMPLATE.worth_measuring(workload.shape, space.get(i)) for i in range(len(space))]
    indices = [i for i in range(0, len(space), 11) if fits[i]][:3]
    bad = fits.index(False)
    results = build_unit(workload, [*indices, bad], "vta", check=True)
    for r in results[:-1]:
        assert r.artifact is not None and r.artifact.format == "accel_program", r.error
        assert r.reference is not None and r.reference.artifact.format == "shared_object"
        ((symbol, program),) = decode_programs(r.artifact.data).items()
        assert symbol == r.artifact.entries[0].symbol
        got, expected, _ = run(sim, program, (300, 24, 520))
        assert np.array_equal(got, expected)
    assert results[-1].artifact is None and "needs" in results[-1].error


def test_a_vta_device_runs_the_vta_target_of_its_spec_and_no_c_target() -> None:
    default = VtaSpec().key()
    vta = {"backend": "vta_sim", "arch": "vta", "emulated": "vta-sim", "vta_spec": default}
    assert device_target(vta) == "vta"
    assert check_target("vta", vta) == "vta"
    assert device_records_target(vta) == device_records_target(vta, "vta") == f"vta/spec={default}"
    with pytest.raises(TargetError, match="it runs vta"):
        check_target("host", vta)
    with pytest.raises(TargetError, match="cannot run on"):
        check_target("vta", {"arch": "x86_64", "features": "avx2,fma"})
    # another spec: the target names it, the default one does not run there
    other = dataclasses.replace(VtaSpec(), clock_mhz=250).key()
    slow = {**vta, "vta_spec": other}
    assert device_target(slow) == check_target(f"vta/spec={other}", slow) == f"vta/spec={other}"
    assert device_records_target(slow) == f"vta/spec={other}"
    with pytest.raises(TargetError, match="another accelerator spec"):
        check_target("vta", slow)
    with pytest.raises(TargetError, match="not a VTA spec key"):
        check_target("vta", {**vta, "vta_spec": "k"})
    assert device_target({"arch": "aarch64"}) == "aarch64-neon"  # other arches unchanged

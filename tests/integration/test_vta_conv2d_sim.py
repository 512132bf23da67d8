"""`vta_conv2d` lowered from its TE schedule into instruction streams, run on the native
simulator (real gcc builds it): every program matches numpy bit for bit with no hazard, the
dependency tokens are what keeps the interleaved virtual threads correct, and virtual threads hide
load latency."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from compiler.ops.vta_conv2d import VtaConv2dTemplate, conv_shape, dense_program
from compiler.ops.vta_dense import VtaDenseTemplate, build_vta
from device_agent.vta import image
from device_agent.vta.sim import HazardKind, SimReport, Simulator, VtaHazard, build, encode_code
from protos.vta import Deps, Gemm, Insn, Load, Module, module_of
from protos.vta_program import Program, decode_programs

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

TEMPLATE = VtaConv2dTemplate()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Simulator:
    return Simulator(build(str(tmp_path_factory.mktemp("vta"))))


def run(
    sim: Simulator, program: Program, shape: tuple[int, ...], seed: int = 0
) -> tuple[np.ndarray, np.ndarray, SimReport]:
    """(simulated y, numpy's y, the report) on seeded full-range inputs."""
    inputs = TEMPLATE.random_inputs(shape, np.random.default_rng(seed))
    expected = TEMPLATE.reference_for(shape, *inputs)
    out = np.zeros(expected.shape, np.int8)
    args = [*inputs, out]
    dram = image.make_image(program, args)
    report = sim.run(program.spec, encode_code(program), dram)
    image.read_back(program, dram, args)
    return out, expected, report


def config(tiles: Sequence[int], vthreads: int) -> dict[str, int]:
    """A config from (tile_h, tile_w, tile_oc, tile_ic) and the virtual threads."""
    return dict(zip(("tile_h", "tile_w", "tile_oc", "tile_ic"), tiles, strict=True)) | {
        "vthreads": vthreads
    }


# (C, H, W, O, K, stride, pad) and a tiling (h, w, oc blocks, ic blocks): 3x3 and 1x1, stride 2,
# padding 1, odd sizes, channels off the 16-block, tiles that leave tails on every axis.
CASES = [
    ((16, 8, 8, 16, 3, 1, 1), (4, 4, 1, 1)),
    ((32, 9, 9, 48, 3, 2, 1), (2, 3, 2, 1)),
    ((20, 7, 11, 33, 3, 1, 1), (4, 4, 1, 1)),
    ((64, 14, 14, 64, 1, 1, 0), (7, 7, 2, 2)),
    ((40, 15, 13, 20, 3, 2, 1), (3, 5, 1, 2)),
    ((48, 10, 10, 64, 1, 2, 0), (5, 2, 3, 2)),
    ((64, 7, 7, 96, 3, 1, 1), (7, 7, 2, 4)),
    ((3, 11, 9, 16, 5, 2, 2), (2, 2, 1, 1)),
    ((16, 6, 6, 80, 3, 1, 1), (2, 6, 1, 1)),  # 5 channel tiles: 2 threads leave a guarded tail
]


@pytest.mark.parametrize("vthreads", [1, 2, 4])
@pytest.mark.parametrize(("shape", "tiles"), CASES)
def test_every_program_matches_numpy(
    sim: Simulator, shape: tuple[int, ...], tiles: tuple[int, ...], vthreads: int
) -> None:
    program = TEMPLATE.program(shape, config(tiles, vthreads))
    got, expected, report = run(sim, program, shape)
    assert np.array_equal(got, expected), (shape, tiles, vthreads)
    assert 0 < np.count_nonzero(expected) < expected.size  # ReLU and the clip both bite
    g = conv_shape(shape)
    assert report.gemm_cycles == g.oh * g.ow * g.k * g.k * g.cb * g.ob  # every block once


def test_sampled_configs_of_a_space_run(sim: Simulator) -> None:
    shape = (32, 12, 12, 32, 3, 1, 1)
    space = TEMPLATE.config_space(shape)
    kept = [
        c for c in (space.get(i) for i in range(len(space))) if TEMPLATE.worth_measuring(shape, c)
    ]
    assert kept
    for c in kept[:: max(1, len(kept) // 12)]:
        got, expected, _ = run(sim, TEMPLATE.program(shape, c), shape, seed=c.index)
        assert np.array_equal(got, expected), c


def _without(program: Program, keep: Callable[[Insn, str], bool]) -> Program:
    """`program` with the dependency flags `keep(insn, flag)` rejects cleared."""
    insns = []
    for insn in program.insns:
        flags = {f: getattr(insn.deps, f) and keep(insn, f) for f in Deps.__dataclass_fields__}
        insns.append(dataclasses.replace(insn, deps=Deps(**flags)))
    return dataclasses.replace(program, insns=tuple(insns))


def test_the_tokens_make_interleaved_threads_correct(sim: Simulator) -> None:
    shape = (32, 14, 14, 64, 3, 1, 1)
    program = TEMPLATE.program(shape, config((7, 7, 1, 1), 2))
    got, expected, _ = run(sim, program, shape)
    assert np.array_equal(got, expected)
    # No tokens at all: a module reads what another has not (or not yet provably) written.
    with pytest.raises(VtaHazard) as none:
        run(sim, _without(program, lambda insn, flag: False), shape)
    assert none.value.kind in (HazardKind.UNSYNCED_READ, HazardKind.UNINITIALISED_READ)

    # Without the compute -> load tokens (the double buffers' "slot free again"): a thread's next
    # load overwrites a buffer its GEMM may still read.
    def keep(insn: Insn, flag: str) -> bool:
        module = module_of(insn)
        return not (
            (module is Module.COMPUTE and flag == "push_prev")
            or (module is Module.LOAD and flag == "pop_next")
        )

    with pytest.raises(VtaHazard) as war:
        run(sim, _without(program, keep), shape)
    assert war.value.kind is HazardKind.UNSYNCED_WRITE

    # The compute -> store tokens: a STORE reads accumulators the ALU may not have finished.
    def keep_store(insn: Insn, flag: str) -> bool:
        module = module_of(insn)
        return not (
            (module is Module.COMPUTE and flag == "push_next")
            or (module is Module.STORE and flag == "pop_prev")
        )

    with pytest.raises(VtaHazard) as raw:
        run(sim, _without(program, keep_store), shape)
    assert raw.value.kind in (HazardKind.UNSYNCED_READ, HazardKind.UNINITIALISED_READ)
    assert "STORE" in raw.value.message


def test_virtual_threads_hide_load_latency(sim: Simulator) -> None:
    # Small spatial tiles over many input channels: per GEMM cycle, much weight to load.
    shape = (128, 14, 14, 128, 3, 1, 1)
    results = {
        v: run(sim, TEMPLATE.program(shape, config((7, 7, 2, 2), v)), shape) for v in (1, 2, 4)
    }
    for v, (got, expected, _) in results.items():
        assert np.array_equal(got, expected), v
    reports = {v: r[2] for v, r in results.items()}
    one = reports[1]
    assert one.modules[Module.LOAD].busy > 0.5 * one.modules[Module.COMPUTE].busy
    assert reports[2].gemm_cycles == one.gemm_cycles  # the same work, less waiting
    assert reports[2].total_cycles < 0.9 * one.total_cycles
    assert min(reports[2].total_cycles, reports[4].total_cycles) < 0.85 * one.total_cycles


def test_artifact_round_trips(sim: Simulator) -> None:
    shape = (16, 6, 6, 16, 3, 1, 1)
    configs = {"a": config((3, 3, 1, 1), 1), "b": config((6, 6, 1, 1), 2)}
    artifact = build_vta(TEMPLATE, shape, configs)
    programs = decode_programs(artifact.data)
    assert set(programs) == {"a", "b"}
    for program in programs.values():
        got, expected, _ = run(sim, program, shape)
        assert np.array_equal(got, expected)
        assert any(isinstance(i, Load) and i.y_pad_0 for i in program.insns)  # the halo
        assert any(isinstance(i, Gemm) and i.reset for i in program.insns)


@pytest.mark.parametrize("vthreads", [1, 2, 4])
def test_dense_through_the_te_path_matches_the_hand_written_generator(
    sim: Simulator, vthreads: int
) -> None:
    """vta_dense as a 1x1 convolution of an M x 1 image, lowered from the TE schedule: the same
    bits as the generator of compiler.codegen.vta (and numpy), in a comparable time."""
    dense = VtaDenseTemplate()
    for shape, (tm, tn, tk) in [((64, 48, 80), (16, 2, 3)), ((33, 17, 19), (7, 3, 1))]:
        cfg = {"tile_m": tm, "tile_n": tn, "tile_k": tk, "vthreads": vthreads}
        x, w, b = dense.random_inputs(shape, np.random.default_rng(5))
        outs = []
        for program in (dense.program(shape, cfg), dense_program(shape, cfg)):
            out = np.zeros(shape[:2], np.int8)
            args = [x, w, b, out]
            dram = image.make_image(program, args)
            sim.run(program.spec, encode_code(program), dram)
            image.read_back(program, dram, args)
            outs.append(out)
        assert np.array_equal(outs[0], dense.reference(x, w, b)), shape
        assert np.array_equal(outs[1], outs[0]), shape

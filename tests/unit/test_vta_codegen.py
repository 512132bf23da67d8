"""The `vta` compiler target without the simulator: the template's compute (vs numpy through the
loop-IR interpreter), its space and pruning, and the generated programs' structure and tokens."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.vta import GemmTiling, _reuse_tokens, gemm_program, tiling_problem
from compiler.ir.interpreter import run as interpret
from compiler.lower import lower
from compiler.ops import get_template
from compiler.ops.vta_dense import SHIFT, VtaDenseTemplate, build_vta, tiling
from protos.vta import Alu, Buffer, Finish, Gemm, Load, Module, Store, VtaSpec, module_of
from protos.vta_program import decode_programs


def test_te_compute_is_the_numpy_reference() -> None:
    template = VtaDenseTemplate()
    shape = (5, 7, 20)
    inputs = template.random_inputs(shape, np.random.default_rng(3))
    config = template.config_space(shape).get(0)
    sch, args = template.instantiate(shape, config)
    out = np.zeros((5, 7), np.int8)
    interpret(lower(sch, args, "vta_dense_ref"), *inputs, out)
    expected = template.reference(*inputs)
    assert np.array_equal(out, expected)
    assert 0 < np.count_nonzero(expected) < expected.size  # ReLU and the clip both bite


def test_registered_with_a_pruned_space() -> None:
    template = get_template("vta_dense")
    assert isinstance(template, VtaDenseTemplate)
    shape = (196, 256, 2304)
    space = template.config_space(shape)
    assert [k.name for k in space.knobs] == ["tile_m", "tile_n", "tile_k", "vthreads"]
    assert space.knobs[0].choices[-1] == 196  # clipped to M, M itself included
    kept = [
        c for c in (space.get(i) for i in range(len(space))) if template.worth_measuring(shape, c)
    ]
    assert 0 < len(kept) < len(space)
    spec = VtaSpec()
    for c in (space.get(i) for i in range(len(space))):
        t = tiling(c)
        fits = t.vthreads * min(t.tile_m, 196) * t.tile_k <= spec.depth(Buffer.INP)
        if not fits:
            assert not template.worth_measuring(shape, c)
    with pytest.raises(ValueError, match="INP needs"):
        template.program(shape, {"tile_m": 256, "tile_n": 1, "tile_k": 32, "vthreads": 4})


def test_tiling_problem_names_the_buffer() -> None:
    assert tiling_problem(64, 64, 64, GemmTiling(64, 4, 4, 2), VtaSpec()) is None
    assert "WGT" in str(tiling_problem(64, 512, 4096, GemmTiling(1, 32, 32, 4), VtaSpec()))
    assert "vthreads" in str(tiling_problem(64, 64, 64, GemmTiling(64, 4, 4, 3), VtaSpec()))


@pytest.mark.parametrize("vthreads", [1, 2, 4])
def test_program_tokens_balance_per_queue(vthreads: int) -> None:
    program = gemm_program(70, 40, 100, GemmTiling(16, 2, 3, vthreads), SHIFT)
    pushes = {q: 0 for q in ("l2c", "c2l", "c2s", "s2c")}
    pops = dict(pushes)
    queues = {  # (module, flag) -> queue, as in the simulator
        (Module.LOAD, "push_next"): "l2c", (Module.COMPUTE, "pop_prev"): "l2c",
        (Module.COMPUTE, "push_prev"): "c2l", (Module.LOAD, "pop_next"): "c2l",
        (Module.COMPUTE, "push_next"): "c2s", (Module.STORE, "pop_prev"): "c2s",
        (Module.STORE, "push_prev"): "s2c", (Module.COMPUTE, "pop_next"): "s2c",
    }  # fmt: skip
    for insn in program.insns:
        for flag in ("pop_prev", "pop_next", "push_prev", "push_next"):
            if getattr(insn.deps, flag):
                q = queues[(module_of(insn), flag)]
                (pushes if flag.startswith("push") else pops)[q] += 1
    assert pushes == pops
    assert isinstance(program.insns[-1], Finish)
    gemms = [i for i in program.insns if isinstance(i, Gemm) and not i.reset]
    assert sum(g.iter_out * g.iter_in * (g.uop_end - g.uop_bgn) for g in gemms) == 70 * 3 * 7
    assert sum(isinstance(i, Alu) for i in program.insns) == 4 * len(
        [i for i in program.insns if isinstance(i, Store)]
    )
    loads = [i for i in program.insns if isinstance(i, Load) and i.buffer is Buffer.INP]
    assert max(i.sram_base for i in loads) == (vthreads - 1) * 16 * 3  # one slot per thread


def test_reuse_tokens_pair_pushes_with_pops_in_order() -> None:
    pops, pushes = _reuse_tokens([0, 1, 0, 1, 0])
    assert pops == [False, False, True, True, True]
    assert pushes == [True, True, True, False, False]


def test_build_vta_artifact_round_trips() -> None:
    template = VtaDenseTemplate()
    configs = {
        "a": {"tile_m": 16, "tile_n": 1, "tile_k": 2, "vthreads": 1},
        "b": {"tile_m": 32, "tile_n": 2, "tile_k": 2, "vthreads": 2},
    }
    art = build_vta(template, (40, 24, 40), configs)
    assert art.format == "accel_program" and art.target == "vta"
    assert [e.symbol for e in art.entries] == ["a", "b"]
    assert [a.role for a in art.entries[0].args] == ["input", "input", "input", "output"]
    assert [a.dtype for a in art.entries[0].args] == ["int8", "int8", "int32", "int8"]
    programs = decode_programs(art.data)
    assert programs["b"] == template.program((40, 24, 40), configs["b"])

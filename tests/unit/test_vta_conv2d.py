"""`vta_conv2d` without the simulator: its computes against numpy (through the loop-IR
interpreter), the virtual-thread pass against the interpreter and by its shape, the dependency
tokens, and the instruction stream lowered from the TE schedule."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.vta_deps import insert_tokens
from compiler.codegen.vta_lower import VtaLowerError, lower_program, lower_vta
from compiler.ir.interpreter import run as interpret
from compiler.ir.stmt import Allocate, For, ForKind, IfThenElse, IntrinCall, Seq, Stmt
from compiler.lower import lower
from compiler.ops import get_template
from compiler.ops.space import Config
from compiler.ops.vta_conv2d import (
    ConvTiling,
    VtaConv2dTemplate,
    accel_schedule,
    arg_layouts,
    blocked_compute,
    conv_shape,
)
from compiler.schedule.schedule import create_schedule
from protos.vta import Alu, AluOp, Buffer, Gemm, Load, Module, module_of
from protos.vta import Store as StoreInsn

TEMPLATE = VtaConv2dTemplate()
SHAPE = (20, 7, 9, 24, 3, 2, 1)  # channels off the block, odd sizes, stride 2, padding 1


def blocked(
    shape: tuple[int, ...], x: np.ndarray, w: np.ndarray, b: np.ndarray
) -> list[np.ndarray]:
    """The plain inputs in the blocked layouts of `blocked_compute` (NCHW16c and friends)."""
    g = conv_shape(shape)
    cp, op = g.cb * 16, g.ob * 16
    xp = np.zeros((cp, g.h, g.w), np.int8)
    xp[: g.c] = x[0]
    wp = np.zeros((op, cp, g.k, g.k), np.int8)
    wp[: g.o, : g.c] = w
    bp = np.zeros(op, np.int32)
    bp[: g.o] = b
    return [
        np.ascontiguousarray(xp.reshape(g.cb, 16, g.h, g.w).transpose(0, 2, 3, 1)),
        np.ascontiguousarray(wp.reshape(g.ob, 16, g.cb, 16, g.k, g.k).transpose(0, 2, 4, 5, 1, 3)),
        bp.reshape(g.ob, 16),
    ]


def unblocked(shape: tuple[int, ...], y: np.ndarray) -> np.ndarray:
    g = conv_shape(shape)
    return y.transpose(0, 3, 1, 2).reshape(1, g.ob * 16, g.oh, g.ow)[:, : g.o]


def inputs(shape: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    return TEMPLATE.random_inputs(shape, np.random.default_rng(seed))


def test_both_computes_are_the_numpy_reference() -> None:
    shape = (18, 5, 6, 17, 3, 2, 1)  # small: the naive nests run in the interpreter
    x, w, b = inputs(shape)
    expected = TEMPLATE.reference_for(shape, x, w, b)
    assert 0 < np.count_nonzero(expected) < expected.size  # ReLU and the clip both bite
    plain = TEMPLATE.tensors(shape, None)
    out = np.zeros(expected.shape, np.int8)
    interpret(lower(create_schedule(plain[-1]), plain, "plain"), x, w, b, out)
    assert np.array_equal(out, expected)
    g = conv_shape(shape)
    tensors = blocked_compute(g)
    yb = np.zeros(tensors[-1].shape, np.int8)
    interpret(lower(create_schedule(tensors[-1]), tensors, "blocked"), *blocked(shape, x, w, b), yb)
    assert np.array_equal(unblocked(shape, yb), expected)


@pytest.mark.parametrize("vthreads", [1, 2, 4])
def test_the_accelerator_schedule_lowers_to_the_same_values(vthreads: int) -> None:
    """The loop IR the stream is generated from (after the vthread pass) computes the op."""
    x, w, b = inputs(SHAPE, vthreads)
    g = conv_shape(SHAPE)
    sch, args = accel_schedule(g, ConvTiling(2, 3, 1, 1, vthreads))
    func = lower_vta(sch, args, "accel")
    yb = np.zeros(args[-1].shape, np.int8)
    interpret(func, *blocked(SHAPE, x, w, b), yb)
    assert np.array_equal(unblocked(SHAPE, yb), TEMPLATE.reference_for(SHAPE, x, w, b))


def _walk(s: Stmt) -> list[Stmt]:
    out = [s]
    if isinstance(s, For | Allocate):
        out += _walk(s.body)
    elif isinstance(s, IfThenElse):
        out += _walk(s.then_case)
    elif isinstance(s, Seq):
        for c in s.stmts:
            out += _walk(c)
    return out


def _leaf(s: Stmt) -> Stmt:
    while isinstance(s, For):
        s = s.body
    return s


def test_vthread_pass_interleaves_threads_over_their_own_buffers() -> None:
    g = conv_shape((32, 8, 8, 64, 3, 1, 1))
    sch, args = accel_schedule(g, ConvTiling(4, 4, 1, 1, 2))
    func = lower_vta(sch, args, "accel")
    nodes = _walk(func.body)
    assert not any(isinstance(n, For) and n.kind is ForKind.THREAD_BINDING for n in nodes)
    scoped = [n.buffer for n in nodes if isinstance(n, Allocate)]
    assert {b.scope for b in scoped} == {"vta.inp", "vta.wgt", "vta.acc"}
    assert all(b.shape[0] == 2 for b in scoped)  # one copy per thread
    # The reduction loop is shared: inside it each thread's two DMAs, in turn, then the GEMMs.
    step = next(n for n in nodes if isinstance(n, For) and n.var.name == "rc_o")
    body = step.body
    while isinstance(body, Allocate):
        body = body.body
    assert isinstance(body, Seq)
    kinds = []
    for nest in body.stmts:
        leaf = _leaf(nest)
        kinds.append("gemm" if isinstance(leaf, IntrinCall) else leaf.buffer.scope)  # type: ignore[attr-defined]
    assert kinds == ["vta.wgt", "vta.inp", "vta.wgt", "vta.inp", "gemm", "gemm"]
    gemm_t0, gemm_t1 = (_leaf(n) for n in body.stmts[4:])
    assert isinstance(gemm_t0, IntrinCall) and isinstance(gemm_t1, IntrinCall)
    assert gemm_t0.operands[0][0] is gemm_t1.operands[0][0]  # the expanded accumulator


def test_vthread_tail_is_guarded_and_still_exact() -> None:
    shape = (16, 6, 6, 80, 3, 1, 1)  # 5 output-channel tiles over 2 threads
    g = conv_shape(shape)
    sch, args = accel_schedule(g, ConvTiling(2, 6, 1, 1, 2))  # 3 row tiles: neither divides
    func = lower_vta(sch, args, "tail")
    guards = [n for n in _walk(func.body) if isinstance(n, IfThenElse)]
    assert any(str(n.condition).startswith("1 <") for n in guards)  # thread 1 idles at the tail
    x, w, b = inputs(shape)
    yb = np.zeros(args[-1].shape, np.int8)
    interpret(func, *blocked(shape, x, w, b), yb)
    assert np.array_equal(unblocked(shape, yb), TEMPLATE.reference_for(shape, x, w, b))


def test_registered_with_a_pruned_space() -> None:
    template = get_template("vta_conv2d")
    assert isinstance(template, VtaConv2dTemplate)
    shape = (64, 56, 56, 64, 3, 1, 1)
    space = template.config_space(shape)
    assert [k.name for k in space.knobs] == ["tile_h", "tile_w", "tile_oc", "tile_ic", "vthreads"]
    kept = [
        c for c in (space.get(i) for i in range(len(space))) if template.worth_measuring(shape, c)
    ]
    assert 0 < len(kept) < len(space)
    big = {"tile_h": 56, "tile_w": 56, "tile_oc": 4, "tile_ic": 4, "vthreads": 4}
    assert not template.worth_measuring(shape, Config(big, -1))
    with pytest.raises(ValueError, match="INP needs"):
        template.program(shape, big)


def _queues(insns: tuple[object, ...]) -> tuple[dict[str, int], dict[str, int]]:
    queue = {  # (module, flag) -> queue, as in the simulator
        (Module.LOAD, "push_next"): "l2c", (Module.COMPUTE, "pop_prev"): "l2c",
        (Module.COMPUTE, "push_prev"): "c2l", (Module.LOAD, "pop_next"): "c2l",
        (Module.COMPUTE, "push_next"): "c2s", (Module.STORE, "pop_prev"): "c2s",
        (Module.STORE, "push_prev"): "s2c", (Module.COMPUTE, "pop_next"): "s2c",
    }  # fmt: skip
    pushes = dict.fromkeys(("l2c", "c2l", "c2s", "s2c"), 0)
    pops = dict(pushes)
    for insn in insns:
        for flag in ("pop_prev", "pop_next", "push_prev", "push_next"):
            if getattr(insn.deps, flag):  # type: ignore[attr-defined]
                q = queue[(module_of(insn), flag)]  # type: ignore[arg-type]
                (pushes if flag.startswith("push") else pops)[q] += 1
    return pushes, pops


@pytest.mark.parametrize("vthreads", [1, 2, 4])
def test_program_shape_and_balanced_tokens(vthreads: int) -> None:
    shape = (32, 9, 9, 48, 3, 2, 1)
    program = TEMPLATE.program(
        shape, {"tile_h": 2, "tile_w": 3, "tile_oc": 1, "tile_ic": 1, "vthreads": vthreads}
    )
    pushes, pops = _queues(program.insns)
    assert pushes == pops and pushes["l2c"] > 0 and pushes["c2s"] > 0
    insns = program.insns
    assert isinstance(insns[0], Load) and insns[0].buffer is Buffer.UOP
    inp = [i for i in insns if isinstance(i, Load) and i.buffer is Buffer.INP]
    assert any(i.y_pad_0 and i.x_pad_0 for i in inp)  # the top-left tiles' halo is padding
    alus = [i.op for i in insns if isinstance(i, Alu)]
    assert alus[:4] == [AluOp.ADD, AluOp.MAX, AluOp.SHR, AluOp.MIN]
    g = conv_shape(shape)
    gemms = [i for i in insns if isinstance(i, Gemm) and not i.reset]
    iters = sum(i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) for i in gemms)
    assert iters == g.oh * g.ow * g.k * g.k * g.cb * g.ob
    stores = [i for i in insns if isinstance(i, StoreInsn)]
    assert sum(s.y_size * s.x_size for s in stores) == g.ob * g.oh * g.ow


def test_tokens_wait_for_the_conflicting_instruction_only() -> None:
    """With two threads, thread 0's next load waits for thread 0's GEMM, not thread 1's:
    the push sits on the instruction that read the buffer, which is what overlaps load and
    compute."""
    g = conv_shape((64, 8, 8, 32, 3, 1, 1))
    sch, args = accel_schedule(g, ConvTiling(8, 8, 1, 1, 2))
    program = lower_program(sch, args, arg_layouts(g))
    insns = program.insns
    reload = next(
        j for j, i in enumerate(insns)
        if isinstance(i, Load) and i.deps.pop_next
    )  # fmt: skip
    pushers = [j for j, i in enumerate(insns[:reload]) if i.deps.push_prev]
    gemms = [j for j, i in enumerate(insns[:reload]) if isinstance(i, Gemm) and not i.reset]
    assert len(gemms) >= 2 and pushers[0] == gemms[0] < gemms[-1]
    # Re-deriving the tokens from scratch gives the same stream (flags come from buffers alone).
    assert insert_tokens(insns, program.uops) == insns


def test_unlowerable_statements_are_refused() -> None:
    g = conv_shape((16, 4, 4, 16, 1, 1, 0))
    sch, args = accel_schedule(g, ConvTiling(4, 4, 1, 1, 1))
    with pytest.raises(VtaLowerError, match="layouts"):
        lower_program(sch, args, arg_layouts(g)[:2])
    host = TEMPLATE.tensors((16, 4, 4, 16, 1, 1, 0), None)  # no accelerator scopes at all
    plain_layouts = arg_layouts(g)
    with pytest.raises(VtaLowerError):
        lower_program(create_schedule(host[-1]), host, plain_layouts)

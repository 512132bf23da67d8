"""Register promotion (compiler/lower/promote.py): small local buffers with constant offsets become
one C variable per scalar or vector slot; checked against the interpreter and built with gcc."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from compiler import ops, te, toolchain
from compiler.codegen.c import render_c
from compiler.ir import (
    Allocate,
    Buffer,
    Call,
    FloatImm,
    For,
    ForKind,
    IntImm,
    Load,
    PrimFunc,
    Store,
    Var,
    interpreter,
    seq,
)
from compiler.ir.transform import walk_stmts
from compiler.lower import PASSES, lower
from compiler.lower.promote import promote_registers
from compiler.ops.base import OpTemplate, output_arrays
from compiler.ops.space import Config
from compiler.schedule import Schedule, create_schedule

pytestmark = pytest.mark.usefixtures("build_cache")

ALL_PASSES = [name for name, _ in PASSES]
WITHOUT_PROMOTE = [name for name in ALL_PASSES if name != "promote"]


def template(name: str) -> OpTemplate:
    t = ops.get_template(name)
    assert isinstance(t, OpTemplate)
    return t


def config(t: OpTemplate, shape: tuple[int, ...], **knobs: object) -> Config:
    space = t.config_space(shape)
    return space.get(space.index_of({**space.get(0), **knobs}))


def local_allocations(func: PrimFunc) -> list[Buffer]:
    return [
        s.buffer
        for s in walk_stmts(func.body)
        if isinstance(s, Allocate) and s.buffer.scope == "local"
    ]


def call(lib: ctypes.CDLL, symbol: str, arrays: list[np.ndarray]) -> None:
    fn = lib[symbol]
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int32
    pointers = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
    assert fn(pointers) == 0


def run_template(
    t: OpTemplate, shape: tuple[int, ...], cfg: Config, func: PrimFunc, built: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(ours, numpy's) for `func` (lowered from `t` at `cfg`), interpreted or built with gcc."""
    _, args = t.instantiate(shape, cfg)
    logical = t.random_inputs(shape, np.random.default_rng(5))
    arrays = [*t.pack_inputs(shape, cfg, logical), *output_arrays(args)]
    arrays = [np.ascontiguousarray(a.reshape(x.shape)) for a, x in zip(arrays, args, strict=True)]
    if built:
        lib = ctypes.CDLL(str(toolchain.compile_shared(render_c([(func, "op")])).path))
        call(lib, "op", arrays)
    else:
        interpreter.run(func, *arrays)
    return t.unpack_output(shape, cfg, arrays[-1]), t.reference_for(shape, *logical)


TINY = [
    ("dense", (3, 20, 5), {"mr": 3, "nr": 32, "unroll_k": 2}),
    ("dense", (4, 16, 8), {"mr": 2, "nr": 16, "unroll_k": 4}),
    ("conv2d_nchwc", (1, 2, 4, 3, 2, 3, 3, 1, 1, 2), {}),
    ("conv2d_1x1_nchwc", (1, 4, 3, 3, 2, 1, 1, 2, 0, 0), {}),
    ("conv2d_1x1_nchwc", (1, 4, 3, 3, 2, 1, 1, 1, 0, 3), {"reg_n": 4}),  # flat, with a tail
]


@pytest.mark.parametrize(("name", "shape", "knobs"), TINY)
def test_promotion_keeps_interpreted_results(
    name: str, shape: tuple[int, ...], knobs: dict[str, object]
) -> None:
    t = template(name)
    cfg = config(t, shape, **knobs)
    sch, args = t.instantiate(shape, cfg)
    promoted = lower(sch, args, "op")
    plain = lower(*t.instantiate(shape, cfg), "op", passes=WITHOUT_PROMOTE)
    assert [b.registers for b in local_allocations(promoted)] != [()]
    assert all(b.registers for b in local_allocations(promoted))
    assert not any(b.registers for b in local_allocations(plain))
    ours, ref = run_template(t, shape, cfg, promoted, built=False)
    theirs, _ = run_template(t, shape, cfg, plain, built=False)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_promote_runs_right_after_unroll() -> None:
    assert ALL_PASSES.index("promote") == ALL_PASSES.index("unroll") + 1


@pytest.mark.parametrize("knobs", [{"mr": 2, "nr": 32, "unroll_k": 2}, {"mr": 4, "nr": 16}])
def test_dense_register_tile_is_variables_in_c_and_matches_numpy(knobs: dict[str, object]) -> None:
    t = template("dense")
    shape = (16, 32, 24)
    cfg = config(t, shape, **knobs)
    func = lower(*t.instantiate(shape, cfg), "op")
    mr, nr = int(cfg["mr"]), int(cfg["nr"])
    (acc,) = local_allocations(func)
    assert acc.registers == tuple((r * nr, nr) for r in range(mr))
    slots = " ".join(f"[{r * nr}:{(r + 1) * nr}]" for r in range(mr))
    assert f"C.local = allocate(float32[{mr}, 1, {nr}], local)  # registers {slots}" in str(func)
    source = render_c([(func, "op")])
    body = source[source.index("int32_t op(void **args)") :]
    assert "C_local[" not in body and "aligned(64)" not in body  # no accumulator array
    chunks = ", ".join(f"C_local_{c}" for c in range(0, nr, 16))
    assert f"kiln_vec_float32x16 {chunks};" in body
    assert "C_local_0 = (C_local_0 + " in body  # accumulates in the variable
    ours, ref = run_template(t, shape, cfg, func, built=True)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


def test_conv2d_register_tile_is_variables_in_c_and_matches_numpy() -> None:
    t = template("conv2d_nchwc")
    shape = (1, 16, 6, 6, 32, 3, 3, 1, 1, 3)
    cfg = config(t, shape, oc_block=32, reg_n=3, oh_tile=2)
    func = lower(*t.instantiate(shape, cfg), "op")
    (acc,) = local_allocations(func)
    assert len(acc.registers) == 6 and all(lanes == 32 for _, lanes in acc.registers)
    body = render_c([(func, "op")]).split("int32_t op(void **args)")[1]
    assert "conv_local[" not in body
    assert "kiln_vec_float32x16 conv_local_160, conv_local_176;" in body
    ours, ref = run_template(t, shape, cfg, func, built=True)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


def _tile(unroll: bool, rows: int = 4) -> tuple[Schedule, list[te.Tensor]]:
    """C = A @ B through a [rows][16] local tile whose row loop is unrolled or stays serial."""
    a = te.placeholder((8, 6), name="A")
    b = te.placeholder((6, 16), name="B")
    r = te.reduce_axis((0, 6), name="k")
    c = te.compute((8, 16), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    s = create_schedule(c)
    cl = s.cache_write(c, "local")
    i, j = s[c].axis
    io, ii = s[c].split(i, rows)
    s[cl].compute_at(s[c], io)
    ci, cj = s[cl].op.axis
    (ck,) = s[cl].op.reduce_axis
    s[cl].reorder(ck, ci, cj)
    if unroll:
        s[cl].unroll(ci)
        s[c].unroll(ii)
    s[cl].vectorize(cj)
    s[c].vectorize(j)
    return s, [a, b, c]


@pytest.mark.parametrize("unroll", [True, False])
def test_a_local_buffer_indexed_by_a_loop_variable_stays_an_array(unroll: bool) -> None:
    sch, args = _tile(unroll)
    func = lower(sch, args, "mm")
    (acc,) = local_allocations(func)
    text = str(func)
    assert ("# registers" in text) is unroll
    assert bool(acc.registers) is unroll
    source = render_c([(func, "mm")])
    assert ("float C_local[64] __attribute__((aligned(64)));" in source) is not unroll
    rng = np.random.default_rng(2)
    xa = rng.standard_normal((8, 6), dtype=np.float32)
    xb = rng.standard_normal((6, 16), dtype=np.float32)
    for built in (False, True):
        out = np.full((8, 16), np.nan, np.float32)
        if built:
            call(ctypes.CDLL(str(toolchain.compile_shared(source).path)), "mm", [xa, xb, out])
        else:
            interpreter.run(func, xa, xb, out)
        np.testing.assert_allclose(out, xa @ xb, rtol=1e-5, atol=1e-5)


def _buffers() -> tuple[Buffer, Buffer, Buffer]:
    x = Buffer("X", (8,), "float32")
    y = Buffer("Y", (8,), "float32")
    acc = Buffer("acc", (8,), "float32", "local")
    return x, y, acc


def test_a_non_constant_index_or_overlapping_slots_leave_the_ir_untouched() -> None:
    x, y, acc = _buffers()
    i, v = Var("i"), Var("v")
    serial = Allocate(
        acc,
        seq(
            For(i, IntImm(8), ForKind.SERIAL, Store(acc, i, Load(x, i))),
            For(i, IntImm(8), ForKind.SERIAL, Store(y, i, Load(acc, i))),
        ),
    )
    overlapping = Allocate(  # an 8-lane slice and one of its elements
        acc,
        seq(
            For(v, IntImm(8), ForKind.VECTORIZED, Store(acc, v, Load(x, v))),
            Store(y, IntImm(0), Load(acc, IntImm(3))),
        ),
    )
    for body in (serial, overlapping):
        func = PrimFunc("f", (x, y), body)
        assert promote_registers(func).body is body


def _build(func: PrimFunc, vector_bytes: int) -> tuple[str, ctypes.CDLL]:
    source = render_c([(func, "f")], vector_bytes=vector_bytes)
    return source, ctypes.CDLL(str(toolchain.compile_shared(source).path))


@pytest.mark.parametrize("vector_bytes", [64, 16])
def test_scalar_slots_and_a_slice_the_vector_renderer_cannot_take(vector_bytes: int) -> None:
    """acc[0:8] written by a vector loop, read lane by lane (tanh has no vector form); acc[8],
    acc[9] scalars summed over a serial loop."""
    x, y = Buffer("X", (8,), "float32"), Buffer("Y", (10,), "float32")
    acc = Buffer("acc", (10,), "float32", "local")
    i, v, w = Var("i"), Var("v"), Var("w")
    body = Allocate(
        acc,
        seq(
            For(v, IntImm(8), ForKind.VECTORIZED, Store(acc, v, Load(x, v) * 2.0)),
            Store(acc, IntImm(8), FloatImm(0.0)),
            Store(acc, IntImm(9), Load(x, IntImm(1))),
            For(
                i,
                IntImm(8),
                ForKind.SERIAL,
                seq(
                    Store(acc, IntImm(8), Load(acc, IntImm(8)) + Load(x, i)),
                    Store(acc, IntImm(9), Load(acc, IntImm(9)) * 0.5),
                ),
            ),
            For(w, IntImm(8), ForKind.VECTORIZED, Store(y, w, Call("tanh", (Load(acc, w),)))),
            Store(y, IntImm(8), Load(acc, IntImm(8))),
            Store(y, IntImm(9), Load(acc, IntImm(9))),
        ),
    )
    plain = PrimFunc("f", (x, y), body)
    func = promote_registers(plain)
    assert isinstance(func.body, Allocate)
    assert func.body.buffer.registers == ((0, 8), (8, 1), (9, 1))
    assert "acc = allocate(float32[10], local)  # registers [0:8] [8] [9]" in str(func)
    xs = np.random.default_rng(3).standard_normal(8, dtype=np.float32)
    expected = np.empty(10, np.float32)
    interpreter.run(plain, xs, expected)
    got = np.empty(10, np.float32)
    interpreter.run(func, xs, got)
    np.testing.assert_array_equal(got, expected)
    source, lib = _build(func, vector_bytes)
    width = vector_bytes // 4 if vector_bytes < 32 else 8
    chunks = ", ".join(f"acc_{c}" for c in range(0, 8, width))
    assert f"kiln_vec_float32x{width} {chunks};" in source
    assert "float acc_8;" in source and "float acc_9;" in source and "acc[" not in source
    assert f"Y[7] = tanhf(acc_{8 - width}[{width - 1}]);" in source  # one statement per lane
    out = np.empty(10, np.float32)
    call(lib, "f", [xs, out])
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_the_interpreter_rejects_an_access_outside_the_register_slots() -> None:
    x, y, _ = _buffers()
    acc = Buffer("acc", (8,), "float32", "local", registers=((0, 4),))
    body = Allocate(
        acc, seq(Store(acc, IntImm(5), Load(x, IntImm(0))), Store(y, IntImm(0), FloatImm(0.0)))
    )
    with pytest.raises(IndexError, match="none of its register slots"):
        interpreter.run(
            PrimFunc("f", (x, y), body), np.zeros(8, np.float32), np.zeros(8, np.float32)
        )
    with pytest.raises(ValueError, match="only local buffers"):
        Buffer("g", (8,), "float32", registers=((0, 4),))
    with pytest.raises(ValueError, match="sorted, disjoint"):
        Buffer("l", (8,), "float32", "local", registers=((0, 4), (2, 1)))

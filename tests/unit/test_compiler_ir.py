"""Loop IR: expression building, the printer, the interpreter (the oracle), linear forms."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.arith import linear_form
from compiler.ir import (
    LT,
    Allocate,
    Buffer,
    Cast,
    FloatImm,
    FloorDiv,
    FloorMod,
    For,
    ForKind,
    IfThenElse,
    IntImm,
    Load,
    Max,
    Min,
    PrimFunc,
    Stmt,
    Store,
    Var,
    interpreter,
    seq,
)


def saxpy(n: int = 10) -> PrimFunc:
    """y[i] = 2 * x[i] + y[i] over a vectorized loop."""
    x, y = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32")
    i = Var("i")
    body = Store(y, i, Load(x, i) * 2.0 + Load(y, i))
    return PrimFunc("saxpy", (x, y), For(i, IntImm(n), ForKind.VECTORIZED, body))


def test_operators_build_typed_nodes() -> None:
    i = Var("i")
    e = i * 4 + 1
    assert e.dtype == "int32"
    assert str(e) == "(i * 4) + 1"
    assert (Load(Buffer("x", (4,), "float32"), i) * 2).dtype == "float32"
    with pytest.raises(TypeError, match="float32 and int32"):
        Load(Buffer("x", (4,), "float32"), i) + i


def test_vars_compare_by_identity() -> None:
    a, b = Var("i"), Var("i")
    assert a is not b and len({a: 1, b: 2}) == 2


def test_printer_shows_loop_kinds_and_stores() -> None:
    text = str(saxpy())
    assert text.splitlines()[0] == "def saxpy(x: float32[10], y: float32[10]):"
    assert "for i in vectorized(10):" in text
    assert "y[i] = (x[i] * 2.0) + y[i]" in text


def test_interpreter_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.random(10, dtype=np.float32)
    y = rng.random(10, dtype=np.float32)
    expected = 2 * x + y
    interpreter.run(saxpy(), x, y)
    np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_interpreter_checks_bounds() -> None:
    x, y = Buffer("x", (4,), "float32"), Buffer("y", (4,), "float32")
    i = Var("i")
    func = PrimFunc("f", (x, y), For(i, IntImm(4), ForKind.SERIAL, Store(y, i, Load(x, i - 1))))
    with pytest.raises(IndexError, match=r"load x\[-1\]"):
        interpreter.run(func, np.zeros(4, np.float32), np.zeros(4, np.float32))


def test_interpreter_checks_arguments() -> None:
    with pytest.raises(ValueError, match="x wants float32"):
        interpreter.run(saxpy(), np.zeros(10, np.float64), np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="takes 2 arrays"):
        interpreter.run(saxpy(), np.zeros(10, np.float32))


def test_interpreter_floor_semantics_guards_and_min_max() -> None:
    out = Buffer("out", (6,), "int32")
    i = Var("i")
    signed = i - 3  # -3 .. 2
    body = seq(
        Store(out, i, FloorDiv(signed, IntImm(2)) * 100 + FloorMod(signed, IntImm(2))),
        IfThenElse(LT(i, IntImm(1)), Store(out, i, Max(Min(signed, IntImm(-7)), IntImm(-8)))),
    )
    func = PrimFunc("f", (out,), For(i, IntImm(6), ForKind.SERIAL, body))
    result = np.zeros(6, np.int32)
    interpreter.run(func, result)
    s = np.arange(6) - 3
    expected = (s // 2) * 100 + s % 2
    expected[0] = -7
    np.testing.assert_array_equal(result, expected)


def test_a_local_buffer_is_each_gpu_threads_own() -> None:
    # 4 threads; a nested loop of the same tag runs every thread's share again (a shared tile's
    # copy), and a "local" register written in one such loop and read in the next must be the
    # running thread's, as on the GPU: out[t] = 10 t, not 30 for every thread
    out = Buffer("out", (4,), "float32")
    reg = Buffer("reg", (1,), "float32", "local")
    t, t1, t2 = Var("t"), Var("t1"), Var("t2")

    def bound(v: Var, body: Stmt) -> For:
        return For(v, IntImm(4), ForKind.THREAD_BINDING, body, "threadIdx.x")

    write = bound(t1, Store(reg, IntImm(0), Cast("float32", t1) * 10.0))
    read = bound(t2, Store(out, t2, Load(reg, IntImm(0))))
    func = PrimFunc("f", (out,), bound(t, Allocate(reg, seq(write, read))))
    result = np.zeros(4, np.float32)
    interpreter.run(func, result)
    np.testing.assert_array_equal(result, [0.0, 10.0, 20.0, 30.0])


def test_float_constants_round_to_their_dtype() -> None:
    out = Buffer("out", (1,), "float32")
    func = PrimFunc("f", (out,), Store(out, IntImm(0), FloatImm(0.1) + FloatImm(0.2)))
    result = np.zeros(1, np.float32)
    interpreter.run(func, result)
    assert result[0] == np.float32(0.1) + np.float32(0.2)


def test_linear_form() -> None:
    i, j = Var("i"), Var("j")
    form = linear_form((j * 4 + i) * 13 + j, i)
    assert form is not None
    assert form[0] == 13 and str(form[1]) == "(13 * (j * 4)) + j"
    invariant = j * 3
    assert linear_form(invariant, i) == (0, invariant)
    minus = linear_form(i - i * 2, i)
    assert minus is not None and minus[0] == -1
    assert linear_form(FloorDiv(i, IntImm(2)), i) is None
    assert linear_form(i * j, i) is None


def test_a_decided_select_keeps_only_its_branch() -> None:
    """Substituting a constant or simplifying with known values takes the branch of a decided
    Select (Winograd's transform tables: a chain per unrolled axis) and leaves the rest alone."""
    from compiler.arith import simplify
    from compiler.ir import expr as E

    i, j, k = Var("i"), Var("j"), Var("k")
    x = Buffer("x", (8,), "float32")
    table = E.Select(
        E.EQ(i, IntImm(0)), Load(x, j), E.Select(E.EQ(i, IntImm(1)), Load(x, j + 1), FloatImm(0.0))
    )
    assert str(E.substitute(table, {i: IntImm(1), j: IntImm(3)})) == str(Load(x, IntImm(3) + 1))
    assert str(E.substitute(table, {i: IntImm(5)})) == str(FloatImm(0.0))
    assert isinstance(E.substitute(table, {j: IntImm(3)}), E.Select)  # i still unknown
    # (4k + 1) % 4 == 1 needs the simplifier: it decides the chain to the second entry
    decided = simplify(E.substitute(table, {i: FloorMod(k * 4 + 1, IntImm(4))}))
    assert str(decided) == str(Load(x, j + 1))

"""Every lowering pass against the interpreter: run the nest after each pass on random inputs and
compare with the unlowered nest; plus the arith simplifier and interval analysis on their own."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from compiler import te
from compiler.arith import TRUE, const_bounds, simplify, symbolic_interval
from compiler.ir import LT, Expr, For, IfThenElse, IntImm, Min, PrimFunc, Var, interpreter
from compiler.ir.transform import walk_stmts
from compiler.lower import PASSES, lower_loop_nest
from compiler.lower.make_api import make_api
from compiler.schedule import Schedule, create_schedule, gemm_intrin


def _matmul(m: int, n: int, k: int) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    return a, b, te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")


def tiled_tails() -> tuple[Schedule, list[te.Tensor]]:
    a, b, c = _matmul(11, 13, 7)
    s = create_schedule(c)
    i, j = c.op.axis
    (k,) = c.op.reduce_axis
    io, jo, ii, ji = s[c].tile(i, j, 4, 8)
    ko, ki = s[c].split(k, 3)
    s[c].reorder(io, jo, ko, ii, ki, ji)
    s[c].unroll(ii)
    s[c].vectorize(ji)
    return s, [a, b, c]


def register_tile() -> tuple[Schedule, list[te.Tensor]]:
    a, b, c = _matmul(10, 37, 3)
    s = create_schedule(c)
    cl = s.cache_write(c, "local")
    i, j = s[c].axis
    io, jo, _ii, ji = s[c].tile(i, j, 4, 12)
    s[c].parallel(io)
    s[c].vectorize(ji)
    s[cl].compute_at(s[c], jo)
    ci, cj = s[cl].op.axis
    s[cl].reorder(s[cl].op.reduce_axis[0], ci, cj)
    s[cl].unroll(ci)
    s[cl].vectorize(cj)
    return s, [a, b, c]


def padded_stencil() -> tuple[Schedule, list[te.Tensor]]:
    x = te.placeholder((9, 10), name="X")
    pad = te.compute(
        (11, 12),
        lambda i, j: te.if_then_else(
            te.all_of(
                te.greater_equal(i, 1), te.less(i, 10), te.greater_equal(j, 1), te.less(j, 11)
            ),
            x[te.minimum(te.maximum(i - 1, 0), 8), te.minimum(te.maximum(j - 1, 0), 9)],
            0.0,
        ),
        name="pad",
    )
    r = te.reduce_axis((0, 3), name="r")
    y = te.compute((9, 10), lambda i, j: te.sum(pad[i + r, j + 1] * 0.5, axis=r), name="Y")
    s = create_schedule(y)
    yo, _ = s[y].split(y.op.axis[0], 4)
    s[pad].compute_at(s[y], yo)
    return s, [x, y]


def tensorized_double_buffered() -> tuple[Schedule, list[te.Tensor]]:
    a, b, c = _matmul(16, 16, 24)
    s = create_schedule(c)
    i, j = c.op.axis
    io, jo, ii, ji = s[c].tile(i, j, 8, 8)
    ko, ki = s[c].split(c.op.reduce_axis[0], 8)
    s[c].reorder(io, jo, ko, ii, ji, ki)
    s[c].tensorize(ii, gemm_intrin(8, 8, 8))
    bs = s.cache_read(b, "local", [c])
    s[bs].compute_at(s[c], ko)
    s[bs].double_buffer()
    return s, [a, b, c]


CASES: dict[str, Callable[[], tuple[Schedule, list[te.Tensor]]]] = {
    "tiled_tails": tiled_tails,
    "register_tile": register_tile,
    "padded_stencil": padded_stencil,
    "tensorized_double_buffered": tensorized_double_buffered,
}


def _run(func: PrimFunc, tensors: list[te.Tensor], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    arrays = []
    for t in tensors:
        if isinstance(t.op, te.PlaceholderOp):
            arrays.append(rng.standard_normal(t.shape, dtype=np.float32))
        else:
            arrays.append(np.full(t.shape, np.nan, np.float32))
    interpreter.run(func, *arrays)
    return arrays[-1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_pass_keeps_the_result(case: str) -> None:
    sch, tensors = CASES[case]()
    func = lower_loop_nest(sch, tensors, case)
    expected = _run(func, tensors, seed=3)
    assert not np.isnan(expected).any()
    for name, run in PASSES:
        func = run(func)
        got = _run(func, tensors, seed=3)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=f"after {name}")
    make_api(func.name, func.params, func.body)


def test_partition_leaves_no_min_or_guard_in_the_main_tile() -> None:
    sch, tensors = tiled_tails()
    func = lower_loop_nest(sch, tensors, "f")
    for name, run in PASSES:
        if name in ("flatten", "simplify", "partition"):
            func = run(func)
    main = func.body.stmts[0] if hasattr(func.body, "stmts") else func.body
    assert isinstance(main, For) and str(main.extent) == "2"  # 11 = 2 full tiles of 4 + tail
    for s in walk_stmts(main):
        assert not isinstance(s, IfThenElse)
        if isinstance(s, For):
            assert not isinstance(s.extent, Min), str(s)


def test_simplifier_rules() -> None:
    i, j, n = Var("i"), Var("j"), Var("n")
    assert str(simplify((n * 16 + i) // 16, {i: (0, 15)})) == "n"
    assert str(simplify((n * 16 + i) % 16, {i: (0, 15)})) == "i"
    assert str(simplify((n * 4 + i) * 3 - n * 12 + 5 - 2)) == "(i * 3) + 3"
    assert str(simplify(Min(IntImm(16), 100 - n * 16), {n: (0, 5)})) == "16"
    assert str(simplify((j // 2) // 4)) == "j // 8"
    assert simplify(LT(i, IntImm(20)), {i: (0, 15)}) is TRUE
    assert str(simplify((i + 3) % 16, {i: (0, 20)})) == "(i + 3) % 16"


def test_interval_analysis() -> None:
    i, j, o = Var("i"), Var("j"), Var("o")
    assert const_bounds(i * 3 - j, {i: (0, 4), j: (1, 2)}) == (-2, 11)
    assert const_bounds(i // 4, {i: (0, 15)}) == (0, 3)
    assert const_bounds(i % 4, {i: (0, 15)}) == (0, 3)
    assert const_bounds(o, {}) is None
    found = symbolic_interval(o * 8 + i + j, {i: (IntImm(0), 8), j: (IntImm(0), 3)})
    assert found is not None
    assert found[1] == 10 and str(simplify(found[0])) == "o * 8"


def test_interval_of_a_split_divided_by_its_factor_is_one_quotient() -> None:
    """lo known modulo c: [o*4, o*4 + 4) // 4 is the one quotient o (bound inference of a
    stage attached at a tile loop reads one tile, not two); otherwise the bound stays loose."""
    i, o = Var("i"), Var("o")
    inner: dict[Var, tuple[Expr, int]] = {i: (IntImm(0), 4)}
    found = symbolic_interval((o * 4 + i) // 4, inner)
    assert found is not None and found[1] == 1 and str(simplify(found[0])) == "o"
    for start, quotients in ((o * 4 + 1, 2), (o * 8 + 3, 2), (o * 8 + 4, 1), (o, 2)):
        found = symbolic_interval((start + i) // 4, inner)  # `o` alone: its residue unknown
        assert found is not None and found[1] == quotients, start

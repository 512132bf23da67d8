"""Lowering schedules to loop nests, checked by running them in the IR interpreter against numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from compiler import ops, te
from compiler.errors import LowerError
from compiler.ir import IfThenElse, PrimFunc, Stmt, interpreter
from compiler.ir.stmt import For, Seq
from compiler.lower import lower, lower_loop_nest
from compiler.schedule import create_schedule

MATMUL = ops.get_template("matmul")


def run_matmul(
    func: PrimFunc, m: int, n: int, k: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.full((m, n), np.nan, np.float32)  # NaN: any element the nest misses stays wrong
    interpreter.run(func, a, b, c)
    return c, MATMUL.reference(a, b)


def contains(stmt: Stmt, kind: type) -> bool:
    if isinstance(stmt, kind):
        return True
    if isinstance(stmt, For):
        return contains(stmt.body, kind)
    if isinstance(stmt, Seq):
        return any(contains(s, kind) for s in stmt.stmts)
    if isinstance(stmt, IfThenElse):
        return contains(stmt.then_case, kind)
    return False


def test_every_tiling_of_an_odd_matmul_is_correct() -> None:
    shape = (7, 13, 5)
    space = MATMUL.config_space(shape)
    tiles = [k.choices for k in space.knobs[:3]]
    for n, (tm, tn, tk) in enumerate(itertools.product(*tiles)):
        flags = {"vectorize": n % 2 == 0, "unroll": n % 3 == 0}
        config = space.get(space.index_of({"tile_m": tm, "tile_n": tn, "tile_k": tk, **flags}))
        sch, args = MATMUL.instantiate(shape, config)
        c, expected = run_matmul(lower(sch, args, "mm"), 7, 13, 5)
        np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5, err_msg=str(config))


@pytest.mark.parametrize("shape", [(1, 1, 1), (8, 8, 8), (16, 4, 9), (3, 17, 2)])
def test_matmul_shapes_with_largest_and_smallest_tiles(shape: tuple[int, int, int]) -> None:
    space = MATMUL.config_space(shape)
    for index in (0, len(space) - 1, len(space) // 2):
        sch, args = MATMUL.instantiate(shape, space.get(index))
        m, n, k = shape
        c, expected = run_matmul(lower(sch, args, "mm"), m, n, k)
        np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5)


def test_non_dividing_split_cuts_the_inner_extent_instead_of_branching() -> None:
    a, b, c = MATMUL.compute((7, 13, 5))
    sch = create_schedule(c)
    m, _ = sch[c].axis
    sch[c].split(m, 3)
    nest = lower_loop_nest(sch, [a, b, c], "mm")
    assert "for m_i in range(min(3, 7 - (m_o * 3))):" in str(nest)
    assert not contains(nest.body, IfThenElse)
    func = lower(sch, [a, b, c], "mm")  # loop partition: 2 full tiles of 3, then a tail of 1
    assert "min(" not in str(func)
    assert str(func).splitlines()[1:3] == ["  for m_o in range(2):", "    for m_i in range(3):"]
    for f in (nest, func):
        out, expected = run_matmul(f, 7, 13, 5)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_guard_when_the_inner_loop_is_outside_its_outer_part() -> None:
    a, b, c = MATMUL.compute((7, 6, 5))
    sch = create_schedule(c)
    stage = sch[c]
    m, _ = stage.axis
    mo, mi = stage.split(m, 3)
    stage.reorder(mi, mo)  # inner outside outer: no loop bound can express m < 7
    nest = lower_loop_nest(sch, [a, b, c], "mm")
    assert contains(nest.body, IfThenElse)
    func = lower(sch, [a, b, c], "mm")  # partition decides the guard in every piece
    assert not contains(func.body, IfThenElse)
    for f in (nest, func):
        out, expected = run_matmul(f, 7, 6, 5)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_nested_non_dividing_splits() -> None:
    a, b, c = MATMUL.compute((11, 10, 7))
    sch = create_schedule(c)
    stage = sch[c]
    m, n = stage.axis
    (k,) = stage.reduce_axis
    _, mi = stage.split(m, 8)
    mio, mii = stage.split(mi, 3)  # 8 is not a multiple of 3 either
    ko, ki = stage.split(k, 4)
    stage.reorder(ki, mii, n, mio, ko)  # a reduction loop first, every split inner out of place
    out, expected = run_matmul(lower(sch, [a, b, c], "mm"), 11, 10, 7)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_reduction_init_runs_once_per_output_before_accumulating() -> None:
    a, b, c = MATMUL.compute((4, 4, 3))
    sch = create_schedule(c)
    stage = sch[c]
    m, n = stage.axis
    (k,) = stage.reduce_axis
    stage.reorder(m, k, n)
    text = str(lower(sch, [a, b, c], "mm"))
    assert text.splitlines()[1:4] == [
        "  for m in range(4):",
        "    for n in range(4):",
        "      C[(m * 4) + n] = 0.0",
    ]
    out, expected = run_matmul(lower(sch, [a, b, c], "mm"), 4, 4, 3)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_elementwise_compute_and_two_stages() -> None:
    x = te.placeholder((5, 6), name="x")
    y = te.compute((5, 6), lambda i, j: x[i, j] * 2.0 + 1.0, name="y")
    z = te.compute((5, 6), lambda i, j: y[i, j] - x[i, j], name="z")
    sch = create_schedule(z)
    stage = sch[z]
    _, j = stage.axis
    _, ji = stage.split(j, 4)
    stage.vectorize(ji)
    func = lower(sch, [x, y, z], "f")
    xs = np.arange(30, dtype=np.float32).reshape(5, 6)
    ys, zs = np.zeros_like(xs), np.zeros_like(xs)
    interpreter.run(func, xs, ys, zs)
    np.testing.assert_array_equal(zs, xs + 1)


def test_intermediate_tensor_gets_its_own_buffer_and_missing_input_is_an_error() -> None:
    x = te.placeholder((4,), name="x")
    y = te.compute((4,), lambda i: x[i] + 1.0, name="y")
    z = te.compute((4,), lambda i: y[i] * 2.0, name="z")
    func = lower(create_schedule(z), [x, z], "f")
    assert "y = allocate(float32[4], global)" in str(func)
    xs, zs = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    interpreter.run(func, xs, zs)
    np.testing.assert_array_equal(zs, (xs + 1) * 2)
    with pytest.raises(LowerError, match="input x is not among"):
        lower(create_schedule(z), [z], "f")

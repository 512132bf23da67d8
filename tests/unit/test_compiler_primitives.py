"""Placement and cache primitives, fuse, tensorize, double buffering: lowered, then run in the
interpreter against numpy (and the loop structure they promise checked in the printed IR)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler import te
from compiler.errors import LowerError, ScheduleError
from compiler.ir import interpreter
from compiler.lower import lower
from compiler.schedule import Schedule, create_schedule, gemm_intrin

RNG = np.random.default_rng(7)


def matmul(m: int, n: int, k: int) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return a, b, c


def run_matmul(sch: Schedule, tensors: list[te.Tensor]) -> tuple[str, float]:
    a, b, c = tensors
    func = lower(sch, tensors, "mm")
    xa = RNG.standard_normal(a.shape, dtype=np.float32)
    xb = RNG.standard_normal(b.shape, dtype=np.float32)
    out = np.full(c.shape, np.nan, np.float32)
    interpreter.run(func, xa, xb, out)
    return str(func), float(np.abs(out - xa @ xb).max())


def register_tile(m: int, n: int, k: int, mr: int, nr: int, fuse: bool) -> tuple[Schedule, list]:
    a, b, c = matmul(m, n, k)
    s = create_schedule(c)
    cl = s.cache_write(c, "local")
    i, j = s[c].axis
    io, jo, _ii, ji = s[c].tile(i, j, mr, nr)
    at = s[c].fuse(io, jo) if fuse else jo
    s[c].parallel(at if fuse else io)
    s[c].vectorize(ji)
    s[cl].compute_at(s[c], at)
    ci, cj = s[cl].op.axis
    (ck,) = s[cl].op.reduce_axis
    s[cl].reorder(ck, ci, cj)
    s[cl].unroll(ci)
    s[cl].vectorize(cj)
    return s, [a, b, c]


@pytest.mark.parametrize(
    ("shape", "tile", "fuse"),
    [((8, 32, 5), (4, 16), False), ((10, 37, 3), (4, 16), False), ((10, 37, 3), (3, 8), True)],
)
def test_register_tile_by_cache_write_and_compute_at(
    shape: tuple[int, int, int], tile: tuple[int, int], fuse: bool
) -> None:
    s, args = register_tile(*shape, *tile, fuse)
    text, err = run_matmul(s, args)
    assert err < 1e-4
    # the accumulator tile is allocated per iteration of the attach loop, at the tile's size
    assert f"C.local = allocate(float32[{tile[0]}, {tile[1]}], local)" in text
    assert text.count("parallel(") >= 1


def test_compute_at_infers_a_halo_region_under_a_non_dividing_split() -> None:
    x = te.placeholder((20,), name="X")
    p = te.compute((22,), lambda i: x[te.minimum(te.maximum(i - 1, 0), 19)] * 3.0, name="P")
    y = te.compute((20,), lambda i: p[i] + p[i + 1] + p[i + 2], name="Y")
    s = create_schedule(y)
    yo, _ = s[y].split(y.op.axis[0], 6)
    s[p].compute_at(s[y], yo)
    func = lower(s, [x, y], "stencil")
    assert "P = allocate(float32[8], global)" in str(func)  # 6 outputs read 6 + 2 inputs
    xs = RNG.standard_normal(20, dtype=np.float32)
    ys = np.zeros(20, np.float32)
    interpreter.run(func, xs, ys)
    ps = xs[np.clip(np.arange(22) - 1, 0, 19)] * 3
    np.testing.assert_allclose(ys, ps[:-2] + ps[1:-1] + ps[2:], rtol=1e-6)


def test_compute_inline_removes_the_stage_and_its_buffer() -> None:
    x = te.placeholder((4, 6), name="X")
    relu = te.compute((4, 6), lambda i, j: te.maximum(x[i, j], 0.0), name="relu")
    y = te.compute((4, 6), lambda i, j: relu[i, j] * 2.0 + te.exp(relu[i, j]), name="Y")
    s = create_schedule(y)
    s[relu].compute_inline()
    func = lower(s, [x, y], "f")
    assert "allocate" not in str(func) and "relu" not in str(func)
    xs = RNG.standard_normal((4, 6), dtype=np.float32)
    ys = np.zeros_like(xs)
    interpreter.run(func, xs, ys)
    r = np.maximum(xs, 0)
    np.testing.assert_allclose(ys, r * 2 + np.exp(r), rtol=1e-6)


def test_max_reduction_and_fuse_of_data_axes() -> None:
    x = te.placeholder((5, 6, 7), name="X")
    r = te.reduce_axis((0, 7), name="r")
    y = te.compute((5, 6), lambda i, j: te.max(x[i, j, r], axis=r), name="Y")
    s = create_schedule(y)
    f = s[y].fuse(*y.op.axis)
    fo, _ = s[y].split(f, 4)
    s[y].parallel(fo)
    func = lower(s, [x, y], "f")
    xs = RNG.standard_normal((5, 6, 7), dtype=np.float32)
    ys = np.zeros((5, 6), np.float32)
    interpreter.run(func, xs, ys)
    np.testing.assert_array_equal(ys, xs.max(axis=2))


def test_tensorize_gemm_intrinsic_update_and_reset() -> None:
    a, b, c = matmul(16, 32, 24)
    s = create_schedule(c)
    i, j = c.op.axis
    (k,) = c.op.reduce_axis
    io, jo, ii, ji = s[c].tile(i, j, 8, 8)
    ko, ki = s[c].split(k, 8)
    s[c].reorder(io, jo, ko, ii, ji, ki)
    s[c].tensorize(ii, gemm_intrin(8, 8, 8))
    text, err = run_matmul(s, [a, b, c])
    assert err < 1e-4
    assert "kiln_gemm8x8x8_update(C+" in text and "_reset" not in text

    a, b, c = matmul(16, 16, 8)  # the whole reduction inside: the reset part runs first
    s = create_schedule(c)
    i, j = c.op.axis
    io, jo, ii, ji = s[c].tile(i, j, 8, 8)
    s[c].tensorize(ii, gemm_intrin(8, 8, 8))
    text, err = run_matmul(s, [a, b, c])
    assert err < 1e-4
    assert "kiln_gemm8x8x8_reset(C+" in text


def test_tensorize_mismatch_names_the_loop() -> None:
    a, b, c = matmul(16, 16, 24)
    s = create_schedule(c)
    i, j = c.op.axis
    _, _, ii, _ = s[c].tile(i, j, 8, 8)
    s[c].tensorize(ii, gemm_intrin(8, 8, 8))
    with pytest.raises(
        LowerError, match=r"stage C: tensorize kiln_gemm8x8x8: loop k \(reduce, 24\)"
    ):
        lower(s, [a, b, c], "mm")
    with pytest.raises(ScheduleError, match="covers 2 loops, intrinsic kiln_gemm8x8x8 has 3"):
        s[c].tensorize(s[c].leaf_iter_vars[-2], gemm_intrin(8, 8, 8))


def test_cache_read_with_double_buffer() -> None:
    a, b, c = matmul(16, 32, 24)
    s = create_schedule(c)
    i, j = c.op.axis
    (k,) = c.op.reduce_axis
    io, jo, ii, ji = s[c].tile(i, j, 8, 8)
    ko, ki = s[c].split(k, 8)
    s[c].reorder(io, jo, ko, ii, ji, ki)
    shared = s.cache_read(a, "shared", [c])
    s[shared].compute_at(s[c], ko)
    s[shared].double_buffer()
    text, err = run_matmul(s, [a, b, c])
    assert err < 1e-4
    assert "A.shared = allocate(float32[128], shared)" in text  # two halves of 8x8
    assert "if (k_o + 1) < 3:" in text  # the prefetch of the next tile


def test_placement_errors_name_stage_and_axis() -> None:
    _a, _b, c = matmul(8, 8, 8)
    s = create_schedule(c)
    cl = s.cache_write(c, "local")
    with pytest.raises(
        ScheduleError, match=r"stage C.local: compute_at axis k, which is not a loop of stage C"
    ):
        s[cl].compute_at(s[c], cl.op.reduce_axis[0])
    x = te.placeholder((4,), name="X")
    y = te.compute((4,), lambda i: x[i] + 1.0, name="Y")
    z = te.compute((4,), lambda i: x[i] * 2.0, name="Z")
    s2 = create_schedule([y, z])
    with pytest.raises(ScheduleError, match=r"stage Y: compute_at stage Z .* does not read Y"):
        s2[y].compute_at(s2[z], z.op.axis[0])
    with pytest.raises(ScheduleError, match="stage C: cannot compute_inline a reduction"):
        create_schedule(c)[c].compute_inline()
    with pytest.raises(ScheduleError, match="stage C: cache_write after other primitives"):
        s3 = create_schedule(c)
        s3[c].split(c.op.axis[0], 2)
        s3.cache_write(c, "local")


def test_fuse_and_bind_errors() -> None:
    _a, _b, c = matmul(8, 8, 8)
    s = create_schedule(c)
    i, j = c.op.axis
    (k,) = c.op.reduce_axis
    with pytest.raises(
        ScheduleError, match=r"stage C: fuse of data and reduction axes \['j', 'k'\]"
    ):
        s[c].fuse(j, k)
    with pytest.raises(
        ScheduleError, match=r"stage C: fuse of axis k, which is not the leaf right inside i"
    ):
        s[c].fuse(i, k)
    with pytest.raises(
        ScheduleError, match="stage C: reduction axis k can be bound to threadIdx only"
    ):
        s[c].bind(k, "blockIdx.x")
    with pytest.raises(ScheduleError, match=r"stage C: bind of axis i to 'thread\.x'"):
        s[c].bind(i, "thread.x")
    with pytest.raises(ScheduleError, match="stage C: split of axis i needs exactly one of"):
        s[c].split(i)


def test_split_by_nparts() -> None:
    a, b, c = matmul(10, 8, 3)
    s = create_schedule(c)
    io, ii = s[c].split(c.op.axis[0], nparts=3)
    assert (io.extent, ii.extent) == (3, 4)
    _, err = run_matmul(s, [a, b, c])
    assert err < 1e-4


@pytest.mark.parametrize("combiner", ["max", "min"])
def test_cache_write_keeps_the_combiner_of_a_reduction(combiner: str) -> None:
    a = te.placeholder((6, 9), name="A")
    r = te.reduce_axis((0, 9), name="r")
    reduce = te.max if combiner == "max" else te.min
    c = te.compute((6,), lambda i: reduce(a[i, r], axis=r), name="C")
    s = create_schedule(c)
    cl = s.cache_write(c, "local")
    s[cl].compute_at(s[c], s[c].axis[0])
    func = lower(s, [a, c], "red")
    xa = RNG.standard_normal(a.shape, dtype=np.float32) - 5.0  # all negative: a sum from 0 fails
    out = np.full(c.shape, np.nan, np.float32)
    interpreter.run(func, xa, out)
    reference = xa.max(axis=1) if combiner == "max" else xa.min(axis=1)
    np.testing.assert_allclose(out, reference)

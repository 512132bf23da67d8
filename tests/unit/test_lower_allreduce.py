"""Cross-thread reductions (compiler/lower/allreduce.py): a reduce loop bound to threadIdx becomes
phases of sibling thread loops with a shared-memory tree between barriers, which the interpreter
runs as the GPU block would, checked against numpy at odd sizes."""

from __future__ import annotations

import re

import numpy as np
import pytest

from compiler import te
from compiler.codegen.cuda import render_cuda
from compiler.errors import LowerError, ScheduleError
from compiler.ir import PrimFunc, interpreter
from compiler.lower import lower
from compiler.schedule import create_schedule

ROWS, COLS = 5, 37


def row_reduction(combiner: str, threads: int) -> tuple[PrimFunc, te.Tensor]:
    """out[r] = combiner over k of x[r, k]: a row per block, the row's k strided over threads."""
    x = te.placeholder((ROWS, COLS), name="x")
    k = te.reduce_axis((0, COLS), name="k")
    fold = te.sum if combiner == "sum" else te.max
    out = te.compute((ROWS,), lambda r: fold(x[r, k], axis=k), name="out")
    s = create_schedule(out)
    _, ki = s[out].split(k, threads)
    s[out].bind(out.op.axis[0], "blockIdx.x")
    s[out].bind(ki, "threadIdx.x")
    return lower(s, [x, out], "rows"), out


@pytest.mark.parametrize("threads", [1, 8, 16, 64])  # 64 > 37: one element a thread, 37 threads
@pytest.mark.parametrize("combiner", ["sum", "max"])
def test_a_row_reduction_over_the_threads_of_a_block_matches_numpy(
    combiner: str, threads: int
) -> None:
    func, _ = row_reduction(combiner, threads)
    x = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    out = np.full(ROWS, np.nan, np.float32)
    interpreter.run(func, x, out)
    want = x.sum(axis=1) if combiner == "sum" else x.max(axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_the_tree_is_phases_of_thread_loops_between_barriers() -> None:
    func, _ = row_reduction("sum", 16)
    text = str(func)
    assert "out.red = allocate(float32[16], shared)" in text
    # partials, 4 tree steps (16 -> 1), the result: 6 phases, a barrier after each
    assert text.count("for k_i in bind[threadIdx.x](16):") == 6
    assert text.count("barrier()") == 6
    # the last step keeps its thread loop (loop partition does not cut a thread loop into a
    # one-iteration piece that every thread would run) and only thread 0 writes the result
    assert re.search(r"bind\[threadIdx.x\]\(16\):\n\s+if k_i < 1:", text)
    assert re.search(r"if k_i == 0:\n\s+out\[r\] = out.red\[0\]", text)
    source = render_cuda(func, "rows").source
    assert source.count("__syncthreads();") == 6
    assert "__shared__ __align__(16) float out_red[16];" in source


@pytest.mark.parametrize("combiner", ["sum", "max"])
def test_the_last_32_partials_fold_by_warp_shuffles(combiner: str) -> None:
    # 150 columns on 64 threads: one shared step (64 -> 32), then one warp's shuffles, which
    # the interpreter emulates; the result lands in the extra slot red[64]
    cols = 150
    x = te.placeholder((ROWS, cols), name="x")
    k = te.reduce_axis((0, cols), name="k")
    fold = te.sum if combiner == "sum" else te.max
    out = te.compute((ROWS,), lambda r: fold(x[r, k], axis=k), name="out")
    s = create_schedule(out)
    _, ki = s[out].split(k, 64)
    s[out].bind(out.op.axis[0], "blockIdx.x")
    s[out].bind(ki, "threadIdx.x")
    func = lower(s, [x, out], "rows")
    text = str(func)
    assert "out.red = allocate(float32[65], shared)" in text
    assert f"kiln_warp_{combiner}_float32(out.red+64, out.red+0)" in text
    assert text.count("barrier()") == 4  # partials, 64 -> 32, the warp, the result
    data = np.random.default_rng(4).standard_normal((ROWS, cols)).astype(np.float32)
    got = np.full(ROWS, np.nan, np.float32)
    interpreter.run(func, data, got)
    want = data.sum(axis=1) if combiner == "sum" else data.max(axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    source = render_cuda(func, "rows").source
    assert "kiln_warp_" + combiner + "_float32(&out_red[64], 1, &out_red[0], 1);" in source


def test_no_warp_shuffles_where_a_warp_would_straddle_rows() -> None:
    # 37 threads a block: threads 0-31 are a warp, but the block is not whole warps, and a
    # reduction narrower than a warp has no 32 partials to shuffle
    for threads in (16, 64):
        func, _ = row_reduction("sum", threads)
        assert "kiln_warp" not in str(func)


def test_a_reduction_width_that_is_not_a_power_of_two_folds_its_odd_partials() -> None:
    func, _ = row_reduction("sum", 64)  # 37 threads: 32 + 5 in the first step
    assert "if (k_i < 32) and ((k_i + 32) < 37):" in str(func)


def test_rows_on_thread_y_each_reduce_their_own_partials() -> None:
    # a warp-per-row shape: 4 rows a block on threadIdx.y (5 rows: the last block has 1), the
    # statistic in shared memory read by every thread of the row in the output
    x = te.placeholder((ROWS, COLS), name="x")
    k = te.reduce_axis((0, COLS), name="k")
    mx = te.compute((ROWS,), lambda r: te.max(x[r, k], axis=k), name="mx")
    out = te.compute((ROWS, COLS), lambda r, c: x[r, c] - mx[r], name="out")
    s = create_schedule(out)
    r, c = out.op.axis
    block, row = s[out].split(r, 4)
    co, ci = s[out].split(c, 8)
    s[out].reorder(block, row, ci, co)
    s[out].bind(block, "blockIdx.x")
    s[out].bind(row, "threadIdx.y")
    s[out].bind(ci, "threadIdx.x")
    s[mx].set_scope("shared")
    s[mx].compute_at(s[out], block)
    s[mx].bind(mx.op.axis[0], "threadIdx.y")
    _, ki = s[mx].split(k, 8)
    s[mx].bind(ki, "threadIdx.x")
    func = lower(s, [x, out], "rows")
    assert "mx.red = allocate(float32[4, 8], shared)" in str(func)
    data = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32)
    got = np.full((ROWS, COLS), np.nan, np.float32)
    interpreter.run(func, data, got)
    np.testing.assert_allclose(got, data - data.max(axis=1, keepdims=True), rtol=1e-6)


def test_threads_the_reduction_does_not_use_sit_out_its_phases() -> None:
    # the output runs on threadIdx.y too; the reduction binds only threadIdx.x, so its phases
    # run on threadIdx.y == 0 alone (other rows of threads would race on the partials)
    x = te.placeholder((ROWS, COLS), name="x")
    k = te.reduce_axis((0, COLS), name="k")
    total = te.compute((1,), lambda i: te.sum(x[i * 0, k], axis=k), name="total")
    out = te.compute((ROWS, COLS), lambda r, c: x[r, c] * total[0], name="out")
    s = create_schedule(out)
    r, c = out.op.axis
    s[out].bind(r, "threadIdx.y")
    s[out].bind(c, "threadIdx.x")
    s[total].set_scope("shared")
    _, ki = s[total].split(k, 16)
    s[total].bind(ki, "threadIdx.x")
    func = lower(s, [x, out], "scale")
    assert "bind[threadIdx.y](1)" in str(func)
    data = np.random.default_rng(2).standard_normal((ROWS, COLS)).astype(np.float32)
    got = np.full((ROWS, COLS), np.nan, np.float32)
    interpreter.run(func, data, got)
    np.testing.assert_allclose(got, data * data[0].sum(), rtol=1e-5)


def test_malformed_cross_thread_reductions_are_refused() -> None:
    x = te.placeholder((ROWS, COLS), name="x")
    k = te.reduce_axis((0, COLS), name="k")
    out = te.compute((ROWS,), lambda r: te.sum(x[r, k], axis=k), name="out")
    s = create_schedule(out)
    with pytest.raises(ScheduleError, match="reduction axis k can be bound to threadIdx only"):
        s[out].bind(k, "blockIdx.x")
    _, ki = s[out].split(k, 8)
    s[out].bind(ki, "threadIdx.x")  # the row loop stays serial: 5 rows, one set of partials
    with pytest.raises(LowerError, match=r"data loop r \(extent 5\) of a cross-thread reduction"):
        lower(s, [x, out], "bad")


def test_a_cross_thread_reduction_inside_a_thread_loop_is_refused() -> None:
    x = te.placeholder((ROWS, COLS), name="x")
    k = te.reduce_axis((0, COLS), name="k")
    total = te.compute((ROWS,), lambda r: te.sum(x[r, k], axis=k), name="total")
    out = te.compute((ROWS,), lambda r: total[r] * 2.0, name="out")
    s = create_schedule(out)
    s[out].bind(out.op.axis[0], "threadIdx.y")
    s[total].compute_at(s[out], out.op.axis[0])
    _, ki = s[total].split(k, 8)
    s[total].bind(ki, "threadIdx.x")
    with pytest.raises(
        LowerError, match=r"computed outside every thread loop \(it is inside out.s\)"
    ):
        lower(s, [x, out], "bad")

"""The CUDA renderer: shared-memory and register-tiled GEMMs, checked in the interpreter against
numpy and compiled with nvcc for sm_90 (no GPU needed; skipped when nvcc is absent). Running them
on a GPU is `test_cuda_gpu.py`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from compiler import te
from compiler.codegen.cuda import render_cuda
from compiler.errors import BuildError, CodegenError, ScheduleError
from compiler.ir import PrimFunc, interpreter
from compiler.lower import lower
from compiler.ops.cuda_gemm import GEMM_CONFIGS, GemmConfig, cuda_gemm
from compiler.schedule import create_schedule
from compiler.toolchain import compile_cuda, find_nvcc

NVCC = find_nvcc()


def _nvcc(source: str, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """nvcc run on `source` (written beside `out`) with `flags`, its output in `out`."""
    assert NVCC is not None
    src = out.with_suffix(".cu")
    src.write_text(source)
    cmd = [NVCC, *flags, "-o", str(out), str(src)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


def shared_gemm(n: int = 64, tile: int = 16) -> tuple[PrimFunc, list[te.Tensor]]:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = create_schedule(c)
    a_s = s.cache_read(a, "shared", [c])
    b_s = s.cache_read(b, "shared", [c])
    io, jo, ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], tile, tile)
    ko, _ = s[c].split(k, tile)
    s[c].reorder(io, jo, ii, ji, ko)
    for ax, tag in (
        (io, "blockIdx.y"),
        (jo, "blockIdx.x"),
        (ii, "threadIdx.y"),
        (ji, "threadIdx.x"),
    ):
        s[c].bind(ax, tag)
    for t in (a_s, b_s):
        s[t].compute_at(s[c], ko)
        s[t].bind(s[t].op.axis[0], "threadIdx.y")
        s[t].bind(s[t].op.axis[1], "threadIdx.x")
    return lower(s, [a, b, c], "gemm"), [a, b, c]


def test_shared_memory_gemm_is_correct_in_the_interpreter() -> None:
    # the interpreter runs each thread's copy of the shared tile in turn: keep the sizes small
    func, _ = shared_gemm(16, 8)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16), dtype=np.float32)
    b = rng.standard_normal((16, 16), dtype=np.float32)
    c = np.full((16, 16), np.nan, np.float32)
    interpreter.run(func, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    # the shared tiles hold the whole block's 8x8 region, not one thread's row
    assert "A.shared = allocate(float32[8, 8], shared)" in str(func)


def test_render_binds_threads_shares_memory_and_synchronises() -> None:
    func, _ = shared_gemm()
    kernel = render_cuda(func, "gemm")
    assert (kernel.grid, kernel.block) == ((4, 4, 1), (16, 16, 1))
    src = kernel.source
    assert 'extern "C" __global__ void gemm(float *__restrict__ A' in src
    assert "__shared__ __align__(16) float A_shared[256];" in src
    assert "(int32_t)threadIdx.x" in src and "(int32_t)blockIdx.y" in src
    assert src.count("__syncthreads();") == 3  # after each copy, and before the next tile


def test_parallel_loops_are_refused() -> None:
    x = te.placeholder((8,), name="X")
    y = te.compute((8,), lambda i: x[i] * 2.0, name="Y")
    s = create_schedule(y)
    s[y].parallel(y.op.axis[0])
    with pytest.raises(CodegenError, match="loop i is parallel"):
        render_cuda(lower(s, [x, y], "f"), "f")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_nvcc_compiles_the_kernel_to_ptx(tmp_path: Path) -> None:
    func, _ = shared_gemm()
    out = tmp_path / "gemm.ptx"
    proc = _nvcc(render_cuda(func, "gemm").source, out, "-ptx", "-arch=sm_90")
    assert proc.returncode == 0, proc.stderr
    ptx = out.read_text()
    assert ".visible .entry gemm(" in ptx and "bar.sync" in ptx and ".shared" in ptx


def _matches_numpy_in_the_interpreter(func: PrimFunc, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.full((m, n), np.nan, np.float32)
    interpreter.run(func, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_register_tiled_gemm_shares_block_tiles_and_is_correct_in_the_interpreter() -> None:
    # 4x4 threads a block, each with a 4x4 register tile; two blocks each way
    cfg = GemmConfig(block_m=16, block_n=16, reg_m=4, reg_n=4, k_tile=4)
    func = cuda_gemm(32, 32, 8, cfg)
    text = str(func)
    assert "C.local = allocate(float32[4, 4], local)" in text
    # the shared tiles serve the whole block (16 rows of A, 16 columns of B), though they are
    # computed inside the register tile's stage, which is inside the thread loops
    assert "A.shared = allocate(float32[16, 4], shared)" in text
    assert "B.shared = allocate(float32[4, 16], shared)" in text
    _matches_numpy_in_the_interpreter(func, 32, 32, 8)
    kernel = render_cuda(func, "gemm")
    assert (kernel.grid, kernel.block) == ((2, 2, 1), (4, 4, 1))
    assert "float C_local[16];" in kernel.source


@pytest.mark.parametrize("a_layout", ["mk", "km"])
def test_double_buffered_gemm_doubles_both_tiles_and_is_correct_in_the_interpreter(
    a_layout: str,
) -> None:
    # A's and B's shared tiles are two nested allocations filled in turn: both get two halves,
    # the next k tile is fetched while this one is read, one barrier a k tile
    cfg = GemmConfig(16, 16, 4, 4, 4, a_layout=a_layout, double_buffer=True)
    func = cuda_gemm(32, 32, 16, cfg)
    text = str(func)
    a_tile = "A.shared" if a_layout == "mk" else "A_T"
    a_tile += " = allocate(float32[128], shared)"
    assert a_tile in text and "B.shared = allocate(float32[128], shared)" in text
    assert "if (k_o + 1) < 4:" in text
    _matches_numpy_in_the_interpreter(func, 32, 32, 16)
    source = render_cuda(func, "gemm").source
    assert source.count("__syncthreads()") == 1  # in the k loop; single-buffered it has three
    if a_layout == "km":  # A's tile is [k][m]: a thread's 4 rows of one k are contiguous
        assert "float A_T[128];" in source and "A_T[(((k_i * 16) + (i_i_o * 4))" in source


def test_cuda_gemm_config_errors_name_the_size() -> None:
    with pytest.raises(ScheduleError, match="M=30 is not a multiple of 64"):
        cuda_gemm(30, 64, 64)
    with pytest.raises(ScheduleError, match="block_n=64 is not a multiple of 3"):
        cuda_gemm(64, 64, 64, GemmConfig(reg_n=3))
    with pytest.raises(ScheduleError, match="a_layout is mk or km, got 'nk'"):
        cuda_gemm(64, 64, 64, GemmConfig(a_layout="nk"))
    with pytest.raises(ScheduleError, match="2048 threads a block"):
        cuda_gemm(256, 256, 64, GemmConfig(block_m=256, block_n=128, reg_m=4, reg_n=4))


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_nvcc_builds_every_benchmark_config_without_spilling(tmp_path: Path) -> None:
    for cfg in GEMM_CONFIGS:
        kernel = render_cuda(cuda_gemm(256, 256, 256, cfg), "gemm")
        cubin = compile_cuda(kernel.source, "sm_90")
        assert cubin[:4] == b"\x7fELF"
        args = ("-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v")
        proc = _nvcc(kernel.source, tmp_path / "k.cubin", *args)
        assert proc.returncode == 0, proc.stderr
        assert "0 bytes spill stores" in proc.stderr, (cfg, proc.stderr)


def test_compile_cuda_rejects_a_malformed_architecture() -> None:
    with pytest.raises(BuildError, match="malformed CUDA architecture"):
        compile_cuda("", "sm90; rm -rf /")

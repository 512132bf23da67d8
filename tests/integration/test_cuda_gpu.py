"""Generated CUDA kernels run on a real GPU through the driver API and match numpy.

Skipped where there is no GPU or no nvcc (CI has neither GPU): these run on a lent GPU machine,
`python3 -m pytest tests/integration/test_cuda_gpu.py`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from compiler.codegen.cuda import render_cuda
from compiler.ops.cuda_gemm import GEMM_CONFIGS, GemmConfig, cuda_gemm
from compiler.toolchain import compile_cuda, find_nvcc
from device_agent.cuda_driver import CudaError, Gpu


@pytest.fixture(scope="module")
def gpu() -> Iterator[Gpu]:
    if find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    try:
        dev = Gpu.open()
    except CudaError as e:
        pytest.skip(f"no GPU: {e}")
    yield dev
    dev.close()


def _arch(gpu: Gpu) -> str:
    major, minor = gpu.compute_capability()
    return f"sm_{major}{minor}"


def _run_gemm(gpu: Gpu, m: int, n: int, k: int, cfg: GemmConfig, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    kernel = render_cuda(cuda_gemm(m, n, k, cfg), "gemm")
    fn = gpu.load_function(compile_cuda(kernel.source, _arch(gpu)), "gemm")
    bufs = [gpu.upload(a), gpu.upload(b), gpu.upload(np.full((m, n), np.nan, np.float32))]
    gpu.launch(fn, kernel.grid, kernel.block, bufs)
    gpu.synchronize()
    got = gpu.download(bufs[2], (m, n))
    for buf in bufs:
        gpu.free(buf)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize(
    "cfg", GEMM_CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_n}r{c.reg_m}x{c.reg_n}k{c.k_tile}"
)
def test_register_tiled_gemm_matches_numpy_on_the_gpu(gpu: Gpu, cfg: GemmConfig) -> None:
    # not square, several blocks each way and several k tiles
    _run_gemm(gpu, 2 * cfg.block_m, 3 * cfg.block_n, 5 * cfg.k_tile * 4, cfg, seed=cfg.block_m)


def test_a_corrupt_module_is_a_cuda_error_naming_the_call(gpu: Gpu) -> None:
    with pytest.raises(CudaError, match="cuModuleLoadData failed"):
        gpu.load_function(b"\x7fELF not a cubin", "gemm")


def test_a_missing_symbol_is_a_cuda_error_naming_it(gpu: Gpu) -> None:
    kernel = render_cuda(cuda_gemm(64, 64, 64), "gemm")
    with pytest.raises(CudaError, match=r"cuModuleGetFunction\(nope\)"):
        gpu.load_function(compile_cuda(kernel.source, _arch(gpu)), "nope")

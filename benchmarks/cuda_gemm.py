"""The generated CUDA GEMM vs cuBLAS's sgemm, on one NVIDIA GPU, interleaved in one process.

For each size (square, float32, row-major) every config of `compiler.ops.cuda_gemm.GEMM_CONFIGS`
is lowered, rendered by `render_cuda`, built with nvcc for the GPU's architecture and checked
against cuBLAS's result (and numpy's at the smallest size). The fastest config and cuBLAS then
alternate for `--rounds` rounds, each a CUDA-event timing of `--repeat` launches; the table
shows medians. Ratio = cuBLAS's time / ours (> 1: ours is faster).
cuBLAS runs in its default math mode (true FP32, no TF32), as our kernel does.

    python benchmarks/cuda_gemm.py [--sizes 1024,2048,4096] [--rounds 5] [--repeat 20]

Ends with: cuda_gemm: min_ratio=<r> max_gflops=<g> device=<name>
Needs a GPU and nvcc; without them it says so and exits 2.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from compiler.codegen.cuda import render_cuda
from compiler.errors import CompilerError
from compiler.ops.cuda_gemm import GEMM_CONFIGS, GemmConfig, cuda_gemm
from compiler.toolchain import compile_cuda, find_nvcc
from device_agent.backends.cuda_driver import Cublas, CudaError, Gpu

Dims = tuple[int, int, int]


def _kernel(gpu: Gpu, n: int, cfg: GemmConfig, arch: str) -> tuple[int, Dims, Dims]:
    kernel = render_cuda(cuda_gemm(n, n, n, cfg), "gemm")
    fn = gpu.load_function(compile_cuda(kernel.source, arch), "gemm")
    return fn, kernel.grid, kernel.block


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    if find_nvcc() is None:
        print("cuda_gemm: nvcc is not installed; nothing measured", file=sys.stderr)
        return 2
    try:
        gpu = Gpu.open()
    except CudaError as e:
        print(f"cuda_gemm: no GPU here ({e}); nothing measured", file=sys.stderr)
        return 2
    major, minor = gpu.compute_capability()
    arch = f"sm_{major}{minor}"
    blas = Cublas(gpu)
    print(f"device: {gpu.name()} ({arch}); rounds {args.rounds} x {args.repeat} launches each")
    rng = np.random.default_rng(0)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        a_h = rng.standard_normal((n, n), dtype=np.float32)
        b_h = rng.standard_normal((n, n), dtype=np.float32)
        a, b = gpu.upload(a_h), gpu.upload(b_h)
        c_ref, c = gpu.alloc(n * n * 4), gpu.alloc(n * n * 4)
        blas.sgemm(n, n, n, a, b, c_ref)
        want = gpu.download(c_ref, (n, n))
        if n <= 1024:
            np.testing.assert_allclose(want, a_h @ b_h, rtol=1e-3, atol=1e-3 * np.sqrt(n))
        scale = float(np.abs(want).max())
        best: tuple[float, GemmConfig, int, Dims, Dims] | None = None
        for cfg in GEMM_CONFIGS:
            try:
                fn, grid, block = _kernel(gpu, n, cfg, arch)
            except CompilerError as e:
                print(f"  {n}: {cfg} skipped: {str(e).splitlines()[0]}")
                continue
            gpu.launch(fn, grid, block, [a, b, c])
            err = float(np.abs(gpu.download(c, (n, n)) - want).max()) / scale
            if err > 1e-5:
                raise SystemExit(f"cuda_gemm: {cfg} at {n} is wrong: max error {err:.2e} of max")
            ms = gpu.time_ms(functools.partial(gpu.launch, fn, grid, block, [a, b, c]), 5)
            print(f"  {n}: {cfg} {2 * n**3 / ms / 1e6:,.0f} GFLOP/s")
            if best is None or ms < best[0]:
                best = (ms, cfg, fn, grid, block)
        assert best is not None
        _, cfg, fn, grid, block = best
        ours_ms, peer_ms = [], []
        for _ in range(args.rounds):
            ours_ms.append(
                gpu.time_ms(functools.partial(gpu.launch, fn, grid, block, [a, b, c]), args.repeat)
            )
            peer_ms.append(
                gpu.time_ms(functools.partial(blas.sgemm, n, n, n, a, b, c_ref), args.repeat)
            )
        ours, peer = statistics.median(ours_ms), statistics.median(peer_ms)
        rows.append((n, cfg, 2 * n**3 / ours / 1e6, 2 * n**3 / peer / 1e6, peer / ours))
        for buf in (a, b, c, c_ref):
            gpu.free(buf)
    print()
    print(
        f"{'size':>6} {'config (bm,bn,rm,rn,kt,A)':>27} {'ours GFLOP/s':>13} {'cuBLAS':>9} {'ratio':>6}"
    )
    for n, cfg, ours_g, peer_g, ratio in rows:
        tiles = f"{cfg.block_m},{cfg.block_n},{cfg.reg_m},{cfg.reg_n},{cfg.k_tile},{cfg.a_layout}"
        print(f"{n:>6} {tiles:>27} {ours_g:>13,.0f} {peer_g:>9,.0f} {ratio:>6.2f}")
    name = gpu.name().replace(" ", "_")
    blas.close()
    gpu.close()
    print(
        f"cuda_gemm: min_ratio={min(r[4] for r in rows):.2f} "
        f"max_gflops={max(r[2] for r in rows):.0f} device={name} date={time.strftime('%Y-%m-%d')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A register-tiled CUDA GEMM schedule: C[m, n] = sum_k A[m, k] * B[k, n], row-major float32.

The classic shape (TVM's GPU matmul tutorial, CUTLASS's SIMT kernels): a block computes a
`block_m` x `block_n` tile of C with (block_m / reg_m) x (block_n / reg_n) threads; each thread
accumulates a `reg_m` x `reg_n` register tile (a "local" cache_write attached at the thread
loop); per `k_tile` step the block copies its A rows and B columns into shared memory, every
thread fetching its share of the elements (the copy's axes fused, then split over the threads).
It is a schedule of the tensor-expression compute, not hand-written CUDA: `render_cuda` turns the
lowered function into the kernel.

The sizes must be multiples of the tiles (the kernel has no tail guards); `check_gemm_config`
says which one is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler import te
from compiler.errors import ScheduleError
from compiler.ir import PrimFunc
from compiler.lower import lower
from compiler.schedule import create_schedule


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes of the CUDA GEMM schedule."""

    block_m: int = 64
    block_n: int = 64
    reg_m: int = 4
    reg_n: int = 4
    k_tile: int = 8

    @property
    def threads(self) -> tuple[int, int]:
        """Threads of one block along n (threadIdx.x) and m (threadIdx.y)."""
        return self.block_n // self.reg_n, self.block_m // self.reg_m


# The configs the benchmark searches: 64 to 256 threads, 16 to 64 accumulators a thread.
GEMM_CONFIGS = (
    GemmConfig(64, 64, 4, 4, 8),
    GemmConfig(64, 64, 4, 4, 16),
    GemmConfig(128, 64, 8, 4, 8),
    GemmConfig(64, 128, 4, 8, 8),
    GemmConfig(128, 128, 8, 8, 8),
    GemmConfig(128, 128, 8, 8, 16),
)


def check_gemm_config(m: int, n: int, k: int, cfg: GemmConfig) -> None:
    """Raise ScheduleError naming the first size that the config's tiles do not divide."""
    for what, size, tile in (
        ("M", m, cfg.block_m),
        ("N", n, cfg.block_n),
        ("K", k, cfg.k_tile),
        ("block_m", cfg.block_m, cfg.reg_m),
        ("block_n", cfg.block_n, cfg.reg_n),
    ):
        if tile <= 0 or size % tile:
            raise ScheduleError(f"cuda gemm: {what}={size} is not a multiple of {tile}")
    tx, ty = cfg.threads
    if tx * ty > 1024:
        raise ScheduleError(f"cuda gemm: {tx * ty} threads a block, more than CUDA's 1024")


def cuda_gemm(m: int, n: int, k: int, cfg: GemmConfig = GemmConfig()) -> PrimFunc:
    """The lowered GEMM `gemm(A, B, C)` for `cfg`, ready for `render_cuda`."""
    check_gemm_config(m, n, k, cfg)
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    s = create_schedule(c)
    a_s = s.cache_read(a, "shared", [c])
    b_s = s.cache_read(b, "shared", [c])
    c_l = s.cache_write(c, "local")

    i, j = c.op.axis
    bi, ii = s[c].split(i, cfg.block_m)
    bj, jj = s[c].split(j, cfg.block_n)
    ty, ri = s[c].split(ii, cfg.reg_m)
    tx, rj = s[c].split(jj, cfg.reg_n)
    s[c].reorder(bi, bj, ty, tx, ri, rj)
    for ax, tag in (
        (bi, "blockIdx.y"),
        (bj, "blockIdx.x"),
        (ty, "threadIdx.y"),
        (tx, "threadIdx.x"),
    ):
        s[c].bind(ax, tag)

    s[c_l].compute_at(s[c], tx)
    li, lj = s[c_l].op.axis
    ko, ki = s[c_l].split(s[c_l].op.reduce_axis[0], cfg.k_tile)
    s[c_l].reorder(ko, ki, li, lj)
    s[c_l].unroll(li)
    s[c_l].unroll(lj)

    nx, ny = cfg.threads
    for t in (a_s, b_s):
        s[t].compute_at(s[c_l], ko)
        fused = s[t].fuse(*s[t].op.axis)
        _, inner = s[t].split(fused, nx * ny)
        y, x = s[t].split(inner, nparts=ny)
        s[t].bind(y, "threadIdx.y")
        s[t].bind(x, "threadIdx.x")
    return lower(s, [a, b, c], "gemm")

"""A register-tiled CUDA GEMM schedule: C[m, n] = sum_k A[m, k] * B[k, n], row-major float32.

The classic shape (TVM's GPU matmul tutorial, CUTLASS's SIMT kernels): a block computes a
`block_m` x `block_n` tile of C with (block_m / reg_m) x (block_n / reg_n) threads; each thread
accumulates a `reg_m` x `reg_n` register tile (a "local" cache_write attached at the thread
loop); per `k_tile` step the block copies its A rows and B columns into shared memory, every
thread fetching its share of the elements (the copy's axes fused, then split over the threads).
It is a schedule of the tensor-expression compute, not hand-written CUDA: `render_cuda` turns the
lowered function into the kernel.

The sizes must be multiples of the tiles (the kernel has no tail guards); `check_gemm_config`
says which one is not. The op library's tunable GPU templates (`cuda_dense`, `cuda_batch_matmul`
and the convolutions, with virtual threads, padded tiles, 128-bit copies and epilogues) are in
`compiler/ops/cuda/gemm.py`; this fixed schedule stays for the benchmark and its figures.
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
    # A's shared tile: "mk" keeps A's [m][k] layout; "km" stores it transposed, [k][m], so a
    # thread's reg_m values of one k are contiguous (vector loads, as B's reg_n already are).
    # Consecutive threads fill it along k: A's global reads stay coalesced, its shared stores
    # conflict (filling along m instead was slower: uncoalesced reads, measured on an H100).
    a_layout: str = "mk"
    # Two halves of each shared tile: the next k tile is fetched into one while the other is
    # read, and one barrier a k tile separates them (the `double_buffer` pass).
    double_buffer: bool = False

    @property
    def threads(self) -> tuple[int, int]:
        """Threads of one block along n (threadIdx.x) and m (threadIdx.y)."""
        return self.block_n // self.reg_n, self.block_m // self.reg_m


# The configs the benchmark searches: 64 to 256 threads, 16 to 64 accumulators a thread. On an
# H100 (2026-11-26) the transposed A tile made the 8x8-per-thread configs 16-22% faster (25.2 ->
# 30.3 TFLOP/s at 2048), and double buffering moved 64x64 by 0-2% (and the 8x8 "km" ones by -5%).
GEMM_CONFIGS = (
    GemmConfig(64, 64, 4, 4, 8),
    GemmConfig(64, 64, 4, 4, 16),
    GemmConfig(128, 64, 8, 4, 8),
    GemmConfig(64, 128, 4, 8, 8),
    GemmConfig(128, 128, 8, 8, 8),
    GemmConfig(128, 128, 8, 8, 16),
    GemmConfig(128, 128, 8, 8, 8, a_layout="km"),
    GemmConfig(128, 128, 8, 8, 16, a_layout="km"),
    GemmConfig(64, 64, 4, 4, 16, double_buffer=True),
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
    if cfg.a_layout not in ("mk", "km"):
        raise ScheduleError(f"cuda gemm: a_layout is mk or km, got {cfg.a_layout!r}")
    tx, ty = cfg.threads
    if tx * ty > 1024:
        raise ScheduleError(f"cuda gemm: {tx * ty} threads a block, more than CUDA's 1024")


def cuda_gemm(m: int, n: int, k: int, cfg: GemmConfig = GemmConfig()) -> PrimFunc:
    """The lowered GEMM `gemm(A, B, C)` for `cfg`, ready for `render_cuda`."""
    check_gemm_config(m, n, k, cfg)
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    if cfg.a_layout == "mk":
        c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
        s = create_schedule(c)
        a_s = s.cache_read(a, "shared", [c])
    else:
        # A transposed into shared memory: a stage of its own, [k][m], read by the product.
        a_t = te.compute((k, m), lambda kk, i: a[i, kk], name="A_T")
        c = te.compute((m, n), lambda i, j: te.sum(a_t[r, i] * b[r, j], axis=r), name="C")
        s = create_schedule(c)
        s[a_t].set_scope("shared")
        a_s = a_t
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
        axes = s[t].op.axis
        if t is a_s and cfg.a_layout == "km":
            s[t].reorder(axes[1], axes[0])  # consecutive threads along k: A's rows
            axes = (axes[1], axes[0])
        if cfg.double_buffer:
            s[t].double_buffer()
        fused = s[t].fuse(*axes)
        _, inner = s[t].split(fused, nx * ny)
        y, x = s[t].split(inner, nparts=ny)
        s[t].bind(y, "threadIdx.y")
        s[t].bind(x, "threadIdx.x")
    return lower(s, [a, b, c], "gemm")

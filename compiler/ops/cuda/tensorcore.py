"""Tensor cores through tensorize: the warp-level MMA (fp16 in, fp32 accumulate) as tensor
intrinsics, and the fp16 GEMM template `cuda_dense_fp16_tc` scheduled onto them.

TVM's design (its `intrin_wmma_*` declarations and tensor-core dense schedule), rebuilt small.
A warp's operands live in *fragments*, buffers in the opaque scopes "wmma.matrix_a",
"wmma.matrix_b" and "wmma.accumulator" (`compiler.ir.buffer.WMMA_SCOPES`): only intrinsics
touch them. Four intrinsics, each a te.compute on 16x16 tiles (its semantics: what tensorize
matches, and what the interpreter runs through the numpy emulation) and a CUDA helper that
calls `nvcuda::wmma::`:

| intrinsic | compute | CUDA |
|---|---|---|
| `wmma_load_a` | frag_a[i, k] = a[i, k] (fp16, rows of a shared tile) | load_matrix_sync, row_major |
| `wmma_load_b` | frag_b[j, k] = b[j, k] (fp16, W's [n][k] rows) | load_matrix_sync, col_major |
| `wmma_mma` | acc[i, j] += sum_k f32(a[i, k]) * f32(b[j, k]); reset: acc = 0 | mma_sync; fill_fragment |
| `wmma_store` | c[i, j] = acc[i, j] (fp32, to global or shared) | store_matrix_sync, mem_row_major |

Only the m16n16k16 shape is supported (fp16 operands, fp32 accumulator). A memory operand's
rows must be contiguous (last stride 1); its row stride is WMMA's leading dimension, which must
be a multiple of 8 halves (4 floats) and its tile 32-byte aligned: the template's tiles are.

The fragment convention the CUDA renderer relies on (`compiler.codegen.cuda`): a helper
taking a fragment takes it by reference, a memory operand as (pointer, one int32 stride per
dimension); a helper whose *output* is a fragment defines `<helper>_frag` as that fragment's
type, and the renderer declares each fragment buffer as an array of the type its first writer
names (one fragment per 16x16 tile, row-major over the buffer's tiles). Helpers spell the
fragment types they take in full, so a mismatch between writer and reader is an nvcc error.

The template computes Y[M][N] = X[M][K] @ W[N][K]^T (a dense layer's layout, cuBLAS's "TN"
GEMM) from fp16 X and W into fp32 Y; M, N and K must be multiples of 16 (the workload is
refused otherwise, with a ValueError: there are no tail tiles). A block computes a `tile_m` x
`tile_n` tile with warps_m x warps_n warps (threadIdx.z, threadIdx.y; threadIdx.x is the 32
lanes); each warp owns frags_m x frags_n accumulator fragments. Per `k_tile` step the block
stages X's and W's rows in shared memory (rows padded by `pad` halves so that the 8 rows one
fragment load reads fall in different banks), then per 16-wide k step each warp loads its A
and B fragments and runs frags_m x frags_n MMAs. `copy` says how a thread moves its share:
"async" 16 bytes at a time with `cp.async` (sm_80+; the renderer waits for the copies before
each barrier), "vector" 16 bytes through registers, "scalar" one half at a time.
`double_buffer` gives the shared tiles two halves (one barrier a k step; with "async" the next
tile's copies then run under this tile's MMAs). The accumulators are stored straight to global
memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler import te
from compiler.errors import ScheduleError
from compiler.ir.function import PrimFunc
from compiler.lower import lower
from compiler.ops.base import OpTemplate
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.schedule.intrin import TensorIntrin
from compiler.schedule.schedule import Schedule, Stage, create_schedule
from compiler.te.tensor import IterVar, Tensor

WMMA_M = WMMA_N = WMMA_K = 16  # the one fragment shape supported
WARP_SIZE = 32
# Warps and fragments per warp along one output axis ("warps x fragments"): a block tile of at
# most 8 fragments (128 rows) a side keeps both shared tiles, double-buffered with k_tile 32 and
# padding, within the 48 KiB of static shared memory (2 x 2 x 128 x 40 halves = 40 KiB), and a
# warp's accumulators at 16 fragments at most (128 registers a lane).
TILINGS = ("1x1", "1x2", "2x1", "2x2", "1x4", "4x1", "2x4", "4x2")
K_TILES = (16, 32)
PAD_HALVES = (8, 0)  # 8 halves = 16 bytes: rows 80 bytes apart start in different banks
COPIES = ("async", "vector", "scalar")
_INCLUDE = "#include <mma.h>\n"
_NS = "nvcuda::wmma"


def _frag(use: str, dtype: str, layout: str | None = None) -> str:
    shape = f"{WMMA_M}, {WMMA_N}, {WMMA_K}"
    tail = f", {_NS}::{layout}" if layout else ""
    return f"{_NS}::fragment<{_NS}::{use}, {shape}, {dtype}{tail}>"


_FRAG_A = _frag("matrix_a", "__half", "row_major")
_FRAG_B = _frag("matrix_b", "__half", "col_major")
_FRAG_ACC = _frag("accumulator", "float")


def _copy(out: np.ndarray, src: np.ndarray) -> None:
    out[...] = src


def _mma(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    # fp16 products are exact in fp32 (11-bit significands); the sum is fp32, as on the device
    acc += np.matmul(a.astype(np.float32), b.astype(np.float32).T)


def _fill_zero(acc: np.ndarray) -> None:
    acc[...] = 0


def _copy_intrin(name: str, shape: tuple[int, ...], dtype: str, source: str) -> TensorIntrin:
    src = te.placeholder(shape, dtype, name="src")
    out = te.compute(shape, lambda *i: src[i], name="dst")
    return TensorIntrin(name, out, (src,), source, name, None, _copy, None)


def wmma_load_a() -> TensorIntrin:
    """frag_a[16, 16] = a 16x16 fp16 tile of rows (m) of k, loaded as a row-major matrix_a."""
    name = "kiln_wmma_load_a_16x16x16"
    source = f"""{_INCLUDE}typedef {_FRAG_A} {name}_frag;
__device__ __forceinline__ void {name}({name}_frag &a, const __half *p, int32_t s0, int32_t s1) {{
  {_NS}::load_matrix_sync(a, p, s0);
}}
"""
    return _copy_intrin(name, (WMMA_M, WMMA_K), "float16", source)


def wmma_load_b() -> TensorIntrin:
    """frag_b[16, 16] = a 16x16 fp16 tile of W's rows (n) of k: B = W^T, a col-major matrix_b."""
    name = "kiln_wmma_load_b_16x16x16"
    source = f"""{_INCLUDE}typedef {_FRAG_B} {name}_frag;
__device__ __forceinline__ void {name}({name}_frag &b, const __half *p, int32_t s0, int32_t s1) {{
  {_NS}::load_matrix_sync(b, p, s0);
}}
"""
    return _copy_intrin(name, (WMMA_N, WMMA_K), "float16", source)


def wmma_store() -> TensorIntrin:
    """c[16, 16] = acc: a float32 tile stored row-major (to global or shared memory)."""
    name = "kiln_wmma_store_16x16x16"
    source = f"""{_INCLUDE}__device__ __forceinline__ void {name}(float *p, int32_t s0, int32_t s1,
                                               const {_FRAG_ACC} &c) {{
  {_NS}::store_matrix_sync(p, c, s0, {_NS}::mem_row_major);
}}
"""
    return _copy_intrin(name, (WMMA_M, WMMA_N), "float32", source)


def wmma_mma() -> TensorIntrin:
    """acc[i, j] += sum_k f32(a[i, k]) * f32(b[j, k]) on 16x16x16 tiles; reset: acc = 0."""
    a = te.placeholder((WMMA_M, WMMA_K), "float16", name="a")
    b = te.placeholder((WMMA_N, WMMA_K), "float16", name="b")
    r = te.reduce_axis((0, WMMA_K), name="rk")
    out = te.compute(
        (WMMA_M, WMMA_N),
        lambda i, j: te.sum(te.cast("float32", a[i, r]) * te.cast("float32", b[j, r]), axis=r),
        name="acc",
    )
    name = "kiln_wmma_mma_16x16x16"
    fill = "kiln_wmma_fill_16x16x16"
    source = f"""{_INCLUDE}typedef {_FRAG_ACC} {fill}_frag;
__device__ __forceinline__ void {fill}({fill}_frag &c) {{
  {_NS}::fill_fragment(c, 0.0f);
}}
typedef {_FRAG_ACC} {name}_frag;
__device__ __forceinline__ void {name}({name}_frag &c, const {_FRAG_A} &a,
                                        const {_FRAG_B} &b) {{
  {_NS}::mma_sync(c, a, b, c);
}}
"""
    return TensorIntrin(name, out, (a, b), source, name, fill, _mma, _fill_zero)


def copy_vector_intrin() -> TensorIntrin:
    """dst[8] = src[8]: eight fp16 elements (16 bytes) as one uint4, both ends 16-byte aligned."""
    name = "kiln_copy_half8"
    source = f"""__device__ __forceinline__ void {name}(__half *d, int32_t ds, const __half *s,
                                                int32_t ss) {{
  *reinterpret_cast<uint4 *>(d) = *reinterpret_cast<const uint4 *>(s);
}}
"""
    return _copy_intrin(name, (8,), "float16", source)


def copy_async_intrin() -> TensorIntrin:
    """dst[8] = src[8] as one 16-byte `cp.async` (global to shared, sm_80+), both ends 16-byte
    aligned. The copy lands later: the CUDA renderer makes every barrier of a kernel that calls a
    `kiln_cp_async` helper commit and wait for the outstanding copies first."""
    name = "kiln_cp_async_half8"
    source = f"""#include <cuda_pipeline.h>
__device__ __forceinline__ void {name}(__half *d, int32_t ds, const __half *s, int32_t ss) {{
  __pipeline_memcpy_async(d, s, 16);
}}
"""
    return _copy_intrin(name, (8,), "float16", source)


# -- the template ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorCoreConfig:
    """One point of the template's space (see the module docstring for each knob)."""

    warps_m: int = 2
    frags_m: int = 2
    warps_n: int = 2
    frags_n: int = 2
    k_tile: int = 32
    pad: int = 8
    copy: str = "async"
    double_buffer: bool = False

    @property
    def block_m(self) -> int:
        return self.warps_m * self.frags_m * WMMA_M

    @property
    def block_n(self) -> int:
        return self.warps_n * self.frags_n * WMMA_N

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * WARP_SIZE

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TensorCoreConfig:
        wm, fm = _tiling(config["tile_m"])
        wn, fn = _tiling(config["tile_n"])
        return cls(
            wm,
            fm,
            wn,
            fn,
            int(config["k_tile"]),
            int(config["pad"]),
            str(config["copy"]),
            bool(config["double_buffer"]),
        )

    def check(self, m: int, n: int, k: int) -> None:
        """Raise ScheduleError naming the first size the tiles do not divide, or a bad knob."""
        for what, size, tile in (
            ("M", m, self.block_m),
            ("N", n, self.block_n),
            ("K", k, self.k_tile),
            ("k_tile", self.k_tile, WMMA_K),
        ):
            if size % tile:
                raise ScheduleError(
                    f"cuda_dense_fp16_tc: {what}={size} is not a multiple of {tile}"
                )
        if self.copy not in COPIES:
            raise ScheduleError(f"cuda_dense_fp16_tc: copy is one of {COPIES}, got {self.copy!r}")
        if self.pad % 8:  # WMMA's leading dimension: a multiple of 8 halves (16 bytes)
            raise ScheduleError(f"cuda_dense_fp16_tc: pad={self.pad} is not a multiple of 8")
        if self.threads > 1024:
            raise ScheduleError(f"cuda_dense_fp16_tc: {self.threads} threads, more than 1024")


# What a benchmark tries on a big GEMM: 4 to 8 warps, warp tiles of 32x32 to 64x64 (each config
# valid for any M, N multiple of 128 and K multiple of 32).
BENCHMARK_CONFIGS = (
    TensorCoreConfig(2, 4, 4, 2, 32, 8, "async", True),  # 128x128 block, 8 warps of 64x32
    TensorCoreConfig(2, 4, 2, 4, 32, 8, "async", True),  # 128x128 block, 4 warps of 64x64
    TensorCoreConfig(4, 2, 2, 4, 32, 8, "async", True),  # 128x128 block, 8 warps of 32x64
    TensorCoreConfig(2, 2, 2, 2, 32, 8, "async", True),  # 64x64 block, 4 warps of 32x32
    TensorCoreConfig(2, 4, 4, 2, 32, 8, "vector", True),
    TensorCoreConfig(2, 4, 4, 2, 32, 8, "async", False),
)


def tensorcore_dense(
    m: int, n: int, k: int, cfg: TensorCoreConfig = TensorCoreConfig()
) -> PrimFunc:
    """The lowered `dense_fp16_tc(X, W, Y)` for `cfg`, ready for `render_cuda`."""
    x, w, y = TensorCoreDenseTemplate().compute((m, n, k))
    return lower(tensorcore_schedule(x, w, y, cfg), [x, w, y], "dense_fp16_tc")


def _tiling(text: str) -> tuple[int, int]:
    warps, frags = text.split("x")
    return int(warps), int(frags)


class TensorCoreDenseTemplate(OpTemplate):
    """`cuda_dense_fp16_tc`, workload (M, N, K): Y = X @ W^T, fp16 X[M][K] and W[N][K], fp32 Y.

    The layout never depends on the config; inputs are float16 (`random_inputs`, `pack_inputs`).
    """

    name = "cuda_dense_fp16_tc"
    fields = ("M", "N", "K")

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        return list(self.compute(shape))

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        x, w, y = args
        return tensorcore_schedule(x, w, y, TensorCoreConfig.from_config(config))

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        m, n, k = _workload(shape)
        return [(m, k), (n, k)]

    def random_inputs(self, shape: tuple[int, ...], rng: np.random.Generator) -> list[np.ndarray]:
        """Logical inputs: float16 in [-1, 1)."""
        return [x.astype(np.float16) for x in super().random_inputs(shape, rng)]

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        return [np.ascontiguousarray(x, dtype=np.float16) for x in inputs]

    def compute(self, shape: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
        m, n, k = _workload(shape)
        x = te.placeholder((m, k), "float16", name="X")
        w = te.placeholder((n, k), "float16", name="W")
        r = te.reduce_axis((0, k), name="k")
        y = te.compute(
            (m, n),
            lambda i, j: te.sum(te.cast("float32", x[i, r]) * te.cast("float32", w[j, r]), axis=r),
            name="Y",
        )
        return x, w, y

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """In float64 (fp16 products are exact; the kernel's fp32 sums differ by rounding)."""
        x, w = inputs
        return (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)

    def flop(self, shape: tuple[int, ...]) -> float:
        m, n, k = _workload(shape)
        return 2.0 * m * n * k

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        """Tilings that divide the workload; every combination is a valid kernel."""
        m, n, k = _workload(shape)
        return ConfigSpace(
            [
                Knob("tile_m", _tilings(m)),
                Knob("tile_n", _tilings(n)),
                Knob("k_tile", tuple(t for t in K_TILES if k % t == 0)),
                Knob("pad", PAD_HALVES),
                Knob("copy", COPIES),
                Knob("double_buffer", (True, False)),
            ]
        )


def _workload(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 3 or any(isinstance(d, bool) or not isinstance(d, int) for d in shape):
        raise ValueError(f"cuda_dense_fp16_tc workload is (M, N, K) of ints, got {shape!r}")
    m, n, k = shape
    for what, size in (("M", m), ("N", n), ("K", k)):
        if size < 1 or size % 16:
            raise ValueError(
                f"cuda_dense_fp16_tc: {what}={size} is not a positive multiple of 16 (tensor-core "
                "fragments are 16x16x16 and the kernel has no tail tiles: pad the operands)"
            )
    return m, n, k


def _tilings(extent: int) -> tuple[str, ...]:
    out = []
    for t in TILINGS:
        warps, frags = _tiling(t)
        if extent % (warps * frags * WMMA_M) == 0:
            out.append(t)
    return tuple(out)


def tensorcore_schedule(x: Tensor, w: Tensor, y: Tensor, cfg: TensorCoreConfig) -> Schedule:
    """The schedule of `y = x @ w^T` (the template's compute) onto the WMMA intrinsics.

    Raises:
        ScheduleError: a tile does not divide the workload, or a knob is out of range.
    """
    (m, k), n = x.shape, w.shape[0]
    cfg.check(m, n, k)
    s = create_schedule(y)
    x_s = s.cache_read(x, "shared", [y])
    w_s = s.cache_read(w, "shared", [y])
    x_f = s.cache_read(x_s, "wmma.matrix_a", [y])
    w_f = s.cache_read(w_s, "wmma.matrix_b", [y])
    acc = s.cache_write(y, "wmma.accumulator")

    # Y: blocks, warps, then each warp's fragments, stored one 16x16 tile at a time
    out = s[y]
    i, j = out.axis
    bi, i = out.split(i, cfg.block_m)
    bj, j = out.split(j, cfg.block_n)
    wi, i = out.split(i, cfg.frags_m * WMMA_M)
    wj, j = out.split(j, cfg.frags_n * WMMA_N)
    ti, i = out.split(i, WMMA_M)
    tj, j = out.split(j, WMMA_N)
    out.reorder(bi, bj, wi, wj, ti, tj, i, j)
    out.bind(bi, "blockIdx.y")
    out.bind(bj, "blockIdx.x")
    out.bind(wi, "threadIdx.z")
    out.bind(wj, "threadIdx.y")
    out.tensorize(i, wmma_store())

    # the warp's accumulators: k steps of k_tile, 16 at a time, one MMA per fragment pair
    st = s[acc]
    st.compute_at(out, wj)
    ai, aj = st.axis
    (ak,) = st.reduce_axis
    ko, ak = st.split(ak, cfg.k_tile)
    kt, ak = st.split(ak, WMMA_K)
    fi, ai = st.split(ai, WMMA_M)
    fj, aj = st.split(aj, WMMA_N)
    st.reorder(ko, kt, fi, fj, ai, aj, ak)
    st.tensorize(ai, wmma_mma())

    for frag, intrin in ((x_f, wmma_load_a()), (w_f, wmma_load_b())):
        fs = s[frag]
        fs.compute_at(st, kt)
        r, c = fs.axis
        ro, r = fs.split(r, 16)
        co, c = fs.split(c, 16)
        fs.reorder(ro, co, r, c)
        fs.tensorize(r, intrin)

    for shared in (x_s, w_s):
        _stage_copy(s[shared], st, ko, cfg)
    return s


def _stage_copy(cs: Stage, acc: Stage, ko: IterVar, cfg: TensorCoreConfig) -> None:
    """Copy a block's rows of one k tile into shared memory with all the block's threads."""
    cs.compute_at(acc, ko)
    r, c = cs.axis
    if cfg.pad:
        cs.storage_align(r, 16, cfg.pad)  # row stride = pad (mod 16 halves)
    if cfg.double_buffer:
        cs.double_buffer()
    lanes: IterVar | None = None
    if cfg.copy != "scalar":
        c, lanes = cs.split(c, 8)  # 8 halves: 16 bytes
    fused = cs.fuse(r, c)
    _, inner = cs.split(fused, cfg.threads)
    tz, inner = cs.split(inner, nparts=cfg.warps_m)
    ty, tx = cs.split(inner, nparts=cfg.warps_n)
    cs.bind(tz, "threadIdx.z")
    cs.bind(ty, "threadIdx.y")
    cs.bind(tx, "threadIdx.x")
    if lanes is not None:
        cs.tensorize(lanes, copy_async_intrin() if cfg.copy == "async" else copy_vector_intrin())

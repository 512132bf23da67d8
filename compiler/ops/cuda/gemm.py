"""The CUDA GEMM core under `cuda_dense` (Y = X . W^T) and `cuda_batch_matmul` (C[b] = A[b] . B[b]),
whose templates are in `compiler/ops/cuda/dense.py`.

Workloads, float32:
- `cuda_dense` (M, N, K[, epilogue]): X [M][K], W [N][K] (the graph's Dense / Gemm with transB),
  then bias [N] (epilogue >= 1) and the residual [M][N] (epilogue 4), output [M][N].
- `cuda_batch_matmul` (B, M, N, K[, epilogue]): A [B][M][K], B [B][K][N] (ONNX MatMul), bias
  [N], residual [B][M][N], output [B][M][N].
`epilogue` is an `Epilogue`: 0 none, 1 + bias, 2 + bias then ReLU, 3 + bias then ReLU6 (the
CPU conv templates' numbering), 4 + bias + residual then ReLU (a ResNet block's tail); it is
applied to the accumulators on their way to memory.

The schedule (TVM's CUDA dense / the GPU matmul tutorial, CUTLASS's SIMT kernels): a block
computes a BM x BN tile of C on TM x TN threads; each thread keeps VM*RM x VN*RN accumulators
in registers (a "local" cache_write attached at the thread loop); per `k_tile` step the block
copies its A rows and B columns into shared memory, every thread a share of the elements, and
then each thread reads its RM (RN) values of one k from the shared tiles. `render_cuda` renders
the lowered function; nothing here is hand-written CUDA.

Knobs, and why each exists (no GPU was at hand for this template set: no figure below is a
measurement of it; `compiler/ops/cuda_gemm.py` has the H100 figures of its predecessor):
- `tile_m`, `tile_n` ("VxTxR"): TVM's four-way split of an output axis, grid x V x T x R. T
  threads along the axis (threadIdx.y for m, .x for n), R consecutive accumulators a thread,
  and V virtual threads: the thread tile is V runs of R, BM/V apart, so that a warp's shared
  reads of one run are consecutive 16-byte words (conflict-free), which an R = 8 run read as
  two 128-bit words 32 bytes apart per thread is not. TVM gets this from `vthread` binding and
  its InjectVirtualThread pass; here the output is declared in the tile's shape (below), so the
  register tile is one compact local array and no pass is needed. Tiles divide their axis
  (every choice is a factorisation of a divisor of it, so odd sizes have choices down to
  1x1x1); BM, BN <= 128 and T <= 32, so a block has at most 1024 threads.
- `k_tile`: the k extent of one shared-memory step (divides K, <= 16: two 128x16 tiles double
  buffered are 32 KiB, inside the 48 KiB of static shared memory).
- `a_shared` / `b_shared`: the shared tile's layout. "km" ("kn") stores it k-major, so a
  thread's R values of one k are contiguous and aligned (nvcc reads them as `ld.shared.v4`);
  "mk" ("nk") keeps the global layout, so the copy is contiguous on both sides but the reads
  are strided. The copy always walks the global memory's contiguous axis across threads
  (coalesced), whatever the shared layout.
- `shared_pad`: row padding of the shared tiles (`storage_align`, words mod 32, or mod the
  row's power of two when shorter): rows that are a multiple of 32 words put a column's
  elements in one bank, and a transposing copy stores a column; 4 keeps rows 16-byte aligned
  for vector reads, 1 breaks that. The largest tiles, padded and double buffered, take 41 KiB.
- `copy`: how a thread moves its share of a tile. "float4": 4 lanes a step, one 128-bit global
  load where the renderer proves the address 16-byte aligned (K % 4 == 0 for a k-contiguous
  operand); "scalar": one element a step; "async": 16 bytes a step with `cp.async` (sm_80+,
  global to shared without registers: with `double_buffer` the next tile's copies fly under
  this tile's FMAs, the staged loads of CUTLASS's pipelined kernels), for an operand whose tile
  keeps its global layout (mk, or kn for a row-contiguous B) and whose runs are 16-byte aligned
  (`async_copy_ok`); an operand that is not copies as "float4", and a config where neither is
  is the "float4" kernel again, not worth measuring.
- `double_buffer`: two halves of each shared tile, one barrier a step; the next k tile's copy
  is issued into one half before the FMAs read the other. With "float4" and "scalar" copies a
  thread's shared stores wait for its global loads before its FMAs start (there is no staging
  through registers), so only other warps hide that latency; with "async" the copies land in
  the background, and the barrier of the next step waits for them.
  "staged" double-buffers and carries the next tile through registers: a thread issues its
  global loads before this step's FMAs and stores them into the other half after them
  (`compiler/lower/double_buffer.py`; CUTLASS's SIMT mainloop), so its own FMAs hide the
  load latency; a `cp.async` copy is not staged (it needs no registers).
- `min_blocks`: 2 asks ptxas for two resident blocks a multiprocessor (`__launch_bounds__(T,
  2)`: at most 65536 / (2 T) registers a thread), trading registers (a staged tile's, the
  addresses nvcc hoists) for a second block's warps to hide latency; only blocks of more than
  128 threads are capped by it (else the kernel is the 1 kernel, not worth measuring).
- `unroll_k`: unroll the k loop of a step, so the shared reads of step k+1 issue during the
  FMAs of step k.

The output argument is declared [(B)][M/BM][V][T][R][N/BN][V][T][R] for the config's tiles,
the same bytes as [(B)][M][N] row-major, so thread and register indices address it without a
division; `unpack_output` reshapes (a graph executor passes the [M][N] buffer unchanged). The
residual input of epilogue 4 is declared the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from compiler import te
from compiler.codegen.cuda import MIN_BLOCKS_PRAGMA
from compiler.ir import expr as E
from compiler.ops.base import OpTemplate
from compiler.ops.conv2d import local_accumulators
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import divisors
from compiler.schedule.intrin import TensorIntrin
from compiler.schedule.schedule import Schedule, Stage, create_schedule
from compiler.te.tensor import IterVar, Tensor


class Epilogue(IntEnum):
    """What the output stage applies to the accumulators (a workload field)."""

    NONE = 0
    BIAS = 1
    BIAS_RELU = 2
    BIAS_RELU6 = 3  # min(relu(acc + bias), 6): MobileNet's; the CPU conv templates' 3 too
    BIAS_ADD_RELU = 4  # relu(acc + bias + residual): a ResNet block's tail

    @property
    def relu(self) -> bool:
        return self not in (Epilogue.NONE, Epilogue.BIAS)


RELU6_CAP = 6.0


def apply_epilogue(
    acc: E.Expr, bias: E.Expr | None, residual: E.Expr | None, epilogue: Epilogue
) -> E.Expr:
    """The output element for accumulator `acc` (bias and residual: that element's)."""
    if epilogue is Epilogue.NONE:
        return acc
    assert bias is not None
    value = acc + bias
    if epilogue is Epilogue.BIAS_ADD_RELU:
        assert residual is not None
        value = value + residual
    if epilogue.relu:
        value = E.Max(value, E.FloatImm(0.0))
    if epilogue is Epilogue.BIAS_RELU6:
        value = E.Min(value, E.FloatImm(RELU6_CAP))
    return value


MAX_TILE = 128  # BM, BN: two 128 x 16 tiles double buffered fill 32 KiB of shared memory
MAX_THREADS_AXIS = 32  # threads along m or n: a block has at most 32 x 32 = 1024
MAX_REG = 8
MAX_K_TILE = 16
VTHREADS = (1, 2)
MAX_ACCUMULATORS = 64  # a thread's registers: 255, of which the tile and its operands take most
SHARED_PADS = (0, 4, 1)
BANK_WORDS = 32


@dataclass(frozen=True)
class AxisTile:
    """One output axis split grid x vthread x threads x reg (a `tile_m` / `tile_n` value)."""

    vthread: int
    threads: int
    reg: int

    @property
    def block(self) -> int:
        """Elements of the axis one block covers."""
        return self.vthread * self.threads * self.reg

    @classmethod
    def parse(cls, text: str) -> AxisTile:
        v, t, r = (int(p) for p in text.split("x"))
        return cls(v, t, r)

    def __str__(self) -> str:
        return f"{self.vthread}x{self.threads}x{self.reg}"


def axis_tile_choices(extent: int) -> tuple[str, ...]:
    """Every "VxTxR" whose block divides `extent` (within the caps), the untuned default first:
    a block nearest 64, then 16 threads, then 4 registers, one virtual thread."""
    tiles = [
        AxisTile(v, t, r)
        for v in VTHREADS
        for t in range(1, MAX_THREADS_AXIS + 1)
        for r in range(1, MAX_REG + 1)
        if v * t * r <= MAX_TILE and extent % (v * t * r) == 0
    ]

    def preference(a: AxisTile) -> tuple[float, ...]:
        return (
            abs(math.log2(a.block / 64)),
            a.vthread,
            abs(math.log2(a.threads / 16)),
            abs(math.log2(a.reg / 4)),
        )

    return tuple(str(a) for a in sorted(tiles, key=preference))


def k_tile_choices(k: int) -> tuple[int, ...]:
    """Divisors of K up to MAX_K_TILE, nearest 8 first."""
    return tuple(sorted(divisors(k, MAX_K_TILE), key=lambda d: (abs(math.log2(d / 8)), -d)))


def gemm_knobs(m: int, n: int, k: int, vector_ok: bool) -> list[Knob]:
    """The GEMM schedule's knobs for an M x N x K product (see the module doc)."""
    return [
        Knob("tile_m", axis_tile_choices(m)),
        Knob("tile_n", axis_tile_choices(n)),
        Knob("k_tile", k_tile_choices(k)),
        Knob("a_shared", ("km", "mk")),
        Knob("b_shared", ("kn", "nk")),
        Knob("shared_pad", SHARED_PADS),
        Knob("copy", ("float4", "scalar", "async") if vector_ok else ("scalar", "float4", "async")),
        Knob("double_buffer", (False, True, "staged")),
        Knob("unroll_k", (True, False)),
        Knob("min_blocks", (1, 2)),
    ]


def most_threads(choices: Sequence[str]) -> int:
    """The most threads any of the "VxTxR" `choices` puts on its axis."""
    return max(AxisTile.parse(c).threads for c in choices)


def gemm_worth_measuring(m: int, n: int, config: Config) -> bool:
    """Whether the register tile fits a thread's registers and a block has a warp or more
    (or as many threads as the sizes allow)."""
    tm, tn = AxisTile.parse(config["tile_m"]), AxisTile.parse(config["tile_n"])
    accumulators = tm.vthread * tm.reg * tn.vthread * tn.reg
    possible = most_threads(axis_tile_choices(m)) * most_threads(axis_tile_choices(n))
    return accumulators <= MAX_ACCUMULATORS and tm.threads * tn.threads >= min(32, possible)


def async_anywhere(p: GemmProblem, config: Config) -> bool:
    """Whether copy "async" applies to A's or B's tile (else the config is the float4 one)."""
    tm, tn = gemm_tiles(p, config)
    return async_copy_ok(p.a, config["a_shared"] == "km", tm.block, config) or async_copy_ok(
        p.b, config["b_shared"] == "kn", tn.block, config
    )


REGISTER_FILE = 65536  # 32-bit registers a multiprocessor (sm_50 to sm_90)
MAX_THREAD_REGISTERS = 255


def caps_registers(config: Config) -> bool:
    """Whether `min_blocks` blocks of the config's threads leave a thread under 255 registers."""
    threads = AxisTile.parse(config["tile_m"]).threads * AxisTile.parse(config["tile_n"]).threads
    return REGISTER_FILE // (int(config["min_blocks"]) * threads) < MAX_THREAD_REGISTERS


def staged_anywhere(p: GemmProblem, config: Config) -> bool:
    """Whether double_buffer "staged" stages A's or B's tile (a `cp.async` copy is not staged)."""
    if config["copy"] != "async":
        return True
    tm, tn = gemm_tiles(p, config)
    return not (
        async_copy_ok(p.a, config["a_shared"] == "km", tm.block, config)
        and async_copy_ok(p.b, config["b_shared"] == "kn", tn.block, config)
    )


# -- compute ----------------------------------------------------------------------------------

Reader = Callable[[E.Expr | None, E.Expr, E.Expr], E.Expr]  # (batch, row, k) -> element


@dataclass(frozen=True)
class GemmOperand:
    """One side of the product as the kernel reads it from global memory."""

    read: Reader
    k_contiguous: bool  # consecutive k are consecutive in memory (else consecutive rows are)
    # a straight read whose contiguous extent is a multiple of 4, so that a run of 4 starting
    # at a multiple of 4 is 16 bytes aligned in memory (False for a gather)
    aligned: bool = False


@dataclass(frozen=True)
class GemmProblem:
    """C[(b)][i][j] = sum_k A(b, i, k) * B(b, j, k), then the epilogue."""

    batch: int | None  # None: no batch axis
    m: int
    n: int
    k: int
    a: GemmOperand
    b: GemmOperand
    epilogue: Epilogue = Epilogue.NONE
    bias_on_rows: bool = False  # bias indexed by i (a convolution's channels) instead of j


def tiled_shape(p: GemmProblem, tm: AxisTile, tn: AxisTile) -> tuple[int, ...]:
    """The output's declared shape: [(B)][M/BM][V][T][R][N/BN][V][T][R]."""
    rows = (p.m // tm.block, tm.vthread, tm.threads, tm.reg)
    cols = (p.n // tn.block, tn.vthread, tn.threads, tn.reg)
    return (*((p.batch,) if p.batch is not None else ()), *rows, *cols)


def _axis_index(parts: Sequence[E.Expr], tile: AxisTile) -> E.Expr:
    g, v, t, r = parts
    return g * tile.block + v * (tile.threads * tile.reg) + t * tile.reg + r


def gemm_compute(
    p: GemmProblem, config: Config | None, epilogue_inputs: Sequence[Tensor] = ()
) -> Tensor:
    """The output tensor for `config` (None: the default tiles): shared-tile stages named
    "A_shared" / "B_shared", the product "C_acc", and, with an epilogue, "C" over it.

    `epilogue_inputs` are the bias [rows or cols] and, for BIAS_ADD_RELU, the residual in the
    output's declared shape.
    """
    tm, tn = gemm_tiles(p, config)
    # a config reduced to its layout knobs (`layout_config`) leaves the shared layouts out
    a_layout = config.get("a_shared", "km") if config is not None else "km"
    b_layout = config.get("b_shared", "kn") if config is not None else "kn"
    batched = p.batch is not None
    lead = (p.batch,) if batched else ()

    def shared(op: GemmOperand, rows: int, k_major: bool, name: str) -> Tensor:
        if k_major:
            shape = (*lead, p.k, rows)

            def body(*ix: E.Var) -> E.Expr:
                return op.read(ix[0] if batched else None, ix[-1], ix[-2])
        else:
            shape = (*lead, rows, p.k)

            def body(*ix: E.Var) -> E.Expr:
                return op.read(ix[0] if batched else None, ix[-2], ix[-1])

        return te.compute(shape, body, name=name)

    a_s = shared(p.a, p.m, a_layout == "km", "A_shared")
    b_s = shared(p.b, p.n, b_layout == "kn", "B_shared")
    r = te.reduce_axis((0, p.k), name="k")

    def at(t: Tensor, k_major: bool, bb: E.Expr | None, row: E.Expr) -> E.Expr:
        ix = (r.var, row) if k_major else (row, r.var)
        return t[(bb, *ix)] if bb is not None else t[ix]

    def product(*ix: E.Var) -> E.Expr:
        bb = ix[0] if batched else None
        rest = ix[1:] if batched else ix
        i, j = _axis_index(rest[:4], tm), _axis_index(rest[4:], tn)
        return te.sum(at(a_s, a_layout == "km", bb, i) * at(b_s, b_layout == "kn", bb, j), axis=r)

    shape = tiled_shape(p, tm, tn)
    acc = te.compute(shape, product, name="C_acc")
    if p.epilogue is Epilogue.NONE:
        return acc
    bias = epilogue_inputs[0]

    def epilogue(*ix: E.Var) -> E.Expr:
        rest = ix[1:] if batched else ix
        channel = _axis_index(rest[:4], tm) if p.bias_on_rows else _axis_index(rest[4:], tn)
        residual = epilogue_inputs[1][ix] if len(epilogue_inputs) > 1 else None
        return apply_epilogue(acc[ix], bias[channel], residual, p.epilogue)

    return te.compute(shape, epilogue, name="C")


def gemm_tiles(p: GemmProblem, config: Config | None) -> tuple[AxisTile, AxisTile]:
    if config is None:
        return AxisTile.parse(axis_tile_choices(p.m)[0]), AxisTile.parse(axis_tile_choices(p.n)[0])
    return AxisTile.parse(config["tile_m"]), AxisTile.parse(config["tile_n"])


# -- schedule ---------------------------------------------------------------------------------


def schedule_gemm(p: GemmProblem, config: Config, out: Tensor) -> Schedule:
    """Blocks over output tiles, threads over the thread grid, a local register tile, shared
    A and B tiles per k step (see the module doc)."""
    tm, tn = gemm_tiles(p, config)
    sch = create_schedule(out)
    acc = local_accumulators(sch, out)
    st = sch[out]
    axes = list(st.axis)
    bb = axes.pop(0) if p.batch is not None else None
    gm, vm, ty, rm, gn, vn, tx, rn = axes
    outer = [bb] if bb is not None else []
    st.reorder(*outer, gm, gn, ty, tx, vm, vn, rm, rn)
    binds = [(gm, "blockIdx.y"), (gn, "blockIdx.x"), (ty, "threadIdx.y"), (tx, "threadIdx.x")]
    if bb is not None:
        binds.append((bb, "blockIdx.z"))
    for ax, tag in binds:
        st.bind(ax, tag)
    for ax in (vm, vn, rm):
        st.unroll(ax)
    if int(config["min_blocks"]) > 1:
        st.pragma(gm, MIN_BLOCKS_PRAGMA, int(config["min_blocks"]))
    # a thread's 4 consecutive outputs as one 128-bit store where the renderer proves it aligned
    if tn.reg % 4 == 0:
        st.vectorize(rn)
    else:
        st.unroll(rn)

    la = sch[acc]
    la.compute_at(st, tx)
    laxes = list(la.axis)
    lbb = [laxes.pop(0)] if p.batch is not None else []
    lgm, lvm, lty, lrm, lgn, lvn, ltx, lrn = laxes
    ko, ki = la.split(la.reduce_axis[0], int(config["k_tile"]))
    la.reorder(*lbb, lgm, lty, lgn, ltx, ko, ki, lvm, lrm, lvn, lrn)
    for ax in (lvm, lrm, lvn, lrn):
        la.unroll(ax)
    if config["unroll_k"]:
        la.unroll(ki)

    stages = {s.op.name: s for s in sch.stages}
    threads = (tm.threads, tn.threads)
    for name, op, k_major, block in (
        ("A_shared", p.a, config["a_shared"] == "km", tm.block),
        ("B_shared", p.b, config["b_shared"] == "kn", tn.block),
    ):
        _schedule_copy(stages[name], la, ko, op, k_major, threads, block, config)
    return sch


def _schedule_copy(
    s: Stage,
    at: Stage,
    ko: IterVar,
    op: GemmOperand,
    k_major: bool,
    threads: tuple[int, int],
    block: int,
    config: Config,
) -> None:
    """A shared tile filled once per k step by every thread of the block: its loops fused with
    global memory's contiguous axis innermost, `copy` lanes a thread, the rest over threads."""
    s.set_scope("shared")
    s.compute_at(at, ko)
    *lead, d0, d1 = s.op.axis
    # d0, d1 are (k, row) for a k-major tile, (row, k) otherwise
    k_ax, row_ax = (d0, d1) if k_major else (d1, d0)
    inner = k_ax if op.k_contiguous else row_ax
    other = row_ax if inner is k_ax else k_ax
    pad = int(config["shared_pad"])
    row = int(config["k_tile"]) if not k_major else block
    # rows under 32 words align to their own power of two: 16 + 4, not 32 + 4 (shared memory)
    factor = min(BANK_WORDS, 1 << (row - 1).bit_length())
    if pad % factor:
        s.storage_align(d0, factor, pad % factor)
    if config["double_buffer"]:
        s.double_buffer(stage_registers=config["double_buffer"] == "staged")
    s.reorder(*lead, other, inner)
    lanes: IterVar | None = None
    if config["copy"] != "scalar":
        # lanes split off the contiguous axis itself, so a thread's lanes stay in one row
        inner, lanes = s.split(inner, COPY_LANES)
    fused = s.fuse(*lead, other, inner)
    ty, tx = threads
    _, flat = s.split(fused, ty * tx)
    y, x = s.split(flat, nparts=ty)
    s.bind(y, "threadIdx.y")
    s.bind(x, "threadIdx.x")
    if lanes is not None:
        if config["copy"] == "async" and async_copy_ok(op, k_major, block, config):
            s.tensorize(lanes, copy_async_float4())
        else:
            s.vectorize(lanes)


COPY_LANES = 4  # float32 lanes of one 128-bit copy


def async_copy_ok(op: GemmOperand, k_major: bool, block: int, config: Config) -> bool:
    """Whether the operand's tile can be filled by 16-byte `cp.async` copies: its shared rows
    keep the global memory's contiguous axis, and every run of 4 is 16-byte aligned on both
    sides (the run in the tile, the shared row stride with its padding, the global row)."""
    if not op.aligned or k_major == op.k_contiguous:
        return False  # a gather, or a transposing copy
    row = block if k_major else int(config["k_tile"])
    factor = min(BANK_WORDS, 1 << (row - 1).bit_length())
    return row % COPY_LANES == 0 and (int(config["shared_pad"]) % factor) % COPY_LANES == 0


def copy_async_float4() -> TensorIntrin:
    """dst[4] = src[4] as one 16-byte `cp.async` (global to shared, sm_80+), both ends 16-byte
    aligned; the CUDA renderer makes the kernel's barriers wait for the copies first."""
    name = "kiln_cp_async_float4"
    source = f"""#include <cuda_pipeline.h>
__device__ __forceinline__ void {name}(float *d, int32_t ds, const float *s, int32_t ss) {{
  __pipeline_memcpy_async(d, s, 16);
}}
"""
    src = te.placeholder((COPY_LANES,), "float32", name="src")
    out = te.compute((COPY_LANES,), lambda i: src[i], name="dst")
    return TensorIntrin(name, out, (src,), source, name, None, _copy_emulation, None)


def _copy_emulation(out: np.ndarray, src: np.ndarray) -> None:
    out[...] = src


# -- templates --------------------------------------------------------------------------------


def parse_epilogue(name: str, value: int) -> Epilogue:
    try:
        return Epilogue(value)
    except ValueError:
        raise ValueError(
            f"{name}: epilogue is one of {[int(e) for e in Epilogue]}, got {value}"
        ) from None


def epilogue_reference(
    out: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None, epilogue: Epilogue
) -> np.ndarray:
    """float64 sums `out` with the epilogue applied, as float32; `bias` already broadcastable."""
    if epilogue is not Epilogue.NONE:
        assert bias is not None
        out = out + bias
    if epilogue is Epilogue.BIAS_ADD_RELU:
        assert residual is not None
        out = out + residual
    if epilogue.relu:
        out = np.maximum(out, 0.0)
    if epilogue is Epilogue.BIAS_RELU6:
        out = np.minimum(out, RELU6_CAP)
    return np.asarray(out, np.float32)


class ReshapedArgsTemplate(OpTemplate):
    """A template whose arguments are its logical arrays' bytes in other shapes (an output, a
    residual declared in the tile's shape): packing and unpacking are reshapes."""

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        args = self.tensors(shape, config)
        return [
            np.ascontiguousarray(x, np.float32).reshape(t.shape)
            for x, t in zip(inputs, args, strict=False)
        ]

    def unpack_output(
        self, shape: tuple[int, ...], config: Config | None, output: np.ndarray
    ) -> np.ndarray:
        return output.reshape(self.output_shape(shape))

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The logical output's shape."""
        raise NotImplementedError


class GemmTemplateBase(ReshapedArgsTemplate):
    """What dense, batch matmul and the implicit-GEMM convolution share: a `GemmProblem` per
    workload and config, the GEMM knobs, the tiled output layout."""

    layout_knobs = ("tile_m", "tile_n")

    def problem(self, shape: tuple[int, ...], args: Sequence[Tensor]) -> GemmProblem:
        raise NotImplementedError

    def gemm_inputs(self, shape: tuple[int, ...]) -> list[Tensor]:
        """The product's input placeholders."""
        raise NotImplementedError

    def epilogue_of(self, shape: tuple[int, ...]) -> Epilogue:
        raise NotImplementedError

    def vector_ok(self, shape: tuple[int, ...]) -> bool:
        """Whether 128-bit loads can be aligned (the default `copy` is then "float4")."""
        return False

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        p = self.problem(shape, self.gemm_inputs(shape))
        return ConfigSpace(gemm_knobs(p.m, p.n, p.k, self.vector_ok(shape)))

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        p = self.problem(shape, self.gemm_inputs(shape))
        if config["copy"] == "async" and not async_anywhere(p, config):
            return False
        if config["double_buffer"] == "staged" and not staged_anywhere(p, config):
            return False  # both tiles copy by cp.async: the True kernel again
        if config["min_blocks"] > 1 and not caps_registers(config):
            return False  # the cap is above ptxas's 255 registers: the min_blocks=1 kernel
        return gemm_worth_measuring(p.m, p.n, config)

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        inputs = self.gemm_inputs(shape)
        p = self.problem(shape, inputs)
        extra: list[Tensor] = []
        if p.epilogue is not Epilogue.NONE:
            extra.append(te.placeholder((p.m if p.bias_on_rows else p.n,), name="bias"))
        if p.epilogue is Epilogue.BIAS_ADD_RELU:
            extra.append(te.placeholder(tiled_shape(p, *gemm_tiles(p, config)), name="residual"))
        return [*inputs, *extra, gemm_compute(p, config, extra)]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        p = self.problem(shape, args)
        return schedule_gemm(p, config, args[-1])

    def flop(self, shape: tuple[int, ...]) -> float:
        p = self.problem(shape, self.gemm_inputs(shape))
        return 2.0 * (p.batch or 1) * p.m * p.n * p.k

"""Features of GPU candidates: what decides a CUDA kernel's speed beyond its knobs' values.

`gpu_features(func, sm)` reads a function lowered with `features.FEATURE_PASSES` (loops still
carry their kinds; thread bindings are `For` loops with a `thread_tag`). Layout (version
`GPU_FEATURE_VERSION`, `GPU_FEATURE_LENGTH` float32 values):

  [0]   log2(threads per block + 1)            (product of the threadIdx.* launch extents)
  [1]   log2(blocks + 1)                       (product of the blockIdx.* launch extents)
  [2]   warps per block
  [3]   idle lanes of the last warp / 32       (a block of 48 threads wastes 16 of 64 lanes)
  [4]   log2(shared memory bytes per block + 1) (a double-buffered tile counts twice)
  [5]   log2(local array elements per thread + 1): the register tile
  [6]   estimated registers per thread / 255   (`register_estimate`)
  [7]   occupancy estimate: resident warps per SM / the SM's most, for `sm` (`occupancy`)
  [8]   occupancy if only threads and blocks limited it
  [9]   occupancy if only shared memory limited it
  [10]  occupancy if only registers limited it
  [11]  widest vector access to global memory, elements (consecutive elements one thread reads
        or writes in its innermost non-thread loop, at most 16 bytes: what nvcc may merge)
  [12]  widest vector access to shared memory, elements (as [11])
  [13]  log2(largest bytes between the global accesses of neighbouring threadIdx.x threads + 1):
        4 for coalesced float32, more when each thread owns a strided slice

A CPU candidate has none of these: its features are `knob_features` alone, unchanged
(`config_features`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.arith.interval import const_bounds
from compiler.build_cuda import cuda_sm, is_cuda_target
from compiler.codegen.cuda import launch_dims
from compiler.errors import CompilerError
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import Allocate, For, ForKind, IfThenElse, Seq, Stmt, Store
from compiler.lower import lower
from tuner.search.features import FEATURE_PASSES, _extents, _leaves, _loads, knob_features
from tuner.task import Task

GPU_FEATURE_VERSION = 1
GPU_FEATURE_LENGTH = 14
WARP = 32
# Registers a thread needs beyond its local arrays: addresses, indices, loop counters. A guess
# that only has to order configs, as nvcc's allocation is not known before compiling.
BASE_REGISTERS = 24
MAX_REGISTERS = 255
VECTOR_BYTES = 16  # the widest load or store a thread issues (ld.global.v4.f32)
_REGISTER_UNIT = 256  # registers are given to warps in units of 256


@dataclass(frozen=True)
class SmLimits:
    """What one streaming multiprocessor of a compute capability holds at once."""

    threads: int
    blocks: int
    shared_bytes: int
    registers: int = 65536
    shared_per_block: int = 48 * 1024  # a kernel's static __shared__ arrays at most


# From NVIDIA's CUDA C Programming Guide, "Compute Capabilities" table. A capability between
# two of these takes the lower one's limits.
SM_LIMITS: dict[int, SmLimits] = {
    70: SmLimits(2048, 32, 96 * 1024),
    75: SmLimits(1024, 16, 64 * 1024),
    80: SmLimits(2048, 32, 164 * 1024),
    86: SmLimits(1536, 16, 100 * 1024),
    89: SmLimits(1536, 24, 100 * 1024),
    90: SmLimits(2048, 32, 228 * 1024),
}


def sm_limits(sm: int) -> SmLimits:
    """The limits of compute capability `sm` (90 for sm_90), or of the nearest older one known."""
    known = [k for k in SM_LIMITS if k <= sm]
    return SM_LIMITS[max(known) if known else min(SM_LIMITS)]


@dataclass(frozen=True)
class Occupancy:
    """Resident warps per SM over the SM's most, overall and under each limit alone."""

    overall: float
    by_threads: float
    by_shared: float
    by_registers: float


def occupancy(threads: int, shared_bytes: int, registers: int, sm: int) -> Occupancy:
    """The occupancy of a kernel of `threads` per block, `shared_bytes` of shared memory per
    block and `registers` per thread on an SM of capability `sm` (0 everywhere: it cannot
    launch)."""
    lim = sm_limits(sm)
    max_warps = lim.threads // WARP
    if not 1 <= threads <= 1024 or shared_bytes > lim.shared_per_block or registers > 255:
        return Occupancy(0.0, 0.0, 0.0, 0.0)
    warps = math.ceil(threads / WARP)
    by_threads = min(lim.blocks, lim.threads // (warps * WARP))
    # each block also reserves 1 KiB of shared memory for the system (sm_80 and later)
    by_shared = lim.blocks if shared_bytes == 0 else lim.shared_bytes // (shared_bytes + 1024)
    per_warp = math.ceil(registers * WARP / _REGISTER_UNIT) * _REGISTER_UNIT
    by_registers = (lim.registers // per_warp) // warps

    def share(blocks: int) -> float:
        return min(blocks * warps, max_warps) / max_warps

    blocks = min(by_threads, by_shared, by_registers)
    return Occupancy(share(blocks), share(by_threads), share(by_shared), share(by_registers))


def register_estimate(local_elements: int) -> int:
    """Registers per thread: `BASE_REGISTERS` plus one per 4-byte local element, at most 255
    (beyond, nvcc spills to local memory)."""
    return min(MAX_REGISTERS, BASE_REGISTERS + local_elements)


def _allocations(body: Stmt) -> list[Allocate]:
    out: list[Allocate] = []
    stack = [body]
    while stack:
        s = stack.pop()
        if isinstance(s, Allocate):
            out.append(s)
            stack.append(s.body)
        elif isinstance(s, For):
            stack.append(s.body)
        elif isinstance(s, Seq):
            stack.extend(s.stmts)
        elif isinstance(s, IfThenElse):
            stack.extend(x for x in (s.then_case, s.else_case) if x is not None)
    return out


def _step(index: E.Expr, loops: list[For], var: E.Var) -> int | None:
    """How far `index` moves when `var` goes from 0 to 1 (every other loop at 0)."""
    lo = const_bounds(index, {lp.var: (0, 0) for lp in loops})
    hi = const_bounds(index, {lp.var: ((1, 1) if lp.var is var else (0, 0)) for lp in loops})
    if lo is None or hi is None:
        return None
    return abs(hi[0] - lo[0])


def _vector_width(buf: Buffer, index: E.Expr, loops: list[For], extents: list[int]) -> int:
    """Consecutive elements of `buf` one thread touches in its innermost non-thread loop, as a
    power of two of at most VECTOR_BYTES (1 when that loop strides or there is none)."""
    own = [
        (lp, ext)
        for lp, ext in zip(loops, extents, strict=True)
        if lp.kind != ForKind.THREAD_BINDING
    ]
    if not own:
        return 1
    loop, ext = own[-1]
    if _step(index, loops, loop.var) != 1:
        return 1
    width = 1
    most = max(1, VECTOR_BYTES // int(np.dtype(buf.dtype).itemsize))
    while width * 2 <= min(ext, most) and ext % (width * 2) == 0:
        width *= 2
    return width


def gpu_features(func: PrimFunc, sm: int) -> np.ndarray:
    """The GPU feature vector (see the module docstring) of a function lowered with
    `FEATURE_PASSES`, for an SM of capability `sm`.

    Returns:
        float32 [GPU_FEATURE_LENGTH], every value finite.
    """
    out = np.zeros(GPU_FEATURE_LENGTH, dtype=np.float64)
    dims = launch_dims(func)
    threads = math.prod(v for k, v in dims.items() if k.startswith("threadIdx"))
    blocks = math.prod(v for k, v in dims.items() if k.startswith("blockIdx"))
    warps = math.ceil(threads / WARP)
    allocs = _allocations(func.body)
    shared = sum(
        a.buffer.nbytes * (2 if a.double_buffer else 1)
        for a in allocs
        if a.buffer.scope == "shared"
    )
    local_bytes = sum(a.buffer.nbytes for a in allocs if a.buffer.scope == "local")
    local_elements = math.ceil(local_bytes / 4)
    registers = register_estimate(local_elements)
    occ = occupancy(threads, shared, registers, sm)
    out[0] = math.log2(threads + 1)
    out[1] = math.log2(blocks + 1)
    out[2] = warps
    out[3] = (warps * WARP - threads) / WARP
    out[4] = math.log2(shared + 1)
    out[5] = math.log2(local_elements + 1)
    out[6] = registers / MAX_REGISTERS
    out[7:11] = (occ.overall, occ.by_threads, occ.by_shared, occ.by_registers)
    widest = {"global": 1, "shared": 1}
    coalescing = 0
    for leaf in _leaves(func.body):
        if not isinstance(leaf.stmt, Store):
            continue
        extents = _extents(leaf.loops)
        accesses: list[tuple[Buffer, E.Expr]] = [(leaf.stmt.buffer, leaf.stmt.index)]
        _loads(leaf.stmt.value, accesses)
        tx = [lp for lp in leaf.loops if lp.thread_tag == "threadIdx.x"]
        for buf, index in accesses:
            if buf.scope in widest:
                width = _vector_width(buf, index, leaf.loops, extents)
                widest[buf.scope] = max(widest[buf.scope], width)
            if buf.scope == "global" and tx:
                step = _step(index, leaf.loops, tx[0].var)
                if step is not None:
                    coalescing = max(coalescing, step * int(np.dtype(buf.dtype).itemsize))
    out[11] = widest["global"]
    out[12] = widest["shared"]
    out[13] = math.log2(coalescing + 1)
    return np.nan_to_num(out, nan=0.0, posinf=64.0, neginf=-64.0).astype(np.float32)


ConfigFeatures = Callable[[np.ndarray], np.ndarray]


@functools.lru_cache(maxsize=50_000)
def _config_gpu_features(task: Task, index: int, sm: int) -> np.ndarray:
    try:
        sch, args = task.template.instantiate(task.workload.shape, task.space.get(index))
        func = lower(sch, args, name="f", passes=FEATURE_PASSES)
    except CompilerError:
        # a config that does not lower fails its build too; its row only has to be finite
        return np.zeros(GPU_FEATURE_LENGTH, dtype=np.float32)
    return gpu_features(func, sm)


def task_gpu_features(task: Task, indices: np.ndarray, sm: int) -> np.ndarray:
    """GPU features [n, GPU_FEATURE_LENGTH] of configs `indices` of `task` on an SM of
    capability `sm`; each config is lowered once per process."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    out = np.zeros((idx.size, GPU_FEATURE_LENGTH), dtype=np.float32)
    for row, index in enumerate(idx):
        out[row] = _config_gpu_features(task, int(index), sm)
    return out


def gpu_feature_fn(task: Task, target: str) -> ConfigFeatures | None:
    """The extra cost-model columns of `task`'s configs on compile target `target`: GPU
    features on a cuda target ("cuda/sm=90"), None (knob features alone) on any other."""
    if not is_cuda_target(target):
        return None
    sm = cuda_sm(target)
    return lambda indices: task_gpu_features(task, indices, sm)


def config_features(task: Task, indices: np.ndarray, target: str = "host") -> np.ndarray:
    """What the cost model sees of configs `indices` of `task` on `target`: `knob_features`,
    then on a GPU target `task_gpu_features`."""
    knobs = knob_features(task.space, indices)
    extra = gpu_feature_fn(task, target)
    return knobs if extra is None else np.hstack([knobs, extra(np.asarray(indices))])

"""Features of candidate configs for the cost model: cheap knob features and loop-IR features.

Two kinds:
- `knob_features(space, indices)`: what simulated annealing scores, vectorized with numpy over
  any number of config indices (no lowering): per knob with numeric choices log2(|value| + 1)
  (signed) and the raw digit; per knob with other choices (bools, strings) a one-hot of the
  digit. The width depends on the space only (`knob_feature_width`).
- `loop_features(func, flop)`: AutoTVM's "itervar" features of a lowered loop program reduced
  to a fixed-length, workload-independent "curve" form, for transfer across workloads and
  templates. Layout (version `FEATURE_VERSION`, `LOOP_FEATURE_LENGTH` float32 values):

  [0]            log2(FLOP per byte of the function's parameters + 1)
  [1]            log2(iterations of the main statement + 1)
  [2]            (iterations of every statement) / (iterations of the main one), log2
  [3]            number of statements that write memory
  [4]            log2(bytes of "local" allocations + 1): the register tile
  [5]            log2(vector lanes of the main statement + 1) (extent of its vectorized loops)
  [6]            log2(product of unrolled extents around the main statement + 1)
  [7]            depth of the main statement's loop nest
  [8 : 48]       the main statement's loops, innermost first, `LOOP_SLOTS` slots of
                 [log2(extent + 1), serial, vectorized, unrolled, parallel]; missing slots 0
  [48 : 104]     `ACCESS_SLOTS` access classes of the main statement: the buffer it stores,
                 then the other buffers it loads, largest first. Per class `_ACCESS_WIDTH`
                 values: the touched-bytes/reuse curve (for each of `CURVE_POINTS` cache sizes
                 2^b bytes, the largest log2 reuse of a loop level whose touched bytes fit),
                 log2(touched bytes + 1) under the innermost loop and under the whole nest,
                 log2(|stride of the innermost loop| + 1), and 1 if the buffer is local

  The "main statement" is the store (or intrinsic call) that runs the most iterations. A loop
  level's touched bytes for a buffer are the distinct elements its index reaches while the
  loops at and inside that level run (outer loops fixed), times the element size; its reuse is
  the iterations under that level divided by those elements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real

import numpy as np

from compiler.arith.interval import const_bounds
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import Allocate, For, ForKind, IfThenElse, IntrinCall, Seq, Stmt, Store
from compiler.ops.space import ConfigSpace

FEATURE_VERSION = 1
LOOP_SLOTS = 8
ACCESS_SLOTS = 4
CURVE_POINTS = (6, 8, 10, 12, 14, 16, 18, 20, 22, 24)  # log2 bytes: 64 B .. 16 MiB
_ACCESS_WIDTH = len(CURVE_POINTS) + 4
_KINDS = (ForKind.SERIAL, ForKind.VECTORIZED, ForKind.UNROLLED, ForKind.PARALLEL)
_HEAD = 8
LOOP_FEATURE_LENGTH = _HEAD + LOOP_SLOTS * (1 + len(_KINDS)) + ACCESS_SLOTS * _ACCESS_WIDTH
# Lowering passes run before features are read: loops keep their kinds (vectorize and unroll
# passes would remove them) and indices are already flat and simplified.
FEATURE_PASSES = ("flatten", "simplify")


# -- knob features --------------------------------------------------------------------------


def _is_numeric(choices: Sequence[object]) -> bool:
    return all(isinstance(c, Real) and not isinstance(c, bool) for c in choices)


def knob_feature_width(space: ConfigSpace) -> int:
    """Columns of `knob_features` for `space`."""
    return sum(2 if _is_numeric(k.choices) else len(k.choices) for k in space.knobs)


def digits(space: ConfigSpace, indices: np.ndarray) -> np.ndarray:
    """The mixed-radix digits [n, knobs] (int64) of config `indices` (last knob fastest)."""
    rest = np.asarray(indices, dtype=np.int64).copy()
    out = np.empty((rest.shape[0], len(space.knobs)), dtype=np.int64)
    for j in range(len(space.knobs) - 1, -1, -1):
        radix = len(space.knobs[j].choices)
        out[:, j] = rest % radix
        rest //= radix
    return out


def indices_of(space: ConfigSpace, digit_matrix: np.ndarray) -> np.ndarray:
    """The config indices (int64) of a digit matrix [n, knobs]; inverse of `digits`."""
    out = np.zeros(digit_matrix.shape[0], dtype=np.int64)
    for j, knob in enumerate(space.knobs):
        out = out * len(knob.choices) + digit_matrix[:, j]
    return out


def knob_features(space: ConfigSpace, indices: np.ndarray) -> np.ndarray:
    """Features [n, knob_feature_width(space)] (float32) of config `indices`.

    Raises:
        IndexError: an index is outside the space.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= len(space)):
        raise IndexError(f"config indices must lie in [0, {len(space)})")
    d = digits(space, idx)
    cols: list[np.ndarray] = []
    for j, knob in enumerate(space.knobs):
        if _is_numeric(knob.choices):
            values = np.asarray(knob.choices, dtype=np.float64)
            table = np.sign(values) * np.log2(np.abs(values) + 1.0)
            cols.append(table[d[:, j]])
            cols.append(d[:, j].astype(np.float64))
        else:
            cols.append(np.eye(len(knob.choices))[d[:, j]].T)
    if not cols:
        return np.zeros((idx.size, 0), dtype=np.float32)
    return np.vstack([c.reshape(-1, idx.size) for c in cols]).T.astype(np.float32)


# -- loop-IR features -----------------------------------------------------------------------


@dataclass
class _Leaf:
    """A statement that writes memory, with the loops around it (outermost first)."""

    loops: list[For]
    stmt: Store | IntrinCall


def _leaves(body: Stmt) -> list[_Leaf]:
    out: list[_Leaf] = []

    def visit(s: Stmt, loops: list[For]) -> None:
        if isinstance(s, For):
            visit(s.body, [*loops, s])
        elif isinstance(s, Seq):
            for x in s.stmts:
                visit(x, loops)
        elif isinstance(s, Allocate):
            visit(s.body, loops)
        elif isinstance(s, IfThenElse):
            visit(s.then_case, loops)
            if s.else_case is not None:
                visit(s.else_case, loops)
        elif isinstance(s, Store | IntrinCall):
            out.append(_Leaf(loops, s))

    visit(body, [])
    return out


def _allocations(body: Stmt) -> list[Buffer]:
    out: list[Buffer] = []
    stack = [body]
    while stack:
        s = stack.pop()
        if isinstance(s, Allocate):
            out.append(s.buffer)
            stack.append(s.body)
        elif isinstance(s, For):
            stack.append(s.body)
        elif isinstance(s, Seq):
            stack.extend(s.stmts)
        elif isinstance(s, IfThenElse):
            stack.extend(x for x in (s.then_case, s.else_case) if x is not None)
    return out


def _extents(loops: list[For]) -> list[int]:
    """Largest extent of each loop; loop variables range over [0, extent - 1]."""
    ranges: dict[E.Var, tuple[int, int]] = {}
    out: list[int] = []
    for loop in loops:
        b = const_bounds(loop.extent, ranges)
        ext = max(1, b[1]) if b is not None else 1
        out.append(ext)
        ranges[loop.var] = (0, ext - 1)
    return out


def _loads(expr: E.Expr, out: list[tuple[Buffer, E.Expr]]) -> None:
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, E.Load):
            out.append((e.buffer, e.index))
        stack.extend(E.children(e))


def _itemsize(buf: Buffer) -> int:
    return int(np.dtype(buf.dtype).itemsize)


def _access_features(
    buf: Buffer, index: E.Expr, region: int, loops: list[For], extents: list[int]
) -> np.ndarray:
    """Curve, touched bytes, innermost stride and scope of one access (`region` elements)."""
    n = len(loops)
    used = E.free_vars(index)
    size = _itemsize(buf)
    # Level "no loop" first: one execution of the statement touches its region once.
    touched: list[float] = [float(region * size)]
    reuse: list[float] = [1.0]
    iters = 1.0
    count = 1.0
    for level in range(n - 1, -1, -1):
        iters *= extents[level]
        if loops[level].var in used:
            count *= extents[level]
        ranges = {
            lp.var: (0, ext - 1) if i >= level else (0, 0)
            for i, (lp, ext) in enumerate(zip(loops, extents, strict=True))
        }
        b = const_bounds(index, ranges)
        span = float(b[1] - b[0] + 1) if b is not None else count
        distinct = min(count, span, float(buf.size)) * region
        touched.append(distinct * size)
        reuse.append(iters * region / max(distinct, 1.0))
    touched_log = np.log2(np.asarray(touched) + 1.0)
    reuse_log = np.log2(np.asarray(reuse))
    curve = np.zeros(len(CURVE_POINTS))
    for p, point in enumerate(CURVE_POINTS):
        fits = touched_log <= point
        curve[p] = reuse_log[fits].max() if fits.any() else 0.0
    stride = 0
    if n:
        inner = loops[-1].var
        lo = const_bounds(index, {lp.var: (0, 0) for lp in loops})
        hi = const_bounds(index, {lp.var: ((1, 1) if lp.var is inner else (0, 0)) for lp in loops})
        if lo is not None and hi is not None and extents[-1] > 1:
            stride = abs(hi[0] - lo[0])
    local = 1.0 if buf.scope != "global" else 0.0
    tail = [touched_log[1] if n else touched_log[0], touched_log[-1], math.log2(stride + 1), local]
    return np.concatenate([curve, np.asarray(tail)])


def loop_features(func: PrimFunc, flop: float) -> np.ndarray:
    """The fixed-length feature vector (see the module docstring) of a lowered function.

    Args:
        func: the function, lowered with `FEATURE_PASSES` (loops still carry their kinds).
        flop: floating-point operations of one call.

    Returns:
        float32 [LOOP_FEATURE_LENGTH], every value finite.
    """
    out = np.zeros(LOOP_FEATURE_LENGTH, dtype=np.float64)
    param_bytes = sum(p.nbytes for p in func.params) or 1
    out[0] = math.log2(flop / param_bytes + 1.0)
    leaves = _leaves(func.body)
    if not leaves:
        return out.astype(np.float32)
    all_extents = [_extents(leaf.loops) for leaf in leaves]
    iterations = [float(math.prod(e)) for e in all_extents]
    main = int(np.argmax(iterations))
    leaf, extents = leaves[main], all_extents[main]
    out[1] = math.log2(iterations[main] + 1.0)
    out[2] = math.log2(sum(iterations) / iterations[main])
    out[3] = len(leaves)
    local_bytes = sum(b.nbytes for b in _allocations(func.body) if b.scope == "local")
    out[4] = math.log2(local_bytes + 1.0)
    kinds = [lp.kind for lp in leaf.loops]
    lanes = math.prod(e for e, k in zip(extents, kinds, strict=True) if k == ForKind.VECTORIZED)
    unrolled = math.prod(e for e, k in zip(extents, kinds, strict=True) if k == ForKind.UNROLLED)
    out[5] = math.log2(lanes + 1.0)
    out[6] = math.log2(unrolled + 1.0)
    out[7] = len(leaf.loops)
    base = _HEAD
    for slot, (loop, ext) in enumerate(zip(reversed(leaf.loops), reversed(extents), strict=True)):
        if slot >= LOOP_SLOTS:
            break
        row = base + slot * (1 + len(_KINDS))
        out[row] = math.log2(ext + 1.0)
        if loop.kind in _KINDS:
            out[row + 1 + _KINDS.index(loop.kind)] = 1.0
    base += LOOP_SLOTS * (1 + len(_KINDS))
    accesses: list[tuple[Buffer, E.Expr, int]] = []
    loads: list[tuple[Buffer, E.Expr]] = []
    if isinstance(leaf.stmt, Store):
        accesses.append((leaf.stmt.buffer, leaf.stmt.index, 1))
        _loads(leaf.stmt.value, loads)
        _loads(leaf.stmt.index, loads)
        stored = leaf.stmt.buffer
        others = [(b, i, 1) for b, i in loads if b is not stored]
    else:
        # An intrinsic reads and writes whole regions: the output operand first.
        regions = [
            (buf, off, math.prod(shape))
            for (buf, off, _), shape in zip(leaf.stmt.operands, leaf.stmt.shapes, strict=True)
        ]
        accesses.append(regions[0])
        others = list(regions[1:])
    seen: set[int] = set()
    unique = []
    for b, i, r in sorted(others, key=lambda a: -a[0].nbytes):
        if id(b) not in seen:
            seen.add(id(b))
            unique.append((b, i, r))
    accesses.extend(unique)
    for slot, (buf, index, region) in enumerate(accesses[:ACCESS_SLOTS]):
        row = base + slot * _ACCESS_WIDTH
        out[row : row + _ACCESS_WIDTH] = _access_features(buf, index, region, leaf.loops, extents)
    return np.nan_to_num(out, nan=0.0, posinf=64.0, neginf=-64.0).astype(np.float32)

"""Cross-thread reductions: a reduce loop bound to `threadIdx.*` becomes a shared-memory tree.

TVM's "allreduce": the threads of a block share one reduction (a softmax row's max, a layer
norm row's mean), each thread accumulating a strided part of it and the block combining the
partials. A stage whose reduction has a leaf bound to a threadIdx axis (`Stage.bind` allows it
for threadIdx only) is lowered as phases separated by barriers:

    red = allocate(T[<thread data extents>, R], shared)   # R: the bound reduce loop's extent
    phase 1, every thread r:  acc = identity; <serial reduce loops> acc = combine(acc, x);
                              red[.., r] = acc
    barrier
    for s in P/2, P/4, .., 1 (P: R rounded up to a power of two), every thread r:
                              if r < s (and r + s < R): red[.., r] = combine(red[.., r], red[.., r + s])
                              barrier
    final, thread r == 0:     out[..] = red[.., 0]     (every thread when `out` is "local")
    barrier

Each phase is a sibling loop nest over the stage's thread axes, never one loop around a barrier:
on the GPU the nests are the same threads (each renders to `int32_t r = threadIdx.x;`), and the
loop-IR interpreter, which runs a thread loop's iterations one after another, meets every
barrier between two whole phases, so it runs the tree exactly as the block does (it cannot see
a missing barrier, since barriers are no-ops to it: the tests count them).

The last 32 partials fold by warp shuffles where threads 0-31 of a row are one whole warp (the
reduce loop on threadIdx.x, at least 32 wide, in a block of whole warps; float32 or int32):
the shared steps stop at s = 32, then threads 0-31 call `warp_reduce_call`'s intrinsic (five
`__shfl_down_sync`, no barrier between them), which writes red[.., R], the slot the result is
read from. Five barriers and shared round trips fewer; whether that pays for a given row length
is for a GPU to measure.

Shape rules (LowerError otherwise): one reduce leaf bound to a threadIdx axis; every data leaf
bound to a grid axis or of extent 1 (blockIdx-bound ones enclose the phases, threadIdx-bound
ones index the partials, so a warp-per-row schedule reduces a row per threadIdx.y); no stage
attached at this stage's loops. Other threadIdx axes that other stages of the kernel bind get
an extent-1 loop around each phase, so only their thread 0 takes part (the others would race
on the partials). The stage must be computed outside every thread loop (its barriers are the
whole block's). Tails are guards (loop_nest gives a bound loop its constant extent, the
launch dimension): the partial of a thread past the end stays the identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from compiler.errors import LowerError
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.stmt import Allocate, Barrier, BufferStore, For, ForKind, IntrinCall, Stmt, seq
from compiler.schedule.schedule import Stage
from compiler.te.tensor import IterKind, IterVar, Reduce

if TYPE_CHECKING:
    from compiler.lower.loop_nest import _Builder


def thread_reduce_leaf(stage: Stage) -> IterVar | None:
    """The reduce leaf of `stage` bound to a threadIdx axis, if any (one at most)."""
    bound = [
        leaf
        for leaf in stage.leaf_iter_vars
        if leaf.kind is IterKind.REDUCE and leaf in stage.thread_tags
    ]
    if len(bound) > 1:
        names = [leaf.name for leaf in bound]
        raise LowerError(f"stage {stage.name}: reduce loops {names} all bound to threads")
    return bound[0] if bound else None


def lower_allreduce(
    builder: _Builder,
    stage: Stage,
    extents: dict[IterVar, E.Expr],
    guards: list[E.Expr],
    subst: dict[E.Var, E.Expr],
    out: Buffer,
    index: tuple[E.Expr, ...],
) -> Stmt:
    """The phases of `stage`'s cross-thread reduction (see the module doc).

    `extents`, `guards`, `subst`, `out` and `index` are the loop nest builder's for the stage:
    loop extents with tails, tail guards, axis values, and where the result goes.
    """
    op = stage.op
    reduce = op.body
    assert isinstance(reduce, Reduce)
    rl = thread_reduce_leaf(stage)
    assert rl is not None
    ext = builder.bounds[stage].extent
    leaves = stage.leaf_iter_vars
    tags = stage.thread_tags
    if any(builder.attached.get((stage, leaf)) for leaf in leaves):
        raise LowerError(
            f"stage {stage.name}: no stage may be attached inside a cross-thread reduction"
        )
    outer: Stage | None = stage
    while outer is not None and outer.attach == "at":
        parent, at = outer.attach_stage, outer.attach_ivar
        assert parent is not None and at is not None
        enclosing = parent.leaf_iter_vars[: parent.leaf_iter_vars.index(at) + 1]
        if any(parent.thread_tags.get(v, "").startswith("threadIdx") for v in enclosing):
            # its barriers would sit inside a thread loop: each thread would wait for itself
            raise LowerError(
                f"stage {stage.name}: a cross-thread reduction must be computed outside every "
                f"thread loop (it is inside {parent.name}'s)"
            )
        outer = parent
    blocks = [v for v in leaves if tags.get(v, "").startswith("blockIdx")]
    threads = [
        v for v in leaves if v.kind is IterKind.DATA and tags.get(v, "").startswith("threadIdx")
    ]
    ones = [v for v in leaves if v.kind is IterKind.DATA and v not in tags]
    serial = [v for v in leaves if v.kind is IterKind.REDUCE and v is not rl]
    for v in ones:
        if ext[v] != 1:
            raise LowerError(
                f"stage {stage.name}: data loop {v.name} (extent {ext[v]}) of a cross-thread "
                "reduction must be bound to a grid axis or have extent 1"
            )
    for v in leaves:
        if tags.get(v, "").startswith("vthread"):
            raise LowerError(
                f"stage {stage.name}: vthread loop {v.name} in a cross-thread reduction"
            )
    mine = {tags[v] for v in (*threads, rl)}
    if len(mine) != len(threads) + 1:
        raise LowerError(f"stage {stage.name}: two loops of a cross-thread reduction on one axis")

    # Thread and block loops have constant extents here (loop_nest guards their tails).
    conds = list(guards)
    serial_extents = {v: e for v, e in extents.items() if v in serial}
    reduce_vars = {v.var for v in leaves if v.kind is IterKind.REDUCE}
    data_conds = [c for c in conds if not E.free_vars(c) & reduce_vars]
    used = {t for s in builder.live for t in s.thread_tags.values() if t.startswith("threadIdx")}
    others = sorted(used - mine)

    def phase(body: Stmt, only_thread0_of_others: bool = True) -> Stmt:
        stmt = builder.nest(stage, [*threads, *ones, rl], body, [], {}, False)
        if only_thread0_of_others:
            for tag in others:
                stmt = For(
                    E.Var(f"{stage.name}_{tag[-1]}0"),
                    E.IntImm(1),
                    ForKind.THREAD_BINDING,
                    stmt,
                    tag,
                )
        return stmt

    width = ext[rl]
    block_x = max(
        (
            builder.bounds[g].extent[v]
            for g in builder.live
            for v in g.leaf_iter_vars
            if g.thread_tags.get(v) == "threadIdx.x"
        ),
        default=1,
    )
    # the last 32 partials by warp shuffles: threads 0-31 of the row must be one whole warp
    warp = (
        tags[rl] == "threadIdx.x"
        and width >= WARP
        and block_x % WARP == 0
        and out.dtype in _SHUFFLE_TYPES
    )
    slots = width + 1 if warp else width  # red[.., width]: the warp's result
    red = Buffer(f"{stage.name}.red", (*(ext[v] for v in threads), slots), out.dtype, "shared")
    acc = Buffer(f"{stage.name}.acc", (1,), out.dtype, "local")
    acc_at = (E.IntImm(0),)
    prefix = tuple(v.var for v in threads)

    def slot(offset: E.Expr) -> tuple[E.Expr, ...]:
        return (*prefix, offset)

    source = builder.to_ir(reduce.source, subst, stage)
    update = BufferStore(acc, acc_at, reduce.combine(E.BufferLoad(acc, acc_at), source))
    partial = seq(
        BufferStore(acc, acc_at, reduce.identity()),
        builder.nest(stage, serial, update, conds, serial_extents, False),
        BufferStore(red, slot(rl.var), E.BufferLoad(acc, acc_at)),
    )
    steps: list[Stmt] = [phase(Allocate(acc, partial)), Barrier()]
    span = 1 << (width - 1).bit_length()
    step = span // 2
    while step >= (WARP if warp else 1):
        own = E.BufferLoad(red, slot(rl.var))
        theirs = E.BufferLoad(red, slot(rl.var + step))
        fold = BufferStore(red, slot(rl.var), reduce.combine(own, theirs))
        cond: E.Expr = E.LT(rl.var, E.IntImm(step))
        if 2 * step > width:
            cond = E.And(cond, E.LT(rl.var + step, E.IntImm(width)))
        steps += [phase(builder.nest(stage, [], fold, [cond], {}, False)), Barrier()]
        step //= 2
    result = E.IntImm(0)
    if warp:
        row: E.Expr = E.IntImm(0)
        for v, stride in zip(threads, red.strides, strict=False):
            row = row + v.var * stride
        call = warp_reduce_call(reduce.combiner, red, row, width)
        steps += [phase(builder.nest(stage, [], call, [rl.var < WARP], {}, False)), Barrier()]
        result = E.IntImm(width)
    local = out.scope == "local"  # each thread's own copy: every thread writes it
    final_conds = data_conds if local else [*data_conds, E.EQ(rl.var, E.IntImm(0))]
    write = BufferStore(out, index, E.BufferLoad(red, slot(result)))
    steps.append(phase(builder.nest(stage, [], write, final_conds, {}, False), not local))
    if not (stage.attach == "at" and stage.scope == "shared"):
        steps.append(Barrier())  # the next use of `red` must wait for every read of red[.., 0]
    return builder.nest(stage, blocks, Allocate(red, seq(*steps)), [], {}, False)


WARP = 32
_SHUFFLE_TYPES = {"float32": "float", "int32": "int32_t"}
_C_COMBINE = {"sum": "v + o", "prod": "v * o", "max": "v > o ? v : o", "min": "v < o ? v : o"}
_NP_COMBINE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add,
    "prod": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def warp_reduce_call(combiner: str, red: Buffer, row: E.Expr, width: int) -> IntrinCall:
    """red[row + width] = `combiner` of red[row : row + 32], by one warp's shuffles.

    Every lane of the warp calls it (threads 0-31 of the row): lane l holds red[row + l], five
    `__shfl_down_sync` steps fold the lanes, lane 0 stores. The interpreter's emulation folds
    in the same order, and writes a slot the call does not read, so each of the 32 emulated
    calls gives the same result.
    """
    ctype = _SHUFFLE_TYPES[red.dtype]
    name = f"kiln_warp_{combiner}_{red.dtype}"
    source = (
        f"__device__ __forceinline__ void {name}({ctype} *out, int32_t out_s0, "
        f"const {ctype} *in, int32_t in_s0) {{\n"
        f"  const int32_t lane = (int32_t)(threadIdx.x & {WARP - 1});\n"
        f"  {ctype} v = in[lane * in_s0];\n"
        f"  #pragma unroll\n"
        f"  for (int32_t s = {WARP // 2}; s > 0; s >>= 1) {{\n"
        f"    const {ctype} o = __shfl_down_sync(0xffffffffu, v, s);\n"
        f"    v = {_C_COMBINE[combiner]};\n"
        f"  }}\n"
        f"  if (lane == 0) *out = v;\n"
        f"}}\n"
    )
    fold = _NP_COMBINE[combiner]

    def emulate(result: np.ndarray, lanes: np.ndarray) -> None:
        v = lanes.copy()
        s = WARP // 2
        while s:
            v[:s] = fold(v[:s], v[s : 2 * s])
            s //= 2
        result[0] = v[0]

    operands = ((red, row + width, (1,)), (red, row, (1,)))
    return IntrinCall(name, operands, ((1,), (WARP,)), source, emulate)

"""Build the loop nest of a schedule: one nest per root stage, attached stages inside their loops.

Each stage's loops are its leaf loops, outermost first; every original axis is rebuilt from the
leaves through the split and fuse relations, offset by the stage's region start (bound
inference). A split that does not divide its axis leaves points past the end: the inner loop's
extent becomes `min(factor, extent - outer * factor)` when the inner loop sits inside every loop
its outer part depends on and is not bound to a GPU axis (whose extent is the launch dimension),
and an `if` guard covers the other cases (loop partition later moves
both out of the hot loop). A reduction with a loop bound to threads is a cross-thread reduction
(allreduce.py). A reduction gets its accumulator set to the identity just before the
first reduction loop, inside the data loops that enclose that loop and over the data loops nested
within it. Intermediate tensors get buffers: the whole tensor at the top for root stages, just
the region for attached ones (allocated inside the attach loop, so per thread when parallel).
Reads and writes are multi-dimensional here (BufferLoad / BufferStore); storage flatten follows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.arith import const_bounds
from compiler.errors import LowerError
from compiler.ir import expr as E
from compiler.ir.buffer import WMMA_SCOPES, Buffer
from compiler.ir.stmt import (
    Allocate,
    Barrier,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    Stmt,
    seq,
)
from compiler.lower.allreduce import lower_allreduce, thread_reduce_leaf
from compiler.lower.bound import StageBounds, infer_bounds, local_values
from compiler.schedule.schedule import Schedule, Split, Stage
from compiler.te.tensor import IterKind, IterVar, PlaceholderOp, Reduce, Tensor, TensorLoad


@dataclass
class _Storage:
    buffer: Buffer
    lo: list[E.Expr]  # subtracted from each absolute index (a region's start; 0 for whole tensors)
    is_param: bool


@dataclass
class LoopNest:
    """The result: the body, the parameter buffers (in `args` order), and root allocations."""

    body: Stmt
    params: tuple[Buffer, ...]


def build_loop_nest(sch: Schedule, args: Sequence[Tensor], name: str) -> LoopNest:
    """The loop nest computing every stage of `sch`, over one parameter buffer per `args` tensor.

    Raises:
        LowerError: an input is missing from `args`, names repeat, or placement is inconsistent.
    """
    return _Builder(sch, args, name).build()


class _Builder:
    def __init__(self, sch: Schedule, args: Sequence[Tensor], name: str) -> None:
        names = [t.name for t in args]
        if len(set(names)) != len(names) or len(set(args)) != len(args):
            raise LowerError(
                f"{name}: argument tensors and their names must be distinct, got {names}"
            )
        self.sch = sch
        self.live = [s for s in sch.stages if s.attach != "inline"]
        self.bounds: dict[Stage, StageBounds] = infer_bounds(sch)
        self.ranges: dict[E.Var, tuple[int, int]] = {}
        for stage, b in self.bounds.items():
            for leaf in stage.leaf_iter_vars:
                self.ranges[leaf.var] = (0, b.extent[leaf] - 1)
        self.storage: dict[Tensor, _Storage] = {}
        self.params = tuple(Buffer(t.name, t.shape, t.dtype) for t in args)
        for t, buf in zip(args, self.params, strict=True):
            self.storage[t] = _Storage(buf, [E.IntImm(0)] * len(t.shape), True)
        taken = set(names)
        for stage in self.live:
            if stage.tensor in self.storage:
                continue
            b = self.bounds[stage]
            shape = tuple(b.extent[a] for a in stage.op.axis)
            if stage.row_align is not None:  # padded rows (storage_align)
                factor, offset = stage.row_align
                shape = (*shape[:-1], shape[-1] + (offset - shape[-1]) % factor)
            buf_name = _unique(stage.tensor.name, taken)
            buf = Buffer(buf_name, shape, stage.tensor.dtype, stage.scope)
            self.storage[stage.tensor] = _Storage(buf, [b.lo[a] for a in stage.op.axis], False)
        self.attached: dict[tuple[Stage, IterVar], list[Stage]] = defaultdict(list)
        for stage in self.live:
            if stage.attach == "at":
                assert stage.attach_stage is not None and stage.attach_ivar is not None
                self.attached[(stage.attach_stage, stage.attach_ivar)].append(stage)

    def build(self) -> LoopNest:
        roots = [s for s in self.live if s.attach == "root"]
        body = seq(*(self.stage(s) for s in roots))
        for stage in reversed(roots):
            st = self.storage[stage.tensor]
            if not st.is_param:
                body = Allocate(st.buffer, body, stage.double_buffered, stage.stage_registers)
        return LoopNest(body, self.params)

    # -- one stage --------------------------------------------------------------------------------

    def stage(self, stage: Stage) -> Stmt:
        from compiler.lower.tensorize import (  # tensorize imports this module
            tensorized_body,
            tensorized_init,
        )

        op = stage.op
        b = self.bounds[stage]
        leaves = stage.leaf_iter_vars
        local = local_values(stage, b.extent)
        values: dict[IterVar, E.Expr] = {}
        for axis in (*op.axis, *op.reduce_axis):
            lo = b.lo.get(axis)
            values[axis] = local[axis] if lo is None or _is_zero(lo) else lo + local[axis]
        position = {leaf: i for i, leaf in enumerate(leaves)}
        # A loop bound to a launch axis keeps its constant extent (the launch dimension): its
        # tail is a guard. A virtual thread is a loop like any other (a min() extent is fine).
        launched = {
            v for v, tag in stage.thread_tags.items() if tag.startswith(("blockIdx", "threadIdx"))
        }
        extents: dict[IterVar, E.Expr] = {}
        guards: list[E.Expr] = []
        for rel in stage.relations:
            if not isinstance(rel, Split):
                continue
            parent_ext, factor = b.extent[rel.parent], b.extent[rel.inner]
            if parent_ext % factor == 0:
                continue
            outer_vars = E.free_vars(local[rel.outer])
            if (
                rel.inner in position
                and rel.inner not in launched
                and all(
                    position[leaf] < position[rel.inner]
                    for leaf in leaves
                    if leaf.var in outer_vars
                )
            ):
                rest = E.IntImm(parent_ext) - local[rel.outer] * factor
                extents[rel.inner] = E.Min(E.IntImm(factor), rest)
            else:
                guards.append(E.LT(local[rel.parent], E.IntImm(parent_ext)))
        for d, axis in enumerate(op.axis):
            lo, n = b.lo[axis], stage.tensor.shape[d]
            top = const_bounds(lo, self.ranges)
            if top is not None and top[1] + b.extent[axis] <= n:
                continue  # the region never runs past the tensor's end
            if axis in position and axis not in extents and axis not in launched:
                extents[axis] = E.Min(E.IntImm(b.extent[axis]), E.IntImm(n) - lo)
            else:
                guards.append(E.LT(values[axis], E.IntImm(n)))

        subst = {axis.var: values[axis] for axis in (*op.axis, *op.reduce_axis)}
        out = self.storage[stage.tensor]
        index = self.indices(out, [values[a] for a in op.axis], [local[a] for a in op.axis])

        def nest(
            loops: Sequence[IterVar], body: Stmt, conds: Sequence[E.Expr], attach: bool
        ) -> Stmt:
            return self.nest(stage, loops, body, conds, extents, attach)

        if thread_reduce_leaf(stage) is not None:  # a reduce loop bound to threads
            return lower_allreduce(self, stage, extents, guards, subst, out.buffer, index)

        at = next((i for i, leaf in enumerate(leaves) if leaf in stage.tensorized), None)
        if at is not None:
            reset, update = tensorized_body(self, stage, at, values, subst, out, index)
            inside = {leaf.var for leaf in leaves[at:]}
            if any(E.free_vars(g) & inside for g in guards):
                raise LowerError(
                    f"stage {stage.name}: tensorize at axis {leaves[at].name} needs loops that "
                    "divide their axes exactly (a tail would need a guard inside the intrinsic)"
                )
            if reset is not None:
                return nest(leaves[:at], seq(reset, update), guards, True)
            if not isinstance(op.body, Reduce):  # a copy intrinsic
                return nest(leaves[:at], update, guards, True)
            first = next(i for i, leaf in enumerate(leaves) if leaf.kind is IterKind.REDUCE)
            if out.buffer.scope in WMMA_SCOPES:  # opaque: only the intrinsic writes it
                init_nest = nest(
                    [v for v in leaves[first:at] if v.kind is IterKind.DATA],
                    tensorized_init(self, stage, at, out, index),
                    [],
                    False,
                )
            else:
                init = BufferStore(out.buffer, index, op.body.identity())
                init_nest = nest(
                    [v for v in leaves[first:] if v.kind is IterKind.DATA], init, [], False
                )
            body = seq(init_nest, nest(leaves[first:at], update, [], True))
            return nest(leaves[:first], body, guards, True)

        if not isinstance(op.body, Reduce):
            store = BufferStore(out.buffer, index, self.to_ir(op.body, subst, stage))
            return nest(leaves, store, guards, True)

        reduce = op.body
        source = self.to_ir(reduce.source, subst, stage)
        acc = E.BufferLoad(out.buffer, index)
        update = BufferStore(out.buffer, index, reduce.combine(acc, source))
        init = BufferStore(out.buffer, index, reduce.identity())
        first_reduce = next(i for i, leaf in enumerate(leaves) if leaf.kind is IterKind.REDUCE)
        outer, inner = leaves[:first_reduce], leaves[first_reduce:]
        outer_vars = {leaf.var for leaf in outer}
        data_vars = {leaf.var for leaf in leaves if leaf.kind is IterKind.DATA}
        bound_outside = set(self.ranges) - {leaf.var for leaf in leaves}
        outer_guards = [g for g in guards if E.free_vars(g) <= outer_vars | bound_outside]
        inner_guards = [g for g in guards if g not in outer_guards]
        init_nest = nest(
            [leaf for leaf in inner if leaf.kind is IterKind.DATA],
            init,
            [g for g in inner_guards if E.free_vars(g) <= data_vars | bound_outside],
            False,
        )
        return nest(
            outer, seq(init_nest, nest(inner, update, inner_guards, True)), outer_guards, True
        )

    def nest(
        self,
        stage: Stage,
        loops: Sequence[IterVar],
        body: Stmt,
        conds: Sequence[E.Expr],
        extents: dict[IterVar, E.Expr],
        attach: bool,
    ) -> Stmt:
        """`loops` around `body`, each condition inside the innermost loop it reads, and the
        stages attached to each loop at the start of its body."""
        position = {leaf.var: i for i, leaf in enumerate(loops)}
        at: dict[int, list[E.Expr]] = defaultdict(list)
        for cond in conds:
            at[max((position[v] for v in E.free_vars(cond) if v in position), default=-1)].append(
                cond
            )
        stmt = _guard(body, at[len(loops) - 1])
        for i in range(len(loops) - 1, -1, -1):
            leaf = loops[i]
            if attach:
                stmt = self.with_attached(stage, leaf, stmt)
            extent = extents.get(leaf, E.IntImm(self.bounds[stage].extent[leaf]))
            tag = stage.thread_tags.get(leaf, "")
            kind = ForKind.THREAD_BINDING if tag else stage.kinds.get(leaf, ForKind.SERIAL)
            pragmas = tuple(stage.pragmas.get(leaf, ()))
            stmt = For(leaf.var, extent, kind, stmt, tag, pragmas)
            stmt = _guard(stmt, at[i - 1])
        return stmt

    def with_attached(self, stage: Stage, leaf: IterVar, inner: Stmt) -> Stmt:
        producers = self.attached.get((stage, leaf))
        if not producers:
            return inner
        parts: list[Stmt] = []
        shared = False
        for p in producers:
            parts.append(self.stage(p))
            if p.scope == "shared":
                parts.append(Barrier())
                shared = True
        parts.append(inner)
        if shared and leaf not in stage.thread_tags:
            parts.append(Barrier())  # the next iteration must not overwrite what is still read
        stmt = seq(*parts)
        for p in reversed(producers):
            st = self.storage[p.tensor]
            if not st.is_param:
                stmt = Allocate(st.buffer, stmt, p.double_buffered, p.stage_registers)
        return stmt

    # -- expressions ------------------------------------------------------------------------------

    def indices(
        self, st: _Storage, absolute: list[E.Expr], local: list[E.Expr] | None = None
    ) -> tuple[E.Expr, ...]:
        """Indices into `st`'s buffer for absolute tensor indices (`local` when they are known)."""
        if local is not None and not st.is_param:
            return tuple(local)
        rel = [a if _is_zero(lo) else a - lo for a, lo in zip(absolute, st.lo, strict=True)]
        if st.buffer.scope == "local":
            # A dimension of one element is indexed 0: a region that spans a whole dimension
            # keeps absolute indices (a block index whose grid is one block), which a GPU
            # compiler cannot prove constant, so a register tile indexed by them would spill.
            rel = [E.IntImm(0) if n == 1 else i for i, n in zip(rel, st.buffer.shape, strict=True)]
        return tuple(rel)

    def to_ir(self, e: E.Expr, subst: dict[E.Var, E.Expr], stage: Stage) -> E.Expr:
        """A tensor expression as loop IR: axis variables replaced, tensor reads as buffer loads."""
        if isinstance(e, TensorLoad):
            st = self.storage.get(e.tensor)
            if st is None:
                what = "input" if isinstance(e.tensor.op, PlaceholderOp) else "tensor"
                raise LowerError(
                    f"stage {stage.name}: {what} {e.tensor.name} is not among the function's "
                    "arguments"
                )
            idx = [self.to_ir(i, subst, stage) for i in e.indices]
            return E.BufferLoad(st.buffer, self.indices(st, idx))
        if isinstance(e, E.Var):
            return subst.get(e, e)
        if isinstance(e, Reduce):
            raise LowerError(f"stage {stage.name}: a reduction must be the whole body")
        kids = E.children(e)
        if not kids:
            return e
        return E.rebuild(e, [self.to_ir(k, subst, stage) for k in kids])


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 1
    while out in taken:
        out, n = f"{name}_{n}", n + 1
    taken.add(out)
    return out


def _is_zero(e: E.Expr) -> bool:
    return isinstance(e, E.IntImm) and e.value == 0


def _guard(stmt: Stmt, conds: list[E.Expr]) -> Stmt:
    if not conds:
        return stmt
    cond = conds[0]
    for more in conds[1:]:
        cond = E.And(cond, more)
    return IfThenElse(cond, stmt)

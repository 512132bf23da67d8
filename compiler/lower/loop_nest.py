"""Lower a schedule to a PrimFunc: one loop nest per stage, from its leaf loops and split relations.

Bound inference is trivial here (every stage computes its whole tensor). A split that does not
divide its axis leaves points past the end; the inner loop's extent is cut to
`min(factor, extent - outer * factor)` when the inner loop sits inside every loop its outer part
depends on, which keeps the hot loop free of branches, and an `if` guard covers the other cases.
A reduction gets its accumulator set to the identity just before the first reduction loop, inside
the data loops that enclose that loop and over the data loops nested within it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from compiler.errors import LowerError
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import For, ForKind, IfThenElse, Stmt, Store, seq
from compiler.schedule.schedule import Schedule, Stage
from compiler.te.tensor import IterKind, IterVar, Reduce, Tensor, TensorLoad


def lower(sch: Schedule, args: Sequence[Tensor], name: str) -> PrimFunc:
    """The PrimFunc `name` computing every stage of `sch`, with one parameter per tensor of `args`.

    Raises:
        LowerError: a stage reads or writes a tensor missing from `args`, or names repeat.
    """
    buffers = {t: Buffer(t.name, t.shape, t.dtype) for t in args}
    names = [t.name for t in args]
    if len(set(names)) != len(names) or len(buffers) != len(args):
        raise LowerError(f"{name}: argument tensors and their names must be distinct, got {names}")
    body = seq(*(_lower_stage(stage, buffers) for stage in sch.stages))
    return PrimFunc(name, tuple(buffers[t] for t in args), body)


def _lower_stage(stage: Stage, buffers: dict[Tensor, Buffer]) -> Stmt:
    op = stage.op
    leaves = stage.leaf_iter_vars
    values: dict[IterVar, E.Expr] = {leaf: leaf.var for leaf in leaves}
    for rel in reversed(stage.relations):  # children were split after their parents
        values[rel.parent] = values[rel.outer] * rel.factor + values[rel.inner]

    position = {leaf: i for i, leaf in enumerate(leaves)}
    extents: dict[IterVar, E.Expr] = {}
    guards: list[E.Expr] = []
    for rel in stage.relations:
        if rel.exact:
            continue
        outer_vars = E.free_vars(values[rel.outer])
        if rel.inner in position and all(
            position[leaf] < position[rel.inner] for leaf in leaves if leaf.var in outer_vars
        ):
            rest = E.IntImm(rel.parent.extent) - values[rel.outer] * rel.factor
            extents[rel.inner] = E.Min(E.IntImm(rel.factor), rest)
        else:
            guards.append(E.LT(values[rel.parent], E.IntImm(rel.parent.extent)))

    subst = {axis.var: values[axis] for axis in (*op.axis, *op.reduce_axis)}
    out = _buffer(buffers, stage.tensor, op.name)
    index = _flatten(out, [values[axis] for axis in op.axis])

    def nest(loops: Sequence[IterVar], body: Stmt, conds: Sequence[E.Expr]) -> Stmt:
        return _nest(loops, body, conds, extents, stage)

    if not isinstance(op.body, Reduce):
        return nest(leaves, Store(out, index, _to_ir(op.body, subst, buffers, op.name)), guards)

    source = _to_ir(op.body.source, subst, buffers, op.name)
    update = Store(out, index, E.Load(out, index) + source)
    init = Store(out, index, op.body.identity())
    first_reduce = next(i for i, leaf in enumerate(leaves) if leaf.kind is IterKind.REDUCE)
    outer, inner = leaves[:first_reduce], leaves[first_reduce:]
    outer_vars = {leaf.var for leaf in outer}
    data_vars = {leaf.var for leaf in leaves if leaf.kind is IterKind.DATA}
    outer_guards = [g for g in guards if E.free_vars(g) <= outer_vars]
    inner_guards = [g for g in guards if not E.free_vars(g) <= outer_vars]
    init_nest = nest(
        [leaf for leaf in inner if leaf.kind is IterKind.DATA],
        init,
        [g for g in inner_guards if E.free_vars(g) <= data_vars],
    )
    return nest(outer, seq(init_nest, nest(inner, update, inner_guards)), outer_guards)


def _nest(
    loops: Sequence[IterVar],
    body: Stmt,
    conds: Sequence[E.Expr],
    extents: dict[IterVar, E.Expr],
    stage: Stage,
) -> Stmt:
    """`loops` around `body`, each condition placed inside the innermost loop it reads."""
    position = {leaf.var: i for i, leaf in enumerate(loops)}
    at: dict[int, list[E.Expr]] = defaultdict(list)
    for cond in conds:
        at[max((position[v] for v in E.free_vars(cond) if v in position), default=-1)].append(cond)
    stmt = _guard(body, at[len(loops) - 1])
    for i in range(len(loops) - 1, -1, -1):
        leaf = loops[i]
        extent = extents.get(leaf, E.IntImm(leaf.extent))
        stmt = For(leaf.var, extent, stage.kinds.get(leaf, ForKind.SERIAL), stmt)
        stmt = _guard(stmt, at[i - 1])
    return stmt


def _guard(stmt: Stmt, conds: list[E.Expr]) -> Stmt:
    if not conds:
        return stmt
    cond = conds[0]
    for more in conds[1:]:
        cond = E.And(cond, more)
    return IfThenElse(cond, stmt)


def _to_ir(
    e: E.Expr, subst: dict[E.Var, E.Expr], buffers: dict[Tensor, Buffer], stage: str
) -> E.Expr:
    """A tensor expression as loop IR: axis variables replaced, tensor reads flattened to loads."""
    if isinstance(e, TensorLoad):
        buf = _buffer(buffers, e.tensor, stage)
        return E.Load(buf, _flatten(buf, [_to_ir(i, subst, buffers, stage) for i in e.indices]))
    if isinstance(e, E.Var):
        return subst.get(e, e)
    if isinstance(e, E.IntImm | E.FloatImm):
        return e
    if isinstance(e, E.BinaryOp):
        return type(e)(_to_ir(e.a, subst, buffers, stage), _to_ir(e.b, subst, buffers, stage))
    if isinstance(e, E.Load):
        return E.Load(e.buffer, _to_ir(e.index, subst, buffers, stage))
    raise LowerError(f"stage {stage}: cannot lower {type(e).__name__} here ({e!r})")


def _buffer(buffers: dict[Tensor, Buffer], tensor: Tensor, stage: str) -> Buffer:
    if tensor not in buffers:
        # Intermediate buffers need allocation and memory planning, which come with later stages.
        raise LowerError(
            f"stage {stage}: tensor {tensor.name} is not among the function's arguments"
        )
    return buffers[tensor]


def _flatten(buf: Buffer, indices: Sequence[E.Expr]) -> E.Expr:
    """The row-major flat offset of `indices` into `buf`."""
    flat: E.Expr | None = None
    for index, stride in zip(indices, buf.strides, strict=True):
        term = index if stride == 1 else index * stride
        flat = term if flat is None else flat + term
    return flat if flat is not None else E.IntImm(0)

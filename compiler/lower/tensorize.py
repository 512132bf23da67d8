"""Tensorize: replace the loops from a tensorized axis inward by calls of a tensor intrinsic.

The loops inside the tensorized axis must match the intrinsic's axes one to one (same kind and
extent, in order: data axes then reduction axes), and the stage must read as many tensors as the
intrinsic. Each operand's region is passed as its first element (the loops inside set to 0) and
one stride per intrinsic dimension, read off the linear form of the flat index. When the stage's
reduction starts inside the tensorized loops the intrinsic's reset part runs first; otherwise the
accumulator is initialised by an ordinary loop nest and only the update part is called, unless
the accumulator is opaque (a WMMA fragment, `compiler.ir.buffer.WMMA_SCOPES`): element stores
cannot reach it, so its initialisation is the reset part too, called over the data loops between
the first reduction loop and the tensorized ones (`tensorized_init`).

A stage without a reduction (a copy, such as loading a fragment from shared memory) matches an
intrinsic without one: its loops are replaced by the intrinsic's update part alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.arith import linear_form, simplify
from compiler.errors import LowerError
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.stmt import IntrinCall, Stmt, seq
from compiler.schedule.intrin import TensorIntrin
from compiler.schedule.schedule import Stage
from compiler.te.tensor import IterVar, Reduce, TensorLoad, walk

if TYPE_CHECKING:
    from compiler.lower.loop_nest import _Builder, _Storage


def tensorized_body(
    builder: _Builder,
    stage: Stage,
    at: int,
    values: dict[IterVar, E.Expr],
    subst: dict[E.Var, E.Expr],
    out: _Storage,
    index: tuple[E.Expr, ...],
) -> tuple[Stmt | None, Stmt]:
    """(reset call or None, update call) for `stage` tensorized at leaf position `at`.

    Raises:
        LowerError: the loops or the formula do not match the intrinsic.
    """
    leaves = stage.leaf_iter_vars[at:]
    intrin = stage.tensorized[leaves[0]]
    axes = (*intrin.op.axis, *intrin.op.reduce_axis)
    extent = builder.bounds[stage].extent
    for leaf, ax in zip(leaves, axes, strict=True):
        if leaf.kind is not ax.kind or extent[leaf] != ax.extent:
            raise LowerError(
                f"stage {stage.name}: tensorize {intrin.name}: loop {leaf.name} "
                f"({leaf.kind.value}, {extent[leaf]}) does not match intrinsic axis {ax.name} "
                f"({ax.kind.value}, {ax.extent})"
            )
    body = stage.op.body
    reduces = isinstance(intrin.op.body, Reduce)
    if reduces and (not isinstance(body, Reduce) or body.combiner != "sum"):
        raise LowerError(f"stage {stage.name}: tensorize {intrin.name} needs a sum reduction")
    if not reduces and isinstance(body, Reduce):
        raise LowerError(
            f"stage {stage.name}: tensorize {intrin.name}, which has no reduction, on a reduction"
        )
    source = body.source if isinstance(body, Reduce) else body
    leaf_of = {ax.var: leaf.var for ax, leaf in zip(axes, leaves, strict=True)}
    zero: dict[E.Var, E.Expr] = {leaf.var: E.IntImm(0) for leaf in leaves}

    def region(
        buf: Buffer, idx: tuple[E.Expr, ...], dims: list[E.Var]
    ) -> tuple[Buffer, E.Expr, tuple[int, ...]]:
        flat: E.Expr = E.IntImm(0)
        for i, s in zip(idx, buf.strides, strict=True):
            flat = flat + i * s
        flat = simplify(flat)
        strides = []
        for v in dims:
            form = linear_form(flat, leaf_of[v])
            if form is None:
                raise LowerError(
                    f"stage {stage.name}: tensorize {intrin.name}: {buf.name}'s index is not "
                    f"linear in loop {leaf_of[v].name}"
                )
            strides.append(form[0])
        return buf, simplify(E.substitute(flat, zero)), tuple(strides)

    out_dims = [ax.var for ax in intrin.op.axis]
    operands = [region(out.buffer, index, out_dims)]
    shapes = [intrin.output.shape]
    stage_reads = [n for n in walk(source) if isinstance(n, TensorLoad)]
    intrin_reads = [n for n in walk(intrin.op.body) if isinstance(n, TensorLoad)]
    if len(stage_reads) != len(intrin_reads):
        raise LowerError(
            f"stage {stage.name}: tensorize {intrin.name}: the stage reads {len(stage_reads)} "
            f"tensors, the intrinsic {len(intrin_reads)}"
        )
    pairs = sorted(
        zip(stage_reads, intrin_reads, strict=True),
        key=lambda pair: intrin.inputs.index(pair[1].tensor),
    )
    for mine, theirs in pairs:
        load = builder.to_ir(mine, subst, stage)
        assert isinstance(load, E.BufferLoad)
        dims = []
        for i in theirs.indices:
            if not isinstance(i, E.Var) or i not in leaf_of:
                raise LowerError(f"intrinsic {intrin.name}: reads must index by its axes")
            dims.append(i)
        operands.append(region(load.buffer, load.indices, dims))
        shapes.append(theirs.tensor.shape)
    update = _call(intrin, intrin.update, operands, shapes, intrin.emulate_update)
    if not reduces:
        return None, update
    first_reduce = next(
        i for i, leaf in enumerate(stage.leaf_iter_vars) if leaf.kind.value == "reduce"
    )
    if first_reduce < at:
        return None, update
    if intrin.reset is None or intrin.emulate_reset is None:
        raise LowerError(
            f"stage {stage.name}: tensorize {intrin.name} covers the whole reduction but the "
            "intrinsic has no reset part"
        )
    reset = _call(intrin, intrin.reset, operands[:1], shapes[:1], intrin.emulate_reset)
    return reset, update


def tensorized_init(
    builder: _Builder, stage: Stage, at: int, out: _Storage, index: tuple[E.Expr, ...]
) -> Stmt:
    """The reset call initialising the output region of `stage`'s intrinsic at leaf `at`, for an
    accumulator that only the intrinsic can write (the caller loops it over the data loops
    between the first reduction loop and `at`).

    Raises:
        LowerError: the intrinsic has no reset part, or the output's index is not linear.
    """
    leaves = stage.leaf_iter_vars[at:]
    intrin = stage.tensorized[leaves[0]]
    if intrin.reset is None or intrin.emulate_reset is None:
        raise LowerError(
            f"stage {stage.name}: tensorize {intrin.name}: the accumulator {out.buffer.name} "
            f"({out.buffer.scope}) is opaque and the intrinsic has no reset part to initialise it"
        )
    axes = intrin.op.axis
    flat: E.Expr = E.IntImm(0)
    for i, st in zip(index, out.buffer.strides, strict=True):
        flat = flat + i * st
    flat = simplify(flat)
    strides = []
    for leaf in leaves[: len(axes)]:
        form = linear_form(flat, leaf.var)
        if form is None:
            raise LowerError(
                f"stage {stage.name}: tensorize {intrin.name}: {out.buffer.name}'s index is not "
                f"linear in loop {leaf.name}"
            )
        strides.append(form[0])
    zero: dict[E.Var, E.Expr] = {leaf.var: E.IntImm(0) for leaf in leaves}
    operand = (out.buffer, simplify(E.substitute(flat, zero)), tuple(strides))
    return _call(intrin, intrin.reset, [operand], [intrin.output.shape], intrin.emulate_reset)


def _call(
    intrin: TensorIntrin,
    fname: str,
    operands: list[tuple[Buffer, E.Expr, tuple[int, ...]]],
    shapes: list[tuple[int, ...]],
    emulate: object,
) -> Stmt:
    return seq(
        IntrinCall(fname, tuple(operands), tuple(shapes), intrin.c_source, emulate)  # type: ignore[arg-type]
    )

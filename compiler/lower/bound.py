"""Bound inference: the region of each stage's tensor that must exist where the stage is placed.

A root stage computes its whole tensor. A stage attached at loop `ax` of stage S computes, in each
iteration of `ax`, the region its readers use in that iteration: every read of it is relaxed over
the loops that run inside `ax` (the readers' own loops, S's loops inside `ax`, and the loops of any
stage between them) by interval analysis. A region is [lo, lo + extent) per dimension, with `lo`
an expression of the loops outside the attach point and `extent` a constant; when the analysis
cannot bound a read it takes the whole dimension. The region may run past the tensor's end (a
reader's non-dividing split): lowering then cuts or guards the producer's loops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from compiler.arith import simplify, symbolic_interval
from compiler.arith.canonical import from_sum, to_sum
from compiler.errors import LowerError
from compiler.ir import expr as E
from compiler.schedule.schedule import Fuse, Schedule, Split, Stage
from compiler.te.tensor import IterVar, Tensor, TensorLoad, walk


@dataclass
class StageBounds:
    """Where a stage's loops run: region starts of its data axes and every loop's extent."""

    lo: dict[IterVar, E.Expr] = field(default_factory=dict)
    extent: dict[IterVar, int] = field(default_factory=dict)


def infer_bounds(sch: Schedule) -> dict[Stage, StageBounds]:
    """Bounds of every non-inlined stage of `sch`.

    Raises:
        LowerError: a stage attached inside a loop is also read outside that loop.
    """
    result: dict[Stage, StageBounds] = {}
    live = [s for s in sch.stages if s.attach != "inline"]
    for stage in reversed(live):  # readers before the stages they read
        bounds = StageBounds()
        if stage.attach == "at":
            region = _region(stage, live, result)
        else:
            region = [(E.IntImm(0), n) for n in stage.tensor.shape]
        for axis, (lo, ext) in zip(stage.op.axis, region, strict=True):
            bounds.lo[axis] = lo
            bounds.extent[axis] = ext
        for axis in stage.op.reduce_axis:
            bounds.extent[axis] = axis.extent
        _propagate_extents(stage, bounds.extent)
        result[stage] = bounds
    return result


def local_values(stage: Stage, extents: dict[IterVar, int]) -> dict[IterVar, E.Expr]:
    """Each root axis of `stage` (and each intermediate one) as an expression of its leaf loops."""
    values: dict[IterVar, E.Expr] = {leaf: leaf.var for leaf in stage.leaf_iter_vars}
    for rel in reversed(stage.relations):
        if isinstance(rel, Split):
            values[rel.parent] = values[rel.outer] * rel.factor + values[rel.inner]
        else:
            inner_ext = E.IntImm(extents[rel.inner])
            values[rel.outer] = E.FloorDiv(values[rel.fused], inner_ext)
            values[rel.inner] = E.FloorMod(values[rel.fused], inner_ext)
    return values


def _propagate_extents(stage: Stage, ext: dict[IterVar, int]) -> None:
    for rel in stage.relations:
        if isinstance(rel, Split):
            parent = ext[rel.parent]
            ext[rel.inner] = min(rel.factor, parent)
            ext[rel.outer] = math.ceil(parent / rel.factor)
        else:
            assert isinstance(rel, Fuse)
            ext[rel.fused] = ext[rel.outer] * ext[rel.inner]


def _chain_vars(
    reader: Stage,
    target: Stage,
    ax: IterVar,
    bounds: dict[Stage, StageBounds],
    shared: bool = False,
) -> dict[E.Var, tuple[E.Expr, int]] | None:
    """Loops that vary within one iteration of `target`'s loop `ax` around `reader`, or None if
    `reader` does not run inside that loop."""
    relaxed: dict[E.Var, tuple[E.Expr, int]] = {}
    pos = target.leaf_iter_vars.index(ax)
    for leaf in target.leaf_iter_vars[pos + 1 :]:
        relaxed[leaf.var] = (E.IntImm(0), bounds[target].extent[leaf])
    if shared:
        # A shared buffer serves every thread of the block: relax the thread axes around it too,
        # those of the stages `target` is itself computed inside included (a register tile
        # attached at a thread loop of the output).
        outer: Stage | None = target
        leaves = target.leaf_iter_vars[: pos + 1]
        while outer is not None:
            for leaf in leaves:
                if outer.thread_tags.get(leaf, "").startswith("threadIdx"):
                    relaxed[leaf.var] = (E.IntImm(0), bounds[outer].extent[leaf])
            if outer.attach != "at" or outer.attach_stage is None:
                break
            at_ivar = outer.attach_ivar
            outer = outer.attach_stage
            assert at_ivar is not None
            leaves = outer.leaf_iter_vars[: outer.leaf_iter_vars.index(at_ivar) + 1]
    current = reader
    while current is not target:
        for leaf in current.leaf_iter_vars:
            relaxed[leaf.var] = (E.IntImm(0), bounds[current].extent[leaf])
        if current.attach != "at" or current.attach_stage is None:
            return None
        parent, at = current.attach_stage, current.attach_ivar
        if parent is target:
            assert at is not None
            if target.leaf_iter_vars.index(at) < pos:
                return None
            return relaxed
        current = parent
    return relaxed


def _region(
    stage: Stage, live: list[Stage], bounds: dict[Stage, StageBounds]
) -> list[tuple[E.Expr, int]]:
    target, ax = stage.attach_stage, stage.attach_ivar
    assert target is not None and ax is not None
    tensor = stage.tensor
    shape = tensor.shape
    region: list[tuple[E.Expr, int] | None] = [None] * len(shape)
    whole = [False] * len(shape)
    for reader in live:
        if reader is stage or tensor not in reader.op.inputs:
            continue
        relaxed = _chain_vars(reader, target, ax, bounds, stage.scope == "shared")
        if relaxed is None:
            raise LowerError(
                f"stage {stage.name} is computed at {target.name}.{ax.name}, but stage "
                f"{reader.name} reads it outside that loop"
            )
        axis_dom = _axis_domains(reader, bounds[reader], relaxed)
        for node in walk(reader.op.body):
            if not isinstance(node, TensorLoad) or node.tensor is not tensor:
                continue
            for d, index in enumerate(node.indices):
                iv = symbolic_interval(index, axis_dom)
                if iv is None:
                    whole[d] = True
                    continue
                merged = _union(region[d], iv)
                if merged is None:
                    whole[d] = True
                region[d] = merged
    out: list[tuple[E.Expr, int]] = []
    for d, n in enumerate(shape):
        r = region[d]
        if whole[d] or r is None or r[1] >= n:
            out.append((E.IntImm(0), n))
        else:
            out.append((simplify(r[0]), r[1]))
    return out


def _axis_domains(
    reader: Stage, rb: StageBounds, relaxed: dict[E.Var, tuple[E.Expr, int]]
) -> dict[E.Var, tuple[E.Expr, int]]:
    """Interval of each op axis variable of `reader` over the relaxed loops."""
    values = local_values(reader, rb.extent)
    dom: dict[E.Var, tuple[E.Expr, int]] = {}
    for axis in (*reader.op.axis, *reader.op.reduce_axis):
        value = values[axis]
        if axis in rb.lo:
            value = rb.lo[axis] + value
        iv = symbolic_interval(value, relaxed)
        dom[axis.var] = iv if iv is not None else (E.IntImm(0), axis.extent)
    return dom


def _union(a: tuple[E.Expr, int] | None, b: tuple[E.Expr, int]) -> tuple[E.Expr, int] | None:
    if a is None:
        return b
    diff = to_sum(b[0])
    diff.add(to_sum(a[0]), -1)
    delta = from_sum(diff)
    if not isinstance(delta, E.IntImm):
        return None  # unrelated starts: the caller takes the whole dimension
    d = delta.value
    lo = a[0] if d >= 0 else b[0]
    hi = max(a[1], d + b[1]) if d >= 0 else max(b[1], a[1] - d)
    return lo, hi


def reads_of(tensor: Tensor, stage: Stage) -> list[TensorLoad]:
    """Every read of `tensor` in `stage`'s formula."""
    return [n for n in walk(stage.op.body) if isinstance(n, TensorLoad) and n.tensor is tensor]

"""Schedules: per compute stage, how its loops are split, ordered and annotated.

A stage starts with one leaf loop per axis of its op (data axes, then reduction axes). `split`
replaces a leaf by an (outer, inner) pair and records the relation; lowering rebuilds each original
axis from the leaves through those relations. Annotations change how a leaf loop is run, never what
it computes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.errors import ScheduleError
from compiler.ir import expr as E
from compiler.ir.stmt import ForKind
from compiler.te.tensor import ComputeOp, IterKind, IterVar, Tensor


@dataclass(frozen=True, eq=False)
class Split:
    """parent = outer * factor + inner; inner runs over [0, factor), outer over ceil(extent/factor)."""

    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: int

    @property
    def exact(self) -> bool:
        """Whether the split covers the parent with no points past its end (no guard needed)."""
        return self.parent.extent % self.factor == 0


class Stage:
    """The schedule of one compute tensor."""

    def __init__(self, tensor: Tensor) -> None:
        assert isinstance(tensor.op, ComputeOp)
        self.tensor = tensor
        self.op: ComputeOp = tensor.op
        self.leaf_iter_vars: list[IterVar] = [*self.op.axis, *self.op.reduce_axis]
        self.relations: list[Split] = []
        self.kinds: dict[IterVar, ForKind] = {}

    @property
    def axis(self) -> tuple[IterVar, ...]:
        """The op's data axes, as created by compute."""
        return self.op.axis

    @property
    def reduce_axis(self) -> tuple[IterVar, ...]:
        return self.op.reduce_axis

    def split(self, axis: IterVar, factor: int) -> tuple[IterVar, IterVar]:
        """Split leaf `axis` into (outer, inner) with inner extent `factor` (capped at the extent)."""
        pos = self._leaf_position(axis, "split")
        if axis in self.kinds:
            # Whether outer or inner should inherit it is the caller's intent, not ours to guess.
            raise ScheduleError(
                f"stage {self.op.name}: split of axis {axis.name}, already {self.kinds[axis].value}: "
                "split first, then annotate"
            )
        if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
            raise ScheduleError(
                f"stage {self.op.name}: split of axis {axis.name} by {factor!r}: factor must be an int >= 1"
            )
        # A factor past the extent would only add iterations that the guard throws away.
        factor = min(factor, axis.extent)
        outer = IterVar(E.Var(f"{axis.name}_o"), math.ceil(axis.extent / factor), axis.kind)
        inner = IterVar(E.Var(f"{axis.name}_i"), factor, axis.kind)
        self.relations.append(Split(axis, outer, inner, factor))
        self.leaf_iter_vars[pos : pos + 1] = [outer, inner]
        return outer, inner

    def reorder(self, *axes: IterVar) -> None:
        """Put `axes` in this order, in the loop positions they occupy now; other loops stay."""
        positions = [self._leaf_position(a, "reorder") for a in axes]
        if len(set(positions)) != len(positions):
            names = [a.name for a in axes]
            raise ScheduleError(f"stage {self.op.name}: reorder names an axis twice: {names}")
        for pos, axis in zip(sorted(positions), axes, strict=True):
            self.leaf_iter_vars[pos] = axis

    def vectorize(self, axis: IterVar) -> None:
        """Run the iterations of `axis` as SIMD lanes; it must be a data axis."""
        self._annotate(axis, ForKind.VECTORIZED)

    def unroll(self, axis: IterVar) -> None:
        self._annotate(axis, ForKind.UNROLLED)

    def parallel(self, axis: IterVar) -> None:
        """Let the iterations of `axis` run on several threads; it must be a data axis."""
        self._annotate(axis, ForKind.PARALLEL)

    def _annotate(self, axis: IterVar, kind: ForKind) -> None:
        self._leaf_position(axis, kind.value)
        if axis.kind is IterKind.REDUCE and kind in (ForKind.VECTORIZED, ForKind.PARALLEL):
            # Reduction iterations write the same element, so running them together would race.
            raise ScheduleError(
                f"stage {self.op.name}: cannot {kind.value} reduction axis {axis.name}"
            )
        self.kinds[axis] = kind

    def _leaf_position(self, axis: object, primitive: str) -> int:
        for pos, leaf in enumerate(self.leaf_iter_vars):
            if leaf is axis:
                return pos
        name = axis.name if isinstance(axis, IterVar) else repr(axis)
        leaves = [leaf.name for leaf in self.leaf_iter_vars]
        raise ScheduleError(
            f"stage {self.op.name}: {primitive} of axis {name}, which is not a loop of this stage "
            f"(loops: {leaves})"
        )

    def __repr__(self) -> str:
        loops = ", ".join(
            f"{leaf.name}:{self.kinds.get(leaf, ForKind.SERIAL).value}"
            for leaf in self.leaf_iter_vars
        )
        return f"Stage({self.op.name}: {loops})"


class Schedule:
    """Stages of every compute tensor that the outputs depend on, producers first."""

    def __init__(self, outputs: Sequence[Tensor]) -> None:
        self.outputs = tuple(outputs)
        self.stages: list[Stage] = []
        self._by_tensor: dict[Tensor, Stage] = {}
        for tensor in _post_order(self.outputs):
            stage = Stage(tensor)
            self.stages.append(stage)
            self._by_tensor[tensor] = stage

    def __getitem__(self, tensor: Tensor) -> Stage:
        if tensor not in self._by_tensor:
            raise ScheduleError(
                f"{tensor.name} has no stage in this schedule (placeholder or unrelated)"
            )
        return self._by_tensor[tensor]


def create_schedule(outputs: Tensor | Sequence[Tensor]) -> Schedule:
    """A schedule with default loops (one per axis, in order, serial) for `outputs` and their producers."""
    return Schedule((outputs,) if isinstance(outputs, Tensor) else tuple(outputs))


def _post_order(outputs: Sequence[Tensor]) -> list[Tensor]:
    order: list[Tensor] = []
    seen: set[Tensor] = set()

    def visit(t: Tensor) -> None:
        if t in seen or not isinstance(t.op, ComputeOp):
            return
        seen.add(t)
        for producer in t.op.inputs:
            visit(producer)
        order.append(t)

    for out in outputs:
        if not isinstance(out.op, ComputeOp):
            raise ScheduleError(
                f"{out.name} is a placeholder; only compute tensors can be scheduled"
            )
        visit(out)
    return order

"""Schedules: per compute stage, how its loops are split, fused, ordered, annotated and placed.

A stage starts with one leaf loop per axis of its op (data axes, then reduction axes). `split`
replaces a leaf by an (outer, inner) pair and `fuse` two adjacent leaves by one, recording the
relation; lowering rebuilds each original axis from the leaves through those relations.
Annotations (vectorize, unroll, parallel, bind, pragma, tensorize) change how a leaf loop runs,
never what it computes. Placement (`compute_at`, `compute_inline`, `compute_root`) says where a
producer's loops go; `cache_read` / `cache_write` add stages that copy through a faster scope.
Every malformed request raises ScheduleError naming the stage and the axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.errors import ScheduleError
from compiler.ir import expr as E
from compiler.ir.buffer import SCOPES
from compiler.ir.stmt import ForKind
from compiler.schedule.intrin import TensorIntrin
from compiler.te.rewrite import rewrite
from compiler.te.tensor import ComputeOp, IterKind, IterVar, Reduce, Tensor, TensorLoad

PREFETCH_PRAGMA = "prefetch"  # a loop's pragma whose value is a PrefetchSpec (lower/prefetch.py)


@dataclass(frozen=True)
class PrefetchSpec:
    """What a loop prefetches (`Stage.prefetch`): the reads of input `tensor` that iteration
    i + `offset` makes, at the start of iteration i, or each iteration of the inner loops
    `spread` (outermost first) its share of them; `locality` is __builtin_prefetch's (3: every
    cache level, 2: L2 and out, 1: L3 and out, 0: no temporal reuse)."""

    tensor: str
    offset: int
    spread: tuple[E.Var, ...]
    locality: int


THREAD_TAGS = frozenset(
    {f"{kind}.{d}" for kind in ("blockIdx", "threadIdx", "vthread") for d in "xyz"}
)


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


@dataclass(frozen=True, eq=False)
class Fuse:
    """fused = outer * inner.extent + inner: one loop over both."""

    outer: IterVar
    inner: IterVar
    fused: IterVar


Relation = Split | Fuse


class Stage:
    """The schedule of one compute tensor."""

    def __init__(self, tensor: Tensor, schedule: Schedule | None = None) -> None:
        assert isinstance(tensor.op, ComputeOp)
        self.tensor = tensor
        self.op: ComputeOp = tensor.op
        self.schedule = schedule
        self.leaf_iter_vars: list[IterVar] = [*self.op.axis, *self.op.reduce_axis]
        self.relations: list[Relation] = []
        self.kinds: dict[IterVar, ForKind] = {}
        self.thread_tags: dict[IterVar, str] = {}
        self.pragmas: dict[IterVar, list[tuple[str, object]]] = {}
        self.tensorized: dict[IterVar, TensorIntrin] = {}
        self.attach: str = "root"  # "root", "inline" or "at"
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None
        self.scope = "global"
        self.double_buffered = False
        self.stage_registers = False
        # (factor, offset) of storage_align: the buffer's row stride is offset mod factor
        self.row_align: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def axis(self) -> tuple[IterVar, ...]:
        """The op's data axes, as created by compute."""
        return self.op.axis

    @property
    def reduce_axis(self) -> tuple[IterVar, ...]:
        return self.op.reduce_axis

    # -- loop structure ------------------------------------------------------------------------

    def split(
        self, axis: IterVar, factor: int | None = None, nparts: int | None = None
    ) -> tuple[IterVar, IterVar]:
        """Split leaf `axis` into (outer, inner): inner of extent `factor`, or outer of `nparts`.

        A factor past the extent is capped at it. Non-dividing splits are allowed: lowering cuts
        the tail (a min() bound that loop partition turns into its own loop, or a guard).
        """
        pos = self._leaf_position(axis, "split")
        if axis in self.kinds or axis in self.thread_tags:
            # Whether outer or inner should inherit it is the caller's intent, not ours to guess.
            what = self.kinds[axis].value if axis in self.kinds else "bound"
            raise ScheduleError(
                f"stage {self.name}: split of axis {axis.name}, already {what}: "
                "split first, then annotate"
            )
        if (factor is None) == (nparts is None):
            raise ScheduleError(
                f"stage {self.name}: split of axis {axis.name} needs exactly one of factor, nparts"
            )
        given = factor if factor is not None else nparts
        label = "factor" if factor is not None else "nparts"
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ScheduleError(
                f"stage {self.name}: split of axis {axis.name} by {label} {given!r}: "
                f"{label} must be an int >= 1"
            )
        if nparts is not None:
            given = math.ceil(axis.extent / min(nparts, axis.extent))
        # A factor past the extent would only add iterations that the guard throws away.
        factor = min(given, axis.extent)
        outer = IterVar(E.Var(f"{axis.name}_o"), math.ceil(axis.extent / factor), axis.kind)
        inner = IterVar(E.Var(f"{axis.name}_i"), factor, axis.kind)
        self.relations.append(Split(axis, outer, inner, factor))
        self.leaf_iter_vars[pos : pos + 1] = [outer, inner]
        return outer, inner

    def tile(
        self, x: IterVar, y: IterVar, x_factor: int, y_factor: int
    ) -> tuple[IterVar, IterVar, IterVar, IterVar]:
        """Split `x` and `y` and order the loops (x_outer, y_outer, x_inner, y_inner)."""
        xo, xi = self.split(x, x_factor)
        yo, yi = self.split(y, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *axes: IterVar) -> IterVar:
        """One loop over adjacent leaves `axes` (outermost first); returns the fused leaf."""
        if len(axes) < 2:
            if len(axes) == 1:
                self._leaf_position(axes[0], "fuse")
                return axes[0]
            raise ScheduleError(f"stage {self.name}: fuse needs at least one axis")
        positions = [self._leaf_position(a, "fuse") for a in axes]
        for a, p, q in zip(axes[1:], positions, positions[1:], strict=False):
            if q != p + 1:
                raise ScheduleError(
                    f"stage {self.name}: fuse of axis {a.name}, which is not the leaf right inside "
                    f"{self.leaf_iter_vars[p].name}: fuse adjacent loops, outermost first"
                )
        kinds = {a.kind for a in axes}
        if len(kinds) > 1:
            raise ScheduleError(
                f"stage {self.name}: fuse of data and reduction axes {[a.name for a in axes]}"
            )
        for a in axes:
            if a in self.kinds or a in self.thread_tags:
                raise ScheduleError(f"stage {self.name}: fuse of axis {a.name}, already annotated")
        fused = axes[0]
        for inner in axes[1:]:
            new = IterVar(
                E.Var(f"{fused.name}_{inner.name}_f"), fused.extent * inner.extent, inner.kind
            )
            self.relations.append(Fuse(fused, inner, new))
            fused = new
        self.leaf_iter_vars[positions[0] : positions[-1] + 1] = [fused]
        return fused

    def reorder(self, *axes: IterVar) -> None:
        """Put `axes` in this order, in the loop positions they occupy now; other loops stay."""
        positions = [self._leaf_position(a, "reorder") for a in axes]
        if len(set(positions)) != len(positions):
            names = [a.name for a in axes]
            raise ScheduleError(f"stage {self.name}: reorder names an axis twice: {names}")
        for pos, axis in zip(sorted(positions), axes, strict=True):
            self.leaf_iter_vars[pos] = axis

    # -- annotations ---------------------------------------------------------------------------

    def vectorize(self, axis: IterVar) -> None:
        """Run the iterations of `axis` as SIMD lanes; it must be a data axis."""
        self._annotate(axis, ForKind.VECTORIZED)

    def unroll(self, axis: IterVar) -> None:
        """Unroll `axis` (lowering replicates the body when the extent is small and constant)."""
        self._annotate(axis, ForKind.UNROLLED)

    def parallel(self, axis: IterVar) -> None:
        """Let the iterations of `axis` run on several threads; it must be a data axis."""
        self._annotate(axis, ForKind.PARALLEL)

    def bind(self, axis: IterVar, thread_tag: str) -> None:
        """Map `axis` onto a GPU grid axis: "blockIdx.x", "threadIdx.y", "vthread.x", ...

        A reduction axis may be bound to a threadIdx axis: the block's threads then share the
        reduction, combining their partials in shared memory (lower/allreduce.py).
        """
        self._leaf_position(axis, "bind")
        if thread_tag not in THREAD_TAGS:
            raise ScheduleError(
                f"stage {self.name}: bind of axis {axis.name} to {thread_tag!r}, "
                f"not one of {sorted(THREAD_TAGS)}"
            )
        if axis.kind is IterKind.REDUCE and not thread_tag.startswith("threadIdx"):
            # A reduce loop on threads is a cross-thread reduction (lower/allreduce.py); on
            # blocks or virtual threads its partial sums would have no shared memory to meet in.
            raise ScheduleError(
                f"stage {self.name}: reduction axis {axis.name} can be bound to threadIdx "
                f"only, not {thread_tag}"
            )
        if axis in self.kinds:
            raise ScheduleError(
                f"stage {self.name}: bind of axis {axis.name}, already {self.kinds[axis].value}"
            )
        self.thread_tags[axis] = thread_tag

    def pragma(self, axis: IterVar, key: str, value: object = 1) -> None:
        """Attach a backend hint to loop `axis` (e.g. "unroll_explicit", "omp_chunk", or
        "nontemporal" on a vectorized loop: streaming stores, codegen/vector.py)."""
        self._leaf_position(axis, "pragma")
        if not key.isidentifier():
            raise ScheduleError(f"stage {self.name}: pragma {key!r} on axis {axis.name}")
        self.pragmas.setdefault(axis, []).append((key, value))

    def prefetch(
        self,
        tensor: Tensor,
        axis: IterVar,
        offset: int = 1,
        spread: Sequence[IterVar] = (),
        locality: int = 3,
    ) -> None:
        """Prefetch, in each iteration of loop `axis`, what iteration `offset` ahead reads of
        input `tensor` (TVM's `prefetch`): all at the iteration's start or, with `spread` (loops
        nested inside `axis`, outermost first: this stage's or those of stages computed inside
        it), a share at the start of each iteration of the innermost. What is read is found
        when lowering (lower/prefetch.py): the reads of `tensor` in the loop's body."""
        pos = self._leaf_position(axis, "prefetch")
        for loop in spread:
            mine = [i for i, leaf in enumerate(self.leaf_iter_vars) if leaf is loop]
            if mine and mine[0] <= pos:
                raise ScheduleError(
                    f"stage {self.name}: prefetch spread over {loop.name}, which is not inside "
                    f"{axis.name}"
                )
        if offset < 1:
            raise ScheduleError(f"stage {self.name}: prefetch offset must be >= 1, got {offset}")
        if locality not in (0, 1, 2, 3):
            raise ScheduleError(f"stage {self.name}: prefetch locality must be 0-3, got {locality}")
        if isinstance(tensor.op, ComputeOp):
            raise ScheduleError(
                f"stage {self.name}: prefetch of {tensor.name}, which is computed, not an input"
            )
        spec = PrefetchSpec(tensor.name, offset, tuple(loop.var for loop in spread), locality)
        self.pragmas.setdefault(axis, []).append((PREFETCH_PRAGMA, spec))

    def tensorize(self, axis: IterVar, intrin: TensorIntrin) -> None:
        """Replace the loops from `axis` inward by calls of `intrin` (checked when lowering)."""
        pos = self._leaf_position(axis, "tensorize")
        inside = self.leaf_iter_vars[pos:]
        want = len(intrin.op.axis) + len(intrin.op.reduce_axis)
        if len(inside) != want:
            raise ScheduleError(
                f"stage {self.name}: tensorize at axis {axis.name} covers {len(inside)} loops, "
                f"intrinsic {intrin.name} has {want}"
            )
        self.tensorized[axis] = intrin

    def storage_align(self, axis: IterVar, factor: int, offset: int) -> None:
        """Pad the rows of this stage's buffer: the stride of `axis`, its second-to-last data
        axis, becomes the smallest one >= its row length that is `offset` mod `factor` (TVM's
        storage_align). Padded rows move a shared tile's columns across memory banks, so the
        threads reading one column conflict less; the padding is never read or written."""
        axes = self.op.axis
        if len(axes) < 2 or axis is not axes[-2]:
            raise ScheduleError(
                f"stage {self.name}: storage_align of axis {axis.name}: only the second-to-last "
                "data axis (the rows) can be aligned"
            )
        if factor < 1 or not 0 <= offset < factor:
            raise ScheduleError(
                f"stage {self.name}: storage_align needs factor >= 1 and 0 <= offset < factor, "
                f"got {factor}, {offset}"
            )
        self.row_align = (factor, offset)

    def double_buffer(self, stage_registers: bool = False) -> None:
        """Give this attached stage two buffers so the next iteration's copy overlaps this one's
        use; with `stage_registers` that copy's loads are issued before the use and its stores
        into the other buffer after it, through a thread's registers (the pass's doc)."""
        self.double_buffered = True
        self.stage_registers = stage_registers

    def _annotate(self, axis: IterVar, kind: ForKind) -> None:
        self._leaf_position(axis, kind.value)
        if axis.kind is IterKind.REDUCE and kind in (ForKind.VECTORIZED, ForKind.PARALLEL):
            # Reduction iterations write the same element, so running them together would race.
            raise ScheduleError(
                f"stage {self.name}: cannot {kind.value} reduction axis {axis.name}"
            )
        if axis in self.thread_tags:
            raise ScheduleError(
                f"stage {self.name}: {kind.value} of axis {axis.name}, already bound to "
                f"{self.thread_tags[axis]}"
            )
        self.kinds[axis] = kind

    # -- placement ------------------------------------------------------------------------------

    def compute_at(self, parent: Stage, axis: IterVar) -> None:
        """Compute this stage inside loop `axis` of `parent`, only the region that loop needs."""
        if parent is self:
            raise ScheduleError(f"stage {self.name}: compute_at its own axis {axis.name}")
        if not any(leaf is axis for leaf in parent.leaf_iter_vars):
            raise ScheduleError(
                f"stage {self.name}: compute_at axis {axis.name}, which is not a loop of stage "
                f"{parent.name} (loops: {[v.name for v in parent.leaf_iter_vars]})"
            )
        if not _reads(parent, self.tensor):
            raise ScheduleError(
                f"stage {self.name}: compute_at stage {parent.name} (axis {axis.name}), which "
                f"does not read {self.tensor.name}: attach to a consumer"
            )
        if parent.attach == "inline":
            raise ScheduleError(f"stage {self.name}: compute_at inlined stage {parent.name}")
        self.attach, self.attach_stage, self.attach_ivar = "at", parent, axis

    def compute_root(self) -> None:
        """Compute the whole tensor at the top of the function (the default)."""
        self.attach, self.attach_stage, self.attach_ivar = "root", None, None

    def compute_inline(self) -> None:
        """Substitute this stage's formula into every reader; it gets no loops or buffer."""
        if isinstance(self.op.body, Reduce):
            raise ScheduleError(f"stage {self.name}: cannot compute_inline a reduction")
        sch = self.schedule
        if sch is not None and self.tensor in sch.outputs:
            raise ScheduleError(f"stage {self.name}: cannot compute_inline an output")
        if sch is not None:
            for stage in sch.stages:
                if stage is not self and _reads_directly(stage, self.tensor):
                    stage._replace_body(self._inline_into)
        self.attach = "inline"

    def set_scope(self, scope: str) -> None:
        """Where this stage's buffer lives: "global", "local", "shared", or one of the VTA
        accelerator's on-chip buffers "vta.inp", "vta.wgt", "vta.acc"."""
        if scope not in SCOPES:
            raise ScheduleError(f"stage {self.name}: scope {scope!r} not in {sorted(SCOPES)}")
        self.scope = scope

    def _inline_into(self, read: TensorLoad) -> E.Expr | None:
        if read.tensor is not self.tensor:
            return None
        mapping = {ax.var: idx for ax, idx in zip(self.op.axis, read.indices, strict=True)}
        return rewrite(self.op.body, mapping)

    def _replace_body(self, loads: object) -> None:
        body = rewrite(self.op.body, loads=loads)  # type: ignore[arg-type]
        self.op = ComputeOp(self.op.name, self.op.axis, self.op.reduce_axis, body)

    def _leaf_position(self, axis: object, primitive: str) -> int:
        for pos, leaf in enumerate(self.leaf_iter_vars):
            if leaf is axis:
                return pos
        name = axis.name if isinstance(axis, IterVar) else repr(axis)
        leaves = [leaf.name for leaf in self.leaf_iter_vars]
        raise ScheduleError(
            f"stage {self.name}: {primitive} of axis {name}, which is not a loop of this stage "
            f"(loops: {leaves})"
        )

    def __repr__(self) -> str:
        loops = ", ".join(
            f"{leaf.name}:{self.thread_tags.get(leaf) or self.kinds.get(leaf, ForKind.SERIAL).value}"
            for leaf in self.leaf_iter_vars
        )
        return f"Stage({self.name}: {loops})"


class Schedule:
    """Stages of every compute tensor that the outputs depend on, producers first."""

    def __init__(self, outputs: Sequence[Tensor]) -> None:
        self.outputs = tuple(outputs)
        self.stages: list[Stage] = []
        self._by_tensor: dict[Tensor, Stage] = {}
        for tensor in _post_order(self.outputs):
            self._add(Stage(tensor, self), len(self.stages))

    def __getitem__(self, tensor: Tensor) -> Stage:
        if tensor not in self._by_tensor:
            raise ScheduleError(
                f"{tensor.name} has no stage in this schedule (placeholder or unrelated)"
            )
        return self._by_tensor[tensor]

    def _add(self, stage: Stage, position: int) -> None:
        self.stages.insert(position, stage)
        self._by_tensor[stage.tensor] = stage

    def cache_read(self, tensor: Tensor, scope: str, readers: Sequence[Tensor]) -> Tensor:
        """A copy of `tensor` in `scope` that `readers` read instead; returns the copy's tensor.

        Schedule the copy (usually compute_at inside a reader's loop) to move only a tile.
        """
        if scope not in SCOPES:
            raise ScheduleError(f"cache_read of {tensor.name}: scope {scope!r} unknown")
        reader_stages = [self[r] for r in readers]
        for st in reader_stages:
            if not _reads_directly(st, tensor):
                raise ScheduleError(f"stage {st.name}: cache_read of {tensor.name}, not read here")
        name = f"{tensor.name}.{scope}"
        axis = tuple(IterVar(E.Var(f"ax{d}"), n, IterKind.DATA) for d, n in enumerate(tensor.shape))
        body = TensorLoad(tensor, tuple(a.var for a in axis))
        cache = Tensor(name, tensor.shape, tensor.dtype, ComputeOp(name, axis, (), body))
        for st in reader_stages:
            st._replace_body(
                lambda read: TensorLoad(cache, read.indices) if read.tensor is tensor else None
            )
        position = self.stages.index(self[tensor]) + 1 if tensor in self._by_tensor else 0
        stage = Stage(cache, self)
        stage.scope = scope
        self._add(stage, position)
        return cache

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Compute `tensor` into a `scope` buffer first, then copy it out; returns the cache.

        The cache takes over the formula (and any reduction); `tensor`'s stage becomes the copy,
        with its same data axes. Call it before other primitives on `tensor`'s stage.
        """
        stage = self[tensor]
        if scope not in SCOPES:
            raise ScheduleError(f"stage {stage.name}: cache_write to scope {scope!r} unknown")
        if stage.relations or stage.kinds or stage.thread_tags or stage.attach != "root":
            raise ScheduleError(
                f"stage {stage.name}: cache_write after other primitives on it; call it first"
            )
        op = stage.op
        name = f"{op.name}.{scope}"
        axis = tuple(IterVar(E.Var(a.name), a.extent, IterKind.DATA) for a in op.axis)
        body = rewrite(op.body, {a.var: b.var for a, b in zip(op.axis, axis, strict=True)})
        cache = Tensor(
            name, tensor.shape, tensor.dtype, ComputeOp(name, axis, op.reduce_axis, body)
        )
        copy = TensorLoad(cache, tuple(a.var for a in op.axis))
        stage.op = ComputeOp(op.name, op.axis, (), copy)
        stage.leaf_iter_vars = list(op.axis)
        new = Stage(cache, self)
        new.scope = scope
        self._add(new, self.stages.index(stage))
        return cache


def create_schedule(outputs: Tensor | Sequence[Tensor]) -> Schedule:
    """A schedule with default loops (one per axis, in order, serial) for `outputs` and their producers."""
    return Schedule((outputs,) if isinstance(outputs, Tensor) else tuple(outputs))


def _reads_directly(stage: Stage, tensor: Tensor) -> bool:
    return tensor in stage.op.inputs


def _reads(stage: Stage, tensor: Tensor) -> bool:
    """Whether `stage` reads `tensor`, directly or through other stages of its schedule."""
    sch = stage.schedule
    seen: set[Tensor] = set()
    todo = list(stage.op.inputs)
    while todo:
        t = todo.pop()
        if t is tensor:
            return True
        if t in seen:
            continue
        seen.add(t)
        if sch is not None and t in sch._by_tensor:
            todo.extend(sch[t].op.inputs)
    return False


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

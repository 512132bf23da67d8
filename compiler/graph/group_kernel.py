"""One kernel per fused INJECTIVE or REDUCTION group: te computes chained, inlined, scheduled.

`group_kernel(plan, group)` gives `(schedule, args, arg_values)`:
- `args`: one placeholder per group input (`group.inputs` order, named after the graph value),
  then the group's outputs (`group.outputs` order, named after their values; a split's later
  outputs are `<first output>.k`). Constants the group reads are inputs too:
  the graph keeps them as values, and the caller passes `arg_values[k]` (the constant's array)
  for them; `arg_values[k]` is None for every other argument (runtime inputs and outputs).
- the schedule (default, untuned): every injective intermediate is `compute_inline`d into its
  readers; a reduction that is not an output is computed inside the output's loop over the
  leading axes it is indexed by identically (a softmax's row max and sum inside the row loop),
  else at the root; with `parallel` (the model builder passes it for builds of more than one
  thread only), each output's leading axes are fused into one `parallel` loop when it is
  large enough, and its innermost axis (and that of a reduction computed inside it, when it
  has axes of its own there) is split by 16 or 8 (whichever divides it) and vectorized; a
  reduction is vectorized only when its reads stay contiguous in the lane (NCHW[x]c pools and
  a softmax's lane partials: yes; a row sum x[r, k]: no, it stays scalar).

Bool values are C ints in the kernel: callers pass int32 arrays for them (see te_ops).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from compiler.arith.linear import linear_form
from compiler.graph.ir import Graph, GraphError
from compiler.graph.ops import node_category
from compiler.graph.passes.fuse import FusedGroup, FusionPlan
from compiler.graph.registry import Category
from compiler.graph.te_ops import TE_COMPUTES
from compiler.ir import expr as E
from compiler.schedule.schedule import Schedule, Stage, create_schedule
from compiler.te import placeholder
from compiler.te.tensor import IterVar, Reduce, Tensor, TensorLoad, walk

# Outputs with fewer elements run on one thread: an OpenMP region costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 15
# Leading axes are fused until the parallel loop has at least this many iterations.
PARALLEL_MIN_ITERATIONS = 64
VECTOR_FACTORS = (16, 8)


def group_tensors(graph: Graph, group: FusedGroup) -> tuple[list[Tensor], list[Tensor]]:
    """The group's input placeholders and output tensors, the nodes' te computes chained."""
    bad = [n for n in group.nodes if node_category(graph, n) > Category.REDUCTION]
    if bad:
        ops = ", ".join(f"{n.op} ({n.name or n.outputs[0]})" for n in bad)
        raise GraphError(
            f"group #{group.index}: {ops} is not injective or reduction; "
            "anchored groups are compiled with their op template"
        )
    missing = sorted({n.op for n in group.nodes if n.op not in TE_COMPUTES})
    if missing:
        raise GraphError(f"group #{group.index}: no te compute for op(s) {', '.join(missing)}")
    values: dict[str, Tensor] = {}
    inputs = []
    for v in group.inputs:
        vt = graph.type_of(v)
        values[v] = placeholder(vt.shape, vt.dtype, name=v)
        inputs.append(values[v])
    for node in group.nodes:
        types = [graph.type_of(o) for o in node.outputs]
        outs = TE_COMPUTES[node.op](
            [values[v] for v in node.inputs], node.attrs, types, name=node.outputs[0]
        )
        if len(outs) != len(types):
            raise GraphError(
                f"node {node.name or node.op!r} ({node.op}): te compute gave {len(outs)} "
                f"outputs for {len(types)}"
            )
        for o, tensor, want in zip(node.outputs, outs, types, strict=True):
            if tensor.shape != want.shape or tensor.dtype != want.dtype:
                raise GraphError(
                    f"node {node.name or node.op!r} ({node.op}): te compute of {o!r} is "
                    f"{tensor.dtype}{list(tensor.shape)}, typed {want}"
                )
            values[o] = tensor
    return inputs, [values[v] for v in group.outputs]


def group_kernel(
    plan_or_graph: FusionPlan | Graph, group: FusedGroup, parallel: bool = True
) -> tuple[Schedule, list[Tensor], list[np.ndarray | None]]:
    """The schedule, arguments and constant argument values of `group`'s kernel.

    Raises:
        GraphError: the group holds an op that is neither injective nor reduction (a conv2d,
            dense or matmul anchor, or a gather by computed indices), or one without a te
            compute; both name the ops.
    """
    graph = plan_or_graph.graph if isinstance(plan_or_graph, FusionPlan) else plan_or_graph
    inputs, outputs = group_tensors(graph, group)
    sch = create_schedule(outputs)
    for stage in list(sch.stages):
        if stage.tensor not in outputs and not isinstance(stage.op.body, Reduce):
            stage.compute_inline()
    attach = _attachments(sch, outputs)
    for out in outputs:
        _schedule_output(sch, sch[out], attach.get(out, []), parallel)
    values = [graph.constants.get(v) for v in group.inputs] + [None] * len(outputs)
    return sch, [*inputs, *outputs], values


def _live(sch: Schedule) -> list[Stage]:
    return [s for s in sch.stages if s.attach != "inline"]


def _leading_identity(load: TensorLoad, stage: Stage) -> int:
    """How many leading indices of `load` are `stage`'s leading axes, in order."""
    n = 0
    for index, axis in zip(load.indices, stage.op.axis, strict=False):
        if index is not axis.var:
            break
        n += 1
    return n


def _attachments(sch: Schedule, outputs: Sequence[Tensor]) -> dict[Tensor, list[tuple[Stage, int]]]:
    """Per output, the intermediate reductions to compute inside its loops, with the depth.

    A reduction goes inside output O's loop over its first d axes when every read of it (by O,
    or by another reduction that goes inside O) indexes its first d axes with the reader's
    first d axes. O's innermost axis is never an attach point (it is vectorized).
    """
    stages = _live(sch)
    depth: dict[Stage, tuple[Tensor, int]] = {}
    for out in outputs:
        st = sch[out]
        depth[st] = (out, len(st.op.axis) - 1)
    result: dict[Tensor, list[tuple[Stage, int]]] = {}
    for st in reversed(stages):
        if st.tensor in outputs or not isinstance(st.op.body, Reduce):
            continue
        readers = [r for r in stages if r is not st and st.tensor in r.op.inputs]
        owners = {depth[r][0] for r in readers if r in depth}
        if not readers or len(owners) != 1 or any(r not in depth for r in readers):
            continue
        d = min(
            min(depth[r][1], _leading_identity(load, r))
            for r in readers
            for load in walk(r.op.body)
            if isinstance(load, TensorLoad) and load.tensor is st.tensor
        )
        if d >= 1:
            (owner,) = owners
            depth[st] = (owner, d)
            result.setdefault(owner, []).append((st, d))
    return result


def _vectorizable_reduction(st: Stage, lane: IterVar) -> bool:
    """Whether every read whose innermost index a reduced axis moves is contiguous in `lane`
    (so the reduction can run outside the vectorized lane: NCHW[x]c pools, a softmax's lane
    partials; a row sum x[r, k] has no such lane and stays scalar)."""
    reduce_vars = {k.var for k in st.op.reduce_axis}
    for node in walk(st.op.body):
        if (
            isinstance(node, TensorLoad)
            and node.indices
            and E.free_vars(node.indices[-1]) & reduce_vars
        ):
            form = linear_form(node.indices[-1], lane.var)
            if form is None or form[0] != 1:
                return False
    return True


def _vectorize_inner(st: Stage) -> None:
    """Split the innermost axis by 16 or 8 (whichever divides it) and vectorize it, with the
    reduced axes outside the lane; nothing when no factor divides it or the reduction would
    read across lanes."""
    inner = st.op.axis[-1]
    factor = next((f for f in VECTOR_FACTORS if inner.extent % f == 0), 0)
    is_reduction = bool(st.op.reduce_axis)
    if not factor or (is_reduction and not _vectorizable_reduction(st, inner)):
        return
    lane = inner
    if factor < inner.extent:
        _, lane = st.split(inner, factor)
    if is_reduction:
        st.reorder(*st.op.reduce_axis, lane)
    st.vectorize(lane)


def _schedule_output(
    sch: Schedule, st: Stage, attached: list[tuple[Stage, int]], parallel: bool
) -> None:
    axes = list(st.op.axis)
    if not axes:  # a rank-0 output: one element, nothing to split (nothing is attached to it)
        return
    lead = len(axes) - 1
    fused = 0
    if parallel and lead and math.prod(st.tensor.shape) >= PARALLEL_MIN_ELEMENTS:
        fused = 1
        while fused < lead and math.prod(st.tensor.shape[:fused]) < PARALLEL_MIN_ITERATIONS:
            fused += 1
        # Reductions computed inside must not be recomputed across the fused iterations.
        fused = min([fused, *(d for _, d in attached)])
    outer = st.fuse(*axes[:fused]) if fused else None
    _vectorize_inner(st)
    if outer is not None:
        st.parallel(outer)
    for r, d in attached:
        r.compute_at(st, outer if outer is not None and d == fused else axes[d - 1])
        if len(r.op.axis) > d:  # axes of its own inside the attach point: vectorize the last
            _vectorize_inner(r)

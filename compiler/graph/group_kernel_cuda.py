"""GPU schedules for fused groups no template covers, and the layer norm's row form.

`schedule_group_cuda(out)` schedules `out` and everything it is computed from as one kernel:
injective producers inlined; without reductions `schedule_injective_cuda` (flat index over the
grid); with them, `out`'s leading axes down to the shallowest reduction's depth
(`attach_depth`) fused and spread one per thread, the reductions computed inside each thread's
loop in registers. Simple and correct for any size; untuned.

`layer_norm_rows(x, eps)` is `cuda_layer_norm`'s compute over any 2-D `x` (a view of a group's
injective prologue by `as_rows`) with any epsilon, for that template's row schedule.
"""

from __future__ import annotations

import numpy as np

from compiler import te
from compiler.graph.ir import GraphError
from compiler.ir import expr as E
from compiler.ops.cuda.injective import bind_flat, schedule_injective_cuda
from compiler.schedule.schedule import Schedule, Stage, create_schedule
from compiler.te.tensor import PlaceholderOp, Reduce, Tensor, TensorLoad, walk

GROUP_THREADS = 256  # threads a block of the untemplated kernels
ROW_THREADS = (32, 64, 128, 256)  # the row schedule's choices of threads a block


def placeholders_of(out: Tensor) -> set[Tensor]:
    """The placeholders `out` is computed from."""
    seen: set[Tensor] = set()
    found: set[Tensor] = set()
    stack = [out]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if isinstance(t.op, PlaceholderOp):
            found.add(t)
        else:
            stack.extend(t.op.inputs)
    return found


def _leading_identity(load: TensorLoad, reader: Stage) -> int:
    """How many leading indices of `load` are `reader`'s leading axes, in order."""
    n = 0
    for index, axis in zip(load.indices, reader.op.axis, strict=False):
        if index is not axis.var:
            break
        n += 1
    return n


def _reduction_depths(sch: Schedule, out: Tensor) -> dict[Stage, int]:
    """Per intermediate reduction of `sch` (injective stages already inlined), how many of
    `out`'s leading axes it can be computed inside: every read of it (by `out`, or by another
    reduction computed inside) indexes its first d axes with the reader's first d axes. 0: it
    cannot be (it needs a kernel of its own)."""
    live = [s for s in sch.stages if s.attach != "inline" and not isinstance(s.op, PlaceholderOp)]
    depth: dict[Stage, int] = {sch[out]: len(out.shape)}
    for st in reversed(live):
        if st.tensor is out:
            continue
        readers = [r for r in live if r is not st and st.tensor in r.op.inputs]
        if not readers or any(r not in depth for r in readers):
            depth[st] = 0
            continue
        depth[st] = min(
            min(depth[r], _leading_identity(load, r))
            for r in readers
            for load in walk(r.op.body)
            if isinstance(load, TensorLoad) and load.tensor is st.tensor
        )
    del depth[sch[out]]
    return depth


def attach_depth(out: Tensor) -> int:
    """How many of `out`'s leading axes every reduction it is computed from can be computed
    inside (`schedule_group_cuda`): its rank when there are none, 0 when one cannot be."""
    sch = create_schedule(out)
    for st in sch.stages:
        injective = not isinstance(st.op, PlaceholderOp) and not isinstance(st.op.body, Reduce)
        if injective and st.tensor is not out:
            st.compute_inline()
    return min(_reduction_depths(sch, out).values(), default=len(out.shape))


def schedule_group_cuda(out: Tensor, threads: int = GROUP_THREADS) -> Schedule:
    """A GPU schedule of `out` and everything it is computed from (one kernel).

    Injective producers are inlined. Without reductions: `schedule_injective_cuda`. With them:
    `out`'s leading axes down to the shallowest reduction's depth are fused and spread one per
    thread (`bind_flat`); the reductions are computed inside each thread's loop in registers,
    and `out`'s remaining axes run in that thread.

    Raises:
        GraphError: a reduction is read at indices that do not follow `out`'s leading axes (it
            would need a kernel of its own).
    """
    sch = create_schedule(out)
    stages = [s for s in sch.stages if not isinstance(s.op, PlaceholderOp)]
    if out.shape and not any(isinstance(s.op.body, Reduce) for s in stages):
        schedule_injective_cuda(sch, out, {"threads": threads})
        return sch
    for st in stages:
        if st.tensor is not out and not isinstance(st.op.body, Reduce):
            st.compute_inline()
    depths = _reduction_depths(sch, out)
    stuck = [st.name for st, d in depths.items() if d == 0]
    if stuck:
        raise GraphError(
            f"{out.name}: reduction(s) {', '.join(stuck)} are not read along the output's "
            "leading axes; no one-kernel GPU schedule"
        )
    st = sch[out]
    axes = list(st.op.axis)
    if not axes:  # a scalar, injective or a reduction (nothing attaches to it): one thread
        return sch
    shallowest = min(depths.values(), default=len(axes))
    leaf = bind_flat(st, axes[:shallowest], threads)
    for r, d in depths.items():
        r.set_scope("local")
        r.compute_at(st, leaf if d == shallowest else axes[d - 1])
    return sch


def layer_norm_rows(x: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """gamma, beta and the layer norm of the rows of 2-D `x` with epsilon `eps`
    (`cuda_layer_norm`'s compute, whose epsilon is fixed, over any `x`)."""
    rows, cols = x.shape
    gamma = te.placeholder((cols,), name="gamma")
    beta = te.placeholder((cols,), name="beta")
    inv = 1.0 / cols
    k1 = te.reduce_axis((0, cols), name="k1")
    mean = te.compute((rows,), lambda r: te.sum(x[r, k1.var] * inv, axis=k1), name="mean")
    k2 = te.reduce_axis((0, cols), name="k2")

    def centred_square(r: E.Expr) -> E.Expr:
        d = x[r, k2.var] - mean[r]
        return te.sum(d * d * inv, axis=k2)

    var = te.compute((rows,), centred_square, name="var")
    rstd = te.compute((rows,), lambda r: E.Div(E.FloatImm(1.0), te.sqrt(var[r] + eps)), name="rstd")
    out = te.compute(
        (rows, cols), lambda r, c: (x[r, c] - mean[r]) * rstd[r] * gamma[c] + beta[c], name="out"
    )
    return gamma, beta, out


def as_rows(x: Tensor) -> Tensor:
    """`x` viewed as [rows][last axis] (itself when 2-D)."""
    if len(x.shape) == 2:
        return x
    lead, cols = x.shape[:-1], x.shape[-1]

    def body(r: E.Expr, c: E.Expr) -> E.Expr:
        index: list[E.Expr] = []
        for d in reversed(lead):
            index.insert(0, r % d if d > 1 else E.IntImm(0))
            r = r // d
        return x[(*index, c)]

    return te.compute((int(np.prod(lead)), cols), body, name=f"{x.name}.rows")

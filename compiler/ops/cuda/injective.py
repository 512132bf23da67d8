"""A GPU schedule for any injective compute, and elementwise templates that use it.

`schedule_injective_cuda` takes an output whose stages are all injective (elementwise,
broadcast, reshape-like: no reduction), inlines every producer into it, fuses its axes into one
flat index and maps that onto the grid:

    flat = ((block * unroll + u) * threads + t) * vector + v

`t` is threadIdx.x and `block` blockIdx.x; each thread handles `unroll` x `vector` elements.
Knobs:
- `threads`: threads a block (a multiple of a warp); fewer blocks of more threads trade launch
  granularity against occupancy, which only a GPU can rank.
- `unroll`: element groups a thread handles `threads * vector` apart, so a warp's accesses of
  one group stay contiguous (coalesced) and the loop over groups is unrolled: more loads in
  flight per thread, fewer blocks.
- `vector`: consecutive elements a thread handles (a vectorized loop), offered only where it
  divides the size, so the groups stay aligned. The CUDA renderer makes a 4-lane pure copy (a
  reshape, a layout change of a 1-D view) one float4 load and store where it can prove the
  alignment; arithmetic bodies, and indices through a fused N-D index (the simplifier does not
  fold (f // n) * n + f % n back into f), stay scalar accesses, so there the knob changes the
  access pattern only, for the tuner to measure.
Sizes need not divide anything: a guard drops the flat indices past the end.

A fused elementwise group of a model (a residual add, a bias and ReLU, any chain the graph's
fusion pass forms) runs on a GPU by passing its output tensor here; the `cuda_elementwise_<op>`
templates wrap it for the ops of `compiler.ops.injective.ELEMENTWISE_OPS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compiler.errors import ScheduleError
from compiler.ops.injective import ELEMENTWISE_OPS, ElementwiseTemplate
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import check_workload
from compiler.schedule.schedule import Schedule, Stage, create_schedule
from compiler.te.tensor import IterVar, Reduce, Tensor

THREADS = (64, 128, 256, 512, 1024)
UNROLL = (1, 2, 4, 8)
VECTORS = (1, 2, 4)
DEFAULT_INJECTIVE = {"threads": 256, "unroll": 1, "vector": 1}


def injective_knobs(size: int) -> list[Knob]:
    """The knobs of `schedule_injective_cuda` for an output of `size` elements."""
    threads = tuple(t for t in THREADS if t <= max(size, 64))
    vectors = tuple(v for v in VECTORS if size % v == 0)
    return [Knob("threads", threads), Knob("unroll", UNROLL), Knob("vector", vectors)]


def schedule_injective_cuda(sch: Schedule, out: Tensor, config: Mapping[str, Any]) -> None:
    """Schedule the injective `out` of `sch` onto a GPU grid (see the module doc).

    Every other stage of `sch` is inlined into `out`; `config` has `threads`, `unroll` and
    `vector` (missing ones take DEFAULT_INJECTIVE's values).

    Raises:
        ScheduleError: a stage of `sch` is a reduction.
    """
    for stage in sch.stages:
        if isinstance(stage.op.body, Reduce):
            raise ScheduleError(
                f"stage {stage.name}: schedule_injective_cuda takes injective stages only"
            )
    for stage in sch.stages:
        if stage.tensor is not out and stage.attach != "inline":
            stage.compute_inline()
    knobs = {**DEFAULT_INJECTIVE, **config}
    threads, unroll, vector = (int(knobs[k]) for k in ("threads", "unroll", "vector"))
    bind_flat(sch[out], list(sch[out].axis), threads, unroll, vector)


def bind_flat(
    st: Stage, axes: Sequence[IterVar], threads: int, unroll: int = 1, vector: int = 1
) -> IterVar:
    """Fuse `axes` (adjacent data leaves of `st`) and map them onto blocks of `threads` threads,
    `unroll` x `vector` elements a thread (see the module doc); returns the innermost leaf."""
    flat = st.fuse(*axes)
    block, inner = st.split(flat, threads * unroll * vector)
    group, inner = st.split(inner, threads * vector)
    thread, lane = st.split(inner, vector)
    st.bind(block, "blockIdx.x")
    st.bind(thread, "threadIdx.x")
    st.reorder(block, thread, group, lane)
    if unroll > 1:
        st.unroll(group)
    if vector > 1:
        st.vectorize(lane)
    return lane


class CudaElementwiseTemplate(ElementwiseTemplate):
    """One op of ELEMENTWISE_OPS over a [rows][cols] view, scheduled by `schedule_injective_cuda`."""

    def __init__(self, op: str) -> None:
        super().__init__(op)
        self.name = f"cuda_elementwise_{op}"

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        rows, cols = check_workload(self.name, shape, self.fields)
        return ConfigSpace(injective_knobs(rows * cols))

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        sch = create_schedule(args[-1])
        schedule_injective_cuda(sch, args[-1], config)
        return sch


CUDA_ELEMENTWISE = tuple(CudaElementwiseTemplate(op) for op in ELEMENTWISE_OPS)

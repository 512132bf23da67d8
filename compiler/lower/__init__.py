"""Lowering: from a schedule to a loop-IR PrimFunc, in TVM's pass order.

bound inference (bound.py) -> loop nest with tensorize (loop_nest.py, tensorize.py) -> storage
flatten -> simplify -> prefetch -> loop partition -> vectorize -> double buffering -> unroll ->
register promotion -> simplify -> intrinsics -> make-API. `lower` runs them all; `PASSES` lists them so
tests can run a prefix. Register promotion (promote.py) comes right after unroll rather than
before it as in TVM: it decides on the replicated code, whose offsets are constant (see there).
Virtual threads (vthread.py) are lowered on the accelerator's path only
(`compiler.codegen.vta_lower.lower_vta`: nest, flatten, vthreads): CPU and GPU code is as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compiler.ir.function import PrimFunc
from compiler.lower.double_buffer import double_buffer
from compiler.lower.flatten import flatten
from compiler.lower.intrinsics import lower_intrinsics
from compiler.lower.loop_nest import build_loop_nest
from compiler.lower.make_api import make_api
from compiler.lower.partition import partition
from compiler.lower.prefetch import prefetch
from compiler.lower.promote import promote_registers
from compiler.lower.simplify import simplify_pass
from compiler.lower.unroll import unroll
from compiler.lower.vectorize import vectorize
from compiler.schedule.schedule import Schedule
from compiler.te.tensor import Tensor

Pass = Callable[[PrimFunc], PrimFunc]

PASSES: tuple[tuple[str, Pass], ...] = (
    ("flatten", flatten),
    ("simplify", simplify_pass),
    ("prefetch", prefetch),
    ("partition", partition),
    ("vectorize", vectorize),
    ("double_buffer", double_buffer),
    ("unroll", unroll),
    ("promote", promote_registers),
    ("simplify_again", simplify_pass),
    ("intrinsics", lower_intrinsics),
)


def lower_loop_nest(sch: Schedule, args: Sequence[Tensor], name: str) -> PrimFunc:
    """The loop nest alone (bound inference, nest, tensorize), before any pass."""
    nest = build_loop_nest(sch, args, name)
    return PrimFunc(name, nest.params, nest.body)


def lower(
    sch: Schedule, args: Sequence[Tensor], name: str, passes: Sequence[str] | None = None
) -> PrimFunc:
    """The PrimFunc `name` computing every stage of `sch`, with one parameter per tensor of `args`.

    Args:
        sch: the schedule.
        args: tensors in call order: every input placeholder and every output.
        name: the function's name.
        passes: names from PASSES to run, in pipeline order (default: all).

    Raises:
        LowerError: an input is missing from `args`, names repeat, placement is inconsistent,
            or a tensorized loop does not match its intrinsic.
    """
    func = lower_loop_nest(sch, args, name)
    wanted = set(passes) if passes is not None else None
    for pass_name, run in PASSES:
        if wanted is None or pass_name in wanted:
            func = run(func)
    return make_api(func.name, func.params, func.body)


__all__ = ["PASSES", "lower", "lower_loop_nest"]

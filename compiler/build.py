"""Build a schedule into an Artifact: lower, render C with its timing entry, compile (cached)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

from compiler.artifact import ArgSpec, Artifact, Entry
from compiler.codegen.c import render_c
from compiler.codegen.timing import render_timing, timing_symbol
from compiler.lower import lower
from compiler.schedule.schedule import Schedule
from compiler.te.tensor import PlaceholderOp, Tensor
from compiler.toolchain import compile_shared, get_target

_LOG = logging.getLogger(__name__)


def build_source(sch: Schedule, args: Sequence[Tensor], symbol: str) -> str:
    """The C translation unit `build` compiles: the kernel `symbol` and `symbol`__time."""
    func = lower(sch, args, symbol)
    return render_c([(func, symbol)], extra=[render_timing([symbol])])


def build(
    sch: Schedule, args: Sequence[Tensor], symbol: str, target: str = "host", flop: float = 0.0
) -> Artifact:
    """A shared-object Artifact with one entry, `symbol`, over `args` in order.

    Placeholders are inputs and computed tensors outputs. `target` is "host" or a name in
    toolchain.TARGETS; the artifact records the resolved target class ("x86_64-avx512").

    Raises:
        CompilerError: lowering, code generation or the C compiler failed (a subclass says which).
    """
    tgt = get_target(target)
    source = build_source(sch, args, symbol)
    shared = compile_shared(source, tgt)
    _LOG.debug(
        "built %s for %s (%s)", symbol, tgt.name, "cached" if shared.cache_hit else "compiled"
    )
    specs = tuple(
        ArgSpec(t.name, t.shape, t.dtype, "input" if isinstance(t.op, PlaceholderOp) else "output")
        for t in args
    )
    entry = Entry(symbol, timing_symbol(symbol), specs, float(flop))
    digest = hashlib.sha256(shared.data).hexdigest()
    return Artifact(shared.data, digest, "shared_object", tgt.name, (entry,))

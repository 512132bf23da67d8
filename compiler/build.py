"""Build schedules into Artifacts: lower, render C with timing entries, compile (cached).

`build` makes one kernel per shared object; `build_many` puts several kernels into one
translation unit (one compile, one .so, several entries), which is cheaper than compiling each.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.artifact import ArgSpec, Artifact, Entry, manifest_source
from compiler.codegen.c import FunctionWriter, check_symbol, render_c, unit_source
from compiler.codegen.timing import TIMING_PRELUDE, render_timing, timing_symbol
from compiler.gc_pause import without_gc
from compiler.lower import lower
from compiler.schedule.schedule import Schedule
from compiler.te.tensor import PlaceholderOp, Tensor
from compiler.toolchain import SharedObject, Target, UnitBuild, compile_shared, get_target

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kernel:
    """One kernel to build: the schedule, its argument tensors in call order, its symbol."""

    sch: Schedule
    args: Sequence[Tensor]
    symbol: str
    flop: float = 0.0


def build_source(
    sch: Schedule, args: Sequence[Tensor], symbol: str, target: Target | str = "host"
) -> str:
    """The C translation unit `build` compiles: the kernel `symbol` and `symbol`__time."""
    return build_source_many([Kernel(sch, args, symbol)], target)


@without_gc
def build_source_many(kernels: Sequence[Kernel], target: Target | str = "host") -> str:
    """One translation unit with every kernel of `kernels` and their timing entries."""
    tgt = get_target(target)
    funcs = [(lower(k.sch, k.args, k.symbol), k.symbol) for k in kernels]
    timing = render_timing([k.symbol for k in kernels])
    return render_c(funcs, extra=[timing], vector_bytes=tgt.vector_bytes)


# C per translation unit when a build is split: big enough that the compiler's start and the
# prelude are a small part of each, small enough that the first unit compiles early while the
# rest are still lowered, and that both cores stay busy at the end.
UNIT_CHARS = 256_000


@without_gc
def compile_kernels(
    kernels: Sequence[Kernel],
    tail: Sequence[str],
    target: Target | str = "host",
    unit_chars: int | None = None,
) -> SharedObject:
    """One shared object with every kernel of `kernels`, their timing entries and the C chunks
    of `tail` (which may call the kernels and use the timing prelude's helpers).

    Kernels are lowered and rendered one at a time. While their C stays under `unit_chars`
    (default UNIT_CHARS) in all, the result is the one translation unit `build_source_many` and
    `tail` make. Past that, every `unit_chars` of kernels becomes a unit of its own, which starts
    compiling (`toolchain.UnitBuild`: in parallel, each unit cached by its content) while the
    next kernels are lowered; `tail` is the last unit, with the kernels' prototypes, and the
    objects are linked into one shared object.
    """
    tgt = get_target(target)
    limit = UNIT_CHARS if unit_chars is None else unit_chars
    units: UnitBuild | None = None
    pending: list[tuple[FunctionWriter, str]] = []
    symbols: list[str] = []
    size = 0

    def flush() -> str:
        nonlocal pending, size
        done = [w.symbol for w, _ in pending]
        source = unit_source(pending, [render_timing(done)])
        pending, size = [], 0
        return source

    try:
        for k in kernels:
            writer = FunctionWriter(
                lower(k.sch, k.args, k.symbol), check_symbol(k.symbol), tgt.vector_bytes
            )
            body = writer.render()
            pending.append((writer, body))
            symbols.append(k.symbol)
            size += len(body)
            if size >= limit:
                units = units or UnitBuild(tgt)
                units.add(flush())
        if units is None:
            return compile_shared("\n".join([flush(), *tail]), tgt)
        if pending:
            units.add(flush())
        prototypes = "".join(f"int32_t {symbol}(void **args);\n" for symbol in symbols)
        units.add("\n".join([unit_source([]), prototypes, TIMING_PRELUDE, *tail]))
        return units.link()
    finally:
        if units is not None:
            units.close()  # a lowering error must not leave the compile threads behind


def build(
    sch: Schedule, args: Sequence[Tensor], symbol: str, target: str = "host", flop: float = 0.0
) -> Artifact:
    """A shared-object Artifact with one entry, `symbol`, over `args` in order.

    Placeholders are inputs and computed tensors outputs. `target` is "host" or a name in
    toolchain.TARGETS; the artifact records the resolved target class ("x86_64-avx512").

    Raises:
        CompilerError: lowering, code generation or the C compiler failed (a subclass says which).
    """
    return build_many([Kernel(sch, args, symbol, flop)], target)


def kernel_entry(k: Kernel) -> Entry:
    """The artifact entry of kernel `k`: its symbol, timing symbol, arg specs (placeholders are
    inputs, computed tensors outputs) and FLOP count."""
    args = tuple(
        ArgSpec(t.name, t.shape, t.dtype, "input" if isinstance(t.op, PlaceholderOp) else "output")
        for t in k.args
    )
    return Entry(k.symbol, timing_symbol(k.symbol), args, float(k.flop))


def build_many(kernels: Sequence[Kernel], target: Target | str = "host") -> Artifact:
    """One shared-object Artifact with one entry per kernel, compiled as one translation unit.

    Raises:
        CompilerError: lowering, code generation or the C compiler failed (a subclass says which).
        ValueError: two kernels share a symbol.
    """
    symbols = [k.symbol for k in kernels]
    if len(set(symbols)) != len(symbols):
        raise ValueError(f"kernel symbols repeat: {symbols}")
    tgt = get_target(target)
    entries = tuple(kernel_entry(k) for k in kernels)
    source = build_source_many(kernels, tgt) + manifest_source(entries)
    shared = compile_shared(source, tgt)
    _LOG.debug(
        "built %s for %s (%s)", symbols, tgt.name, "cached" if shared.cache_hit else "compiled"
    )
    digest = hashlib.sha256(shared.data).hexdigest()
    return Artifact(shared.data, digest, "shared_object", tgt.name, entries)

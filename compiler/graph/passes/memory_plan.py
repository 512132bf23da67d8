"""Static memory planning: every intermediate value gets an offset in one workspace.

Steps run in order (the graph's nodes, or a fusion plan's groups). A value is live from the step
that defines it to the last step that reads it; a step's inputs and outputs are live together (no
in-place reuse). Buffers are placed greedily, largest first, each at the lowest aligned offset
that overlaps no placed buffer whose live range intersects its own. Graph inputs, outputs and
constants live outside the workspace; with a fusion plan, values internal to a group live in the
kernel's registers and caches and get no buffer at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.graph.ir import Graph, GraphError
from compiler.graph.passes.fuse import FusionPlan

DEFAULT_ALIGNMENT = 64  # bytes: a cache line, and an AVX-512 vector


@dataclass(frozen=True)
class Buffer:
    value: str
    offset: int
    size: int  # bytes, rounded up to the alignment
    first_step: int
    last_step: int

    def live_with(self, other: Buffer) -> bool:
        return self.first_step <= other.last_step and other.first_step <= self.last_step

    def overlaps(self, other: Buffer) -> bool:
        return self.offset < other.offset + other.size and other.offset < self.offset + self.size


@dataclass(frozen=True)
class MemoryPlan:
    """Offsets of the intermediate values in one workspace of `total` bytes.

    `lower_bound` is the most bytes (aligned sizes) live at any one step: no plan that keeps
    these lifetimes can use less, so `total / lower_bound` measures the placement's waste.
    """

    buffers: dict[str, Buffer]
    total: int
    lower_bound: int
    steps: int
    alignment: int

    def offset(self, value: str) -> int:
        return self.buffers[value].offset

    def check(self) -> None:
        """Raise GraphError unless offsets are aligned, inside `total`, and live buffers disjoint."""
        items = sorted(self.buffers.values(), key=lambda b: b.offset)
        for b in items:
            if b.offset % self.alignment or b.offset < 0 or b.offset + b.size > self.total:
                raise GraphError(
                    f"buffer {b.value!r} at [{b.offset}, {b.offset + b.size}) is misaligned or "
                    f"outside the {self.total}-byte workspace"
                )
        for i, a in enumerate(items):
            for b in items[i + 1 :]:
                if b.offset >= a.offset + a.size:
                    break
                if a.live_with(b):
                    raise GraphError(
                        f"buffers {a.value!r} and {b.value!r} are live together (steps "
                        f"{a.first_step}-{a.last_step}, {b.first_step}-{b.last_step}) and overlap"
                    )
        if self.total < self.lower_bound:
            raise GraphError(f"total {self.total} is below the lower bound {self.lower_bound}")

    def summary(self) -> str:
        ratio = self.total / self.lower_bound if self.lower_bound else 1.0
        return (
            f"workspace {self.total} bytes for {len(self.buffers)} buffers over {self.steps} "
            f"steps; lower bound {self.lower_bound} bytes ({ratio:.3f}x)"
        )


def _align(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def _steps(source: Graph | FusionPlan) -> tuple[Graph, list[tuple[list[str], list[str]]]]:
    """(graph, [(values read, values defined needing a buffer)] per step)."""
    if isinstance(source, FusionPlan):
        return source.graph, [(list(g.inputs), list(g.outputs)) for g in source.groups]
    return source, [(list(n.inputs), list(n.outputs)) for n in source.nodes]


def plan_memory(source: Graph | FusionPlan, alignment: int = DEFAULT_ALIGNMENT) -> MemoryPlan:
    """Place the intermediate values of a graph (or of a fusion plan's groups) in one workspace.

    A value defined but never read still gets a buffer for the step that writes it.
    """
    if alignment < 1:
        raise ValueError(f"alignment must be positive, got {alignment}")
    graph, steps = _steps(source)
    outside = set(graph.inputs) | set(graph.constants) | set(graph.outputs)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step, (reads, defines) in enumerate(steps):
        for v in defines:
            if v not in outside:
                first[v] = last[v] = step
        for v in reads:
            if v in first:
                last[v] = step
    sizes = {v: _align(graph.type_of(v).nbytes, alignment) for v in first}
    order = sorted(first, key=lambda v: (-sizes[v], first[v], v))
    placed: list[Buffer] = []
    for v in order:
        me = Buffer(v, 0, sizes[v], first[v], last[v])
        busy = sorted((b.offset, b.offset + b.size) for b in placed if b.live_with(me))
        offset = 0
        for start, end in busy:
            if offset + me.size <= start:
                break
            offset = max(offset, end)
        placed.append(Buffer(v, offset, me.size, me.first_step, me.last_step))
    live_bytes = [0] * len(steps)
    for v in first:
        for step in range(first[v], last[v] + 1):
            live_bytes[step] += sizes[v]
    return MemoryPlan(
        buffers={b.value: b for b in placed},
        total=max((b.offset + b.size for b in placed), default=0),
        lower_bound=max(live_bytes, default=0),
        steps=len(steps),
        alignment=alignment,
    )

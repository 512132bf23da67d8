"""Small helpers the graph passes share: renaming values, pruning constants, finishing a graph."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compiler.graph.ir import Graph, Node
from compiler.graph.registry import get_op


def resolve(renames: Mapping[str, str], value: str) -> str:
    """The name `value` stands for after `renames` (followed to the end of a chain)."""
    seen = {value}
    while value in renames:
        value = renames[value]
        if value in seen:
            raise ValueError(f"rename cycle through {value!r}")
        seen.add(value)
    return value


def apply_renames(graph: Graph, renames: Mapping[str, str]) -> None:
    """Make every node input and graph output of `graph` read the renamed values (in place)."""
    if not renames:
        return
    for node in graph.nodes:
        node.inputs = [resolve(renames, v) for v in node.inputs]
    graph.outputs = [resolve(renames, v) for v in graph.outputs]


def read_values(graph: Graph) -> set[str]:
    """Values some node reads or the graph returns."""
    used = {v for n in graph.nodes for v in n.inputs}
    used.update(graph.outputs)
    return used


def prune_constants(graph: Graph) -> None:
    """Drop constants nothing reads and forget the types of values nothing defines (in place)."""
    used = read_values(graph)
    graph.constants = {k: v for k, v in graph.constants.items() if k in used}
    graph.prune_types()


def finish(graph: Graph) -> Graph:
    """Prune unread constants and stale types, verify, and return `graph`."""
    prune_constants(graph)
    graph.verify()
    return graph


def node_label(node: Node) -> str:
    """How errors and summaries name a node: its name, else its op and first output."""
    return node.name or f"{node.op}->{node.outputs[0] if node.outputs else '?'}"


def add_op(
    graph: Graph,
    op: str,
    inputs: Sequence[str],
    attrs: Mapping[str, Any] | None = None,
    name: str = "",
) -> list[str]:
    """Append `op` reading `inputs` to `graph`, its output types given by the registry's rule."""
    attrs = dict(attrs or {})
    types = get_op(op).infer([graph.type_of(v) for v in inputs], attrs)
    return graph.add_node(op, inputs, types, attrs, name)

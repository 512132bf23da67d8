"""Dead-code elimination."""

from __future__ import annotations

from compiler.graph.ir import Graph
from compiler.graph.passes.rewrite import finish


def eliminate_dead_code(graph: Graph) -> Graph:
    """A copy of `graph` without the work its outputs do not need.

    Guarantees: a node survives iff one of its outputs reaches a graph output (a node with several
    outputs is kept whole); constants nothing reads and types of removed values are dropped; graph
    inputs are kept even when unread (they are the graph's interface); node order, names and
    attributes are unchanged. `graph` itself is not modified.
    """
    g = graph.copy()
    live = set(g.outputs)
    kept = []
    for node in reversed(g.nodes):
        if any(v in live for v in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    g.nodes = kept[::-1]
    return finish(g)

"""Constant folding with the registry's numpy references."""

from __future__ import annotations

import numpy as np

from compiler.graph.execute import evaluate_node
from compiler.graph.ir import Graph, GraphError
from compiler.graph.passes.rewrite import finish

DEFAULT_MAX_BYTES = (
    16 << 20
)  # a folded value this big is likely a broadcast better done at run time


def fold_constants(graph: Graph, max_bytes: int = DEFAULT_MAX_BYTES) -> Graph:
    """A copy of `graph` where every node computable at compile time is a constant.

    Guarantees: a node whose inputs are all constants (including constants it folded earlier in
    this pass) is evaluated with its op's numpy reference, and its outputs become constants with
    the same names and types; a node any of whose results would exceed `max_bytes` is kept as it
    is. Constants nothing reads any more are dropped. `graph` itself is not modified.

    Raises:
        GraphError: a reference returned a value whose shape disagrees with the node's type.
    """
    g = graph.copy()
    kept = []
    for node in g.nodes:
        foldable = all(v in g.constants for v in node.inputs) and all(
            g.type_of(v).nbytes <= max_bytes for v in node.outputs
        )
        if not foldable:
            kept.append(node)
            continue
        args = [g.constants[v] for v in node.inputs]
        try:
            results = evaluate_node(g, node, args)
        except GraphError as exc:
            raise GraphError(f"fold_constants: {exc}") from None
        for name, value in zip(node.outputs, results, strict=True):
            want = g.type_of(name)
            g.constants[name] = np.array(value, dtype=want.dtype, order="C")  # 0-d stays 0-d
    g.nodes = kept
    return finish(g)

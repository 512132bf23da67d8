"""Constant folding with the registry's numpy references; values with no elements fold too."""

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

    Guarantees: a node whose inputs are all known (constants, including those it folded earlier
    in this pass, and any value with no elements: shapes are static, so an empty graph input is
    known too) is evaluated with its op's numpy reference, and its outputs become constants with
    the same names and types; so does a node whose outputs all have no elements (empty arrays),
    whatever its inputs. So a reduction over an empty set becomes its identity (`ops_reduce`)
    and no kernel is left to read or write an empty tensor, except a node mixing empty and
    non-empty inputs into a non-empty result. A node any of whose results would exceed
    `max_bytes` is kept as it is. Constants nothing reads any more are dropped. `graph` itself is
    not modified.

    Raises:
        GraphError: a reference returned a value whose shape disagrees with the node's type.
    """
    g = graph.copy()
    kept = []
    for node in g.nodes:
        outs = [g.type_of(v) for v in node.outputs]
        if all(t.size == 0 for t in outs):
            for name, t in zip(node.outputs, outs, strict=True):
                g.constants[name] = np.zeros(t.shape, t.dtype)
            continue
        args = [a for a in (_known(g, v) for v in node.inputs) if a is not None]
        if len(args) < len(node.inputs) or any(t.nbytes > max_bytes for t in outs):
            kept.append(node)
            continue
        try:
            results = evaluate_node(g, node, args)
        except GraphError as exc:
            raise GraphError(f"fold_constants: {exc}") from None
        for name, value in zip(node.outputs, results, strict=True):
            want = g.type_of(name)
            g.constants[name] = np.array(value, dtype=want.dtype, order="C")  # 0-d stays 0-d
    g.nodes = kept
    return finish(g)


def _known(g: Graph, value: str) -> np.ndarray | None:
    if value in g.constants:
        return g.constants[value]
    t = g.type_of(value)
    return np.zeros(t.shape, t.dtype) if t.size == 0 else None

"""Common-subexpression elimination."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from compiler.graph.ir import Graph
from compiler.graph.passes.rewrite import apply_renames, finish

# Binary ops whose result does not depend on the order of their two inputs (numpy broadcasting is
# symmetric too), so add(a, b) and add(b, a) are one value.
COMMUTATIVE = frozenset({"add", "mul"})


def freeze_attr(value: Any) -> Hashable:
    """A hashable, type-exact key for an attribute value (1 and 1.0 and True stay distinct)."""
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(freeze_attr(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, freeze_attr(v)) for k, v in value.items())))
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, float) and value != value:
        return ("float", "nan")
    return (type(value).__name__, value)


def _constant_key(value: np.ndarray) -> Hashable:
    return (str(value.dtype), tuple(value.shape), np.ascontiguousarray(value).tobytes())


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """A copy of `graph` where each distinct computation is done once.

    Guarantees: constants with the same dtype, shape and bytes become one (the first defined);
    nodes with the same op, the same inputs (after merging; in either order
    for `add`/`mul`) and equal attributes become the first such node, and readers of the others'
    outputs read its outputs. Graph outputs keep their order and count, but an output that was a
    duplicate is now named after the value it duplicated. `graph` itself is not modified.
    """
    g = graph.copy()
    renames: dict[str, str] = {}
    first_constant: dict[Hashable, str] = {}
    for name, value in g.constants.items():
        key = _constant_key(value)
        if key in first_constant:
            renames[name] = first_constant[key]
        else:
            first_constant[key] = name
    seen: dict[Hashable, list[str]] = {}
    kept = []
    for node in g.nodes:
        node.inputs = [renames.get(v, v) for v in node.inputs]
        inputs = tuple(node.inputs)
        if node.op in COMMUTATIVE and len(inputs) == 2:
            inputs = tuple(sorted(inputs))
        key = (node.op, inputs, freeze_attr(node.attrs), len(node.outputs))
        earlier = seen.get(key)
        if earlier is None:
            seen[key] = node.outputs
            kept.append(node)
            continue
        for mine, theirs in zip(node.outputs, earlier, strict=True):
            renames[mine] = theirs
    g.nodes = kept
    apply_renames(g, renames)
    return finish(g)

"""The reference executor: run a graph node by node with the registry's numpy references.

It is the oracle for passes, constant folding and compiled models; it favours clarity over speed,
but frees each value after its last use so whole models fit in memory.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from compiler.graph.ir import Graph, GraphError, Node
from compiler.graph.registry import get_op


def evaluate_node(graph: Graph, node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """`node`'s outputs for `args` by its op's numpy reference, one per output, each of the
    shape the graph types it with (its dtype is the caller's to check or cast).

    Raises:
        GraphError: naming the node, when the reference returns another number of outputs or
            an output of another shape.
    """
    label = f"node {node.name or node.op!r} ({node.op})"
    results = [np.asarray(r) for r in get_op(node.op).reference(args, node.attrs)]
    if len(results) != len(node.outputs):
        raise GraphError(f"{label}: reference gave {len(results)} outputs for {len(node.outputs)}")
    for name, value in zip(node.outputs, results, strict=True):
        want = graph.type_of(name)
        if tuple(value.shape) != want.shape:
            raise GraphError(
                f"{label}: output {name!r} is {value.dtype}{list(value.shape)}, typed {want}"
            )
    return results


def check_feeds(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feeds` as arrays after checking names, shapes and dtypes against the graph's inputs."""
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise GraphError(
            f"graph {graph.name!r} has no input(s) {unknown}; inputs: {list(graph.inputs)}"
        )
    arrays: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in feeds:
            raise GraphError(f"graph {graph.name!r}: no value fed for input {name!r}")
        value = np.asarray(feeds[name])
        want = graph.type_of(name)
        if tuple(value.shape) != want.shape or str(value.dtype) != want.dtype:
            raise GraphError(
                f"graph {graph.name!r}: input {name!r} is {value.dtype}{list(value.shape)}, "
                f"expected {want}"
            )
        arrays[name] = value
    return arrays


def run_reference(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The graph's outputs (in `graph.outputs` order) for `feeds`, computed with numpy.

    Raises GraphError naming the input whose feed is missing, unexpected, or of the wrong shape
    or dtype, and naming the node whose reference returned a value of the wrong type.
    """
    values: dict[str, np.ndarray] = dict(graph.constants)
    values.update(check_feeds(graph, feeds))
    last_use: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last_use[v] = i
    keep = set(graph.outputs) | set(graph.constants)
    for i, node in enumerate(graph.nodes):
        try:
            args = [values[v] for v in node.inputs]
        except KeyError as e:
            raise GraphError(f"node {node.name or node.op!r} reads undefined value {e}") from None
        for name, value in zip(node.outputs, evaluate_node(graph, node, args), strict=True):
            want = graph.type_of(name)
            if str(value.dtype) != want.dtype:
                raise GraphError(
                    f"node {node.name or node.op!r} ({node.op}): output {name!r} is "
                    f"{value.dtype}{list(value.shape)}, typed {want}"
                )
            values[name] = value
        for v in [*dict.fromkeys(node.inputs), *node.outputs]:
            if last_use.get(v, -1) <= i and v not in keep:
                values.pop(v, None)
    return [values[v] for v in graph.outputs]

"""Registers every graph op (importing this module is enough) and answers per-node questions.

The op families: `ops_nn` (convolutions, dense / matmul, pools, normalization),
`ops_elementwise` (unary and broadcasting binary ops), `ops_shape` (reshape, transpose, concat,
split, slice, pad, gather), `ops_reduce` (reductions over axes).
"""

from __future__ import annotations

from compiler.graph import (
    ops_conv_transpose,
    ops_elementwise,
    ops_index,
    ops_nn,
    ops_reduce,
    ops_resample,
    ops_shape,
)
from compiler.graph.ir import Graph, Node
from compiler.graph.ops_nn import conv2d_template
from compiler.graph.registry import Category, get_op

__all__ = ["conv2d_template", "node_category", "node_template"]

# imported for their registrations
_FAMILIES = (
    ops_nn,
    ops_elementwise,
    ops_shape,
    ops_conv_transpose,
    ops_resample,
    ops_reduce,
    ops_index,
)


def node_category(graph: Graph, node: Node) -> Category:
    """The fusion category of `node`: its op's, except a gather by computed indices is OPAQUE."""
    if node.op == "gather" and node.inputs[1] not in graph.constants:
        return Category.OPAQUE
    return get_op(node.op).category


def node_template(graph: Graph, node: Node) -> str | None:
    """The `compiler.ops` template of `node` as an anchor (conv2d picks its specialisation)."""
    if node.op == "conv2d":
        return conv2d_template(
            graph.type_of(node.inputs[0]), graph.type_of(node.inputs[1]), node.attrs
        )
    if node.op == "conv2d_nchwc":  # the layout pass chose the specialisation per node
        return str(node.attrs["template"])
    return get_op(node.op).template

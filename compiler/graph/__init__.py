"""Graph level: the SSA graph IR, its op registry, passes, and the ONNX front end.

`Graph` / `Node` / `TensorType` are in `ir`; `get_op` / `OpDef` / `Category` in `registry`.
Importing the package registers every op (via `ops`); `run_reference` runs a graph with numpy.
"""

from __future__ import annotations

from compiler.graph.execute import run_reference
from compiler.graph.ir import Graph, GraphError, Node, TensorType
from compiler.graph.ops import node_category, node_template
from compiler.graph.registry import Category, OpDef, get_op, op_names, register

__all__ = [
    "Category",
    "Graph",
    "GraphError",
    "Node",
    "OpDef",
    "TensorType",
    "get_op",
    "node_category",
    "node_template",
    "op_names",
    "register",
    "run_reference",
]

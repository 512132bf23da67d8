"""Graph level: the SSA graph IR, its op registry, passes, and the ONNX front end.

`Graph` / `Node` / `TensorType` are in `ir`; `get_op` / `OpDef` / `Category` in `registry`.
"""

from __future__ import annotations

from compiler.graph.ir import Graph, GraphError, Node, TensorType
from compiler.graph.registry import Category, OpDef, get_op, op_names, register

__all__ = [
    "Category",
    "Graph",
    "GraphError",
    "Node",
    "OpDef",
    "TensorType",
    "get_op",
    "op_names",
    "register",
]

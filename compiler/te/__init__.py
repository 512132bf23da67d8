"""Tensor expressions: what to compute, independent of how (that is the schedule's job)."""

from compiler.te.tensor import (
    ComputeOp,
    IterKind,
    IterVar,
    PlaceholderOp,
    Reduce,
    Tensor,
    TensorLoad,
    compute,
    placeholder,
    reduce_axis,
    sum,
)

__all__ = [
    "ComputeOp",
    "IterKind",
    "IterVar",
    "PlaceholderOp",
    "Reduce",
    "Tensor",
    "TensorLoad",
    "compute",
    "placeholder",
    "reduce_axis",
    "sum",
]

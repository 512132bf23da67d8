"""The op registry of the graph IR: what each graph op is, for every pass and the executor.

An `OpDef` gives an op's
- type rule (`infer`): input types + attributes -> output types, raising GraphError naming the
  problem (inconsistent shapes, a bad attribute);
- fusion category (`category`, TVM's four): how the fusion pass may group it;
- numpy reference (`reference`): inputs + attributes -> outputs, used by the reference executor,
  constant folding and the tests;
- layout rule (`layout`, optional): which layouts of its data input it can run in, for the
  NCHW -> NCHW[x]c pass; None means layout-agnostic only for elementwise ops, otherwise NCHW only.
- anchor template (`template`, optional): the `compiler.ops` template a fused group anchored on
  this op is compiled and tuned with.

Op definitions live in `compiler/graph/ops_*.py` and register themselves when
`compiler.graph` is imported.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.graph.ir import GraphError, TensorType


class Category(enum.IntEnum):
    """Fusion categories, in TVM's order: a group's anchor is its highest category."""

    INJECTIVE = 0  # elementwise, broadcast, reshape, transpose, slice, concat ...: one-to-one maps
    REDUCTION = 1  # sums, means, max over axes; softmax and layer_norm are reductions here
    COMPLEX_OUT_FUSABLE = 2  # conv2d, dense, matmul: injective ops may fuse into their output
    OPAQUE = 3  # cannot fuse with anything (e.g. data-dependent gathers)


InferFn = Callable[[Sequence[TensorType], Mapping[str, Any]], list[TensorType]]
ReferenceFn = Callable[[Sequence[np.ndarray], Mapping[str, Any]], list[np.ndarray]]
LayoutFn = Callable[[Sequence[TensorType], Mapping[str, Any]], bool]


@dataclass(frozen=True)
class OpDef:
    name: str
    category: Category
    infer: InferFn
    reference: ReferenceFn
    layout: LayoutFn | None = None  # True when the op can run on NCHW[x]c data as is
    template: str | None = None
    doc: str = ""


_REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in _REGISTRY:
        raise ValueError(f"graph op {op.name!r} is registered twice")
    _REGISTRY[op.name] = op
    return op


def get_op(name: str) -> OpDef:
    """The definition of graph op `name`; GraphError naming the known ops otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise GraphError(
            f"no graph op {name!r}; known: {', '.join(sorted(_REGISTRY)) or '(none)'}"
        ) from None


def op_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))

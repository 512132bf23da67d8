"""The state of one ONNX import, and the helpers the per-op converters (`onnx_ops`) call.

Values are tracked by name. A name is either *known at import* (an initializer, a Constant, or
the output of a node whose inputs were all known: `consts`) or a value of the graph being built.
ONNX names that only rename another value (Identity, Dropout) are `aliases`. A constant enters
`graph.constants` only when a graph node reads it (or it is a graph output), so shape-only
subgraphs (Shape -> Gather -> Concat -> Reshape) leave nothing behind.

`emit` runs the registry's type rule for every node, folds the node when all its inputs are
known or all its outputs are empty, and otherwise appends it to the graph; `bind` gives a node's
ONNX outputs their values and checks them against ONNX's own shape inference where it has a
static answer. Shapes are static, so a value with no elements is always known (an empty array):
a reduction over an empty set folds to its identity, and no kernel reads or writes an empty
tensor (Concat and Split leave their empty pieces out of the node they emit).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from compiler.graph.ir import Graph, GraphError, TensorType
from compiler.graph.registry import get_op


class OnnxImportError(GraphError):
    """An ONNX model Kiln cannot import: unreadable file, old opset, unsupported op, bad shapes.

    `needs_constant` names the ONNX tensor when the cause is an input Kiln needs at build time (a
    shape, axes, pads, bounds) that the model computes or takes as a graph input: a caller that
    knows its value (an ONNX backend at run time) can bind it and import again.
    """

    def __init__(self, message: str, needs_constant: str | None = None) -> None:
        super().__init__(message)
        self.needs_constant = needs_constant


class NotConstantInput(GraphError):
    """A node's input that must be known at import is not; `tensor` is its ONNX name."""

    def __init__(self, message: str, tensor: str) -> None:
        super().__init__(message)
        self.tensor = tensor


class ImportContext:
    """One import in progress; `node` is the ONNX node being converted."""

    def __init__(
        self,
        graph: Graph,
        opset: int,
        reserved: set[str],
        onnx_shapes: Mapping[str, tuple[int, ...]],
    ) -> None:
        self.graph = graph
        self.opset = opset
        self.consts: dict[str, np.ndarray] = {}
        self.aliases: dict[str, str] = {}
        self.reserved = reserved
        self.onnx_shapes = onnx_shapes
        self.node: onnx.NodeProto = onnx.NodeProto()
        self.fresh_names: set[str] = set()

    # -- names and types ------------------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        while True:
            name = self.graph.fresh_name(hint)
            if name not in self.reserved and name not in self.consts:
                self.reserved.add(name)
                self.fresh_names.add(name)
                return name

    def resolve(self, name: str) -> str:
        while name in self.aliases:
            name = self.aliases[name]
        if name not in self.consts and name not in self.graph.types:
            raise GraphError(f"reads {name!r}, which no earlier node or initializer defines")
        return name

    def type_of(self, name: str) -> TensorType:
        if name in self.consts:
            arr = self.consts[name]
            return TensorType(tuple(int(d) for d in arr.shape), str(arr.dtype))
        return self.graph.type_of(name)

    def known(self, name: str) -> np.ndarray | None:
        """The value of `name` when known at import: a constant, or any value with no elements."""
        if name in self.consts:
            return self.consts[name]
        t = self.type_of(name)
        return np.zeros(t.shape, t.dtype) if t.size == 0 else None

    def constant(self, value: np.ndarray, hint: str = "const") -> str:
        """A new known value holding `value`."""
        name = self.fresh(hint)
        self.consts[name] = np.asarray(value)
        return name

    def materialize(self, name: str) -> str:
        """`name` as a graph value: a known constant is added to `graph.constants` once."""
        if name in self.consts and name not in self.graph.types:
            self.graph.add_constant(name, self.consts[name])
        return name

    # -- the current node -----------------------------------------------------------------------

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def input(self, i: int) -> str:
        if not self.has_input(i):
            raise GraphError(f"input {i} is required")
        return self.resolve(self.node.input[i])

    def input_type(self, i: int) -> TensorType:
        return self.type_of(self.input(i))

    def const_input(self, i: int, what: str) -> np.ndarray | None:
        """Input `i` when it is known at import, None when absent; an error when computed."""
        if not self.has_input(i):
            return None
        name = self.input(i)
        if name not in self.consts:
            raise NotConstantInput(
                f"input {i} ({what}, {self.node.input[i]!r}) must be a constant; "
                "only static shapes and parameters are supported",
                self.node.input[i],
            )
        return self.consts[name]

    def refuse_other_attrs(self, known: Iterable[str]) -> None:
        """Refuse the node when it has an attribute outside `known` (Kiln would ignore it)."""
        allowed = set(known)
        extra = sorted(a.name for a in self.node.attribute if a.name not in allowed)
        if extra:
            raise GraphError(
                f"attribute {', '.join(extra)} is not supported "
                f"(known: {', '.join(sorted(allowed))})"
            )

    def attr(self, name: str, default: Any = None) -> Any:
        """Attribute `name` as a plain value (str, int, float, tuple, TensorProto)."""
        for a in self.node.attribute:
            if a.name == name:
                value = helper.get_attribute_value(a)
                if isinstance(value, bytes):
                    return value.decode()
                if isinstance(value, list):
                    return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
                return value
        return default

    def used_outputs(self) -> list[int]:
        return [i for i, name in enumerate(self.node.output) if name]

    # -- nodes ----------------------------------------------------------------------------------

    def emit(
        self,
        op: str,
        inputs: Sequence[str],
        attrs: Mapping[str, Any] | None = None,
        bind: bool = False,
    ) -> list[str]:
        """Append graph op `op` reading `inputs`, or fold it when all inputs are known.

        With `bind`, its outputs take the current ONNX node's output names (in order) and are
        checked against ONNX shape inference; otherwise they get fresh names.
        """
        attrs = dict(attrs or {})
        opdef = get_op(op)
        types = opdef.infer([self.type_of(v) for v in inputs], attrs)
        names = [self.fresh(op) for _ in types]
        if bind:
            onnx_names = list(self.node.output)[: len(types)]
            for k, (name, t) in enumerate(zip(onnx_names, types, strict=False)):
                if name:
                    self._check_shape(name, t.shape)
                    names[k] = name
        if all(t.size == 0 for t in types):  # nothing to compute: empty constants
            for name, t in zip(names, types, strict=True):
                self.consts[name] = np.zeros(t.shape, t.dtype)
            return names
        known = [k for k in (self.known(v) for v in inputs) if k is not None]
        if len(known) == len(inputs):
            results = opdef.reference(known, attrs)
            for name, r, t in zip(names, results, types, strict=True):
                self.consts[name] = np.asarray(r, t.dtype)
            return names
        args = [self.materialize(v) for v in inputs]
        label = self.node.name or (self.node.output[0] if self.node.output else self.node.op_type)
        return self.graph.add_node(op, args, types, attrs, label, output_names=names)

    def bind(self, index: int, value: str) -> None:
        """ONNX output `index` of the current node is another name for `value`."""
        onnx_name = self.node.output[index] if index < len(self.node.output) else ""
        if not onnx_name:
            return
        self._check_shape(onnx_name, self.type_of(value).shape)
        last = self.graph.nodes[-1] if self.graph.nodes else None
        if value in self.consts:
            self.consts[onnx_name] = self.consts[value]
        elif value in self.fresh_names and last is not None and value in last.outputs:
            # the node just built defines `value` and nothing reads it yet: give it the ONNX name
            last.outputs[last.outputs.index(value)] = onnx_name
            self.graph.types[onnx_name] = self.graph.types.pop(value)
        else:
            self.aliases[onnx_name] = value

    def _check_shape(self, onnx_name: str, shape: tuple[int, ...]) -> None:
        theirs = self.onnx_shapes.get(onnx_name)
        if theirs is not None and tuple(theirs) != tuple(shape):
            raise GraphError(
                f"output {onnx_name!r} has shape {list(shape)} by Kiln's type rules but "
                f"{list(theirs)} by ONNX shape inference / the model's declared type"
            )

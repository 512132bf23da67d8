"""The graph IR: a dataflow graph in SSA form.

Every value (a graph input, a constant, or one output of one node) has one name, one static type
(shape + dtype) and exactly one definition. Nodes are kept in topological order: a node reads only
graph inputs, constants, and outputs of nodes before it. Passes build new graphs (or edit a copy)
and call `Graph.verify()` to keep these invariants.

Ops are named in snake case (`conv2d`, `add`, `layer_norm`, ...) and looked up in
`compiler.graph.registry`; attributes are plain Python values (ints, floats, strings, tuples of
them), never protobuf objects, so a graph can be compared, hashed and printed.

    g = Graph("tiny")
    x = g.add_input("x", (1, 8), "float32")
    w = g.add_constant("w", np.ones((8, 4), np.float32))
    (y,) = g.add_node("matmul", [x, w], [TensorType((1, 4), "float32")])
    (z,) = g.add_node("relu", [y], [g.type_of(y)])
    g.set_outputs([z])
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import CompilerError

AttrValue = Any  # int | float | str | bool | tuple[...] of them | None


class GraphError(CompilerError):
    """A malformed graph: undefined or redefined value, type mismatch, cycle, bad attribute."""


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if any((not isinstance(d, int)) or d < 0 for d in self.shape):
            raise GraphError(f"shape {self.shape} must be non-negative ints (static shapes only)")
        np.dtype(self.dtype)  # raises TypeError on unknown dtype names

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass
class Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, AttrValue] = field(default_factory=dict)
    name: str = ""

    def __str__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in sorted(self.attrs.items()))
        head = f"{', '.join(self.outputs)} = {self.op}({', '.join(self.inputs)}"
        return head + (f"; {attrs})" if attrs else ")") + (f"  # {self.name}" if self.name else "")


class Graph:
    """Inputs, constants, nodes (topologically ordered) and outputs, with a type for every value."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.constants: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}
        self._fresh = itertools.count()

    # -- building -------------------------------------------------------------------------------

    def fresh_name(self, hint: str = "v") -> str:
        while True:
            name = f"{hint}_{next(self._fresh)}"
            if name not in self.types:
                return name

    def _define(self, name: str, t: TensorType) -> None:
        if not name:
            raise GraphError("a value needs a non-empty name")
        if name in self.types:
            raise GraphError(f"value {name!r} is defined twice (SSA)")
        self.types[name] = t

    def add_input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> str:
        self._define(name, TensorType(tuple(int(d) for d in shape), dtype))
        self.inputs.append(name)
        return name

    def add_constant(self, name: str, value: np.ndarray) -> str:
        value = np.asarray(value)
        if name in self.types:
            name = self.fresh_name(name)
        self._define(name, TensorType(tuple(int(d) for d in value.shape), str(value.dtype)))
        self.constants[name] = value
        return name

    def add_node(
        self,
        op: str,
        inputs: Sequence[str],
        output_types: Sequence[TensorType],
        attrs: Mapping[str, AttrValue] | None = None,
        name: str = "",
        output_names: Sequence[str] | None = None,
    ) -> list[str]:
        """Append a node reading `inputs`; returns its output names (fresh ones unless given)."""
        for v in inputs:
            if v not in self.types:
                raise GraphError(f"node {name or op!r} reads undefined value {v!r}")
        names = list(output_names) if output_names else [self.fresh_name(op) for _ in output_types]
        if len(names) != len(output_types):
            raise GraphError(
                f"node {name or op!r}: {len(names)} names for {len(output_types)} outputs"
            )
        for n, t in zip(names, output_types, strict=True):
            self._define(n, t)
        self.nodes.append(Node(op, list(inputs), names, dict(attrs or {}), name))
        return names

    def set_outputs(self, names: Iterable[str]) -> None:
        names = list(names)
        for n in names:
            if n not in self.types:
                raise GraphError(f"graph output {n!r} is not a value of the graph")
        self.outputs = names

    # -- queries --------------------------------------------------------------------------------

    def type_of(self, value: str) -> TensorType:
        try:
            return self.types[value]
        except KeyError:
            raise GraphError(f"no value {value!r} in graph {self.name!r}") from None

    def producers(self) -> dict[str, Node]:
        """The node defining each node output."""
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        """The nodes reading each value (a node reading a value twice is listed once)."""
        users: dict[str, list[Node]] = {v: [] for v in self.types}
        for n in self.nodes:
            for v in dict.fromkeys(n.inputs):
                users[v].append(n)
        return users

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    # -- invariants -----------------------------------------------------------------------------

    def verify(self) -> None:
        """Raise GraphError unless every value is defined once, before use, with a type."""
        defined: set[str] = set()
        for v in self.inputs:
            if v in defined:
                raise GraphError(f"graph input {v!r} is listed twice")
            defined.add(v)
        for v in self.constants:
            if v in defined:
                raise GraphError(f"constant {v!r} is also a graph input")
            defined.add(v)
        for n in self.nodes:
            for v in n.inputs:
                if v not in defined:
                    raise GraphError(
                        f"node {n.name or n.op!r} ({n.op}) reads {v!r} before it is defined"
                    )
            for v in n.outputs:
                if v in defined:
                    raise GraphError(f"value {v!r} is defined twice (node {n.name or n.op!r})")
                defined.add(v)
        for v in self.outputs:
            if v not in defined:
                raise GraphError(f"graph output {v!r} is never defined")
        missing = defined - set(self.types)
        if missing:
            raise GraphError(f"values without a type: {sorted(missing)}")
        for v, arr in self.constants.items():
            t = self.types[v]
            if tuple(arr.shape) != t.shape or str(arr.dtype) != t.dtype:
                raise GraphError(f"constant {v!r} is {arr.dtype}{list(arr.shape)}, typed {t}")

    def prune_types(self) -> None:
        """Forget the types of values nothing defines any more (after passes removed nodes)."""
        live = set(self.inputs) | set(self.constants)
        live.update(o for n in self.nodes for o in n.outputs)
        self.types = {k: v for k, v in self.types.items() if k in live}

    def copy(self) -> Graph:
        """A copy whose node list, nodes and attrs can be edited; constant arrays are shared."""
        g = Graph(self.name)
        g.inputs = list(self.inputs)
        g.outputs = list(self.outputs)
        g.constants = dict(self.constants)
        g.nodes = [
            Node(n.op, list(n.inputs), list(n.outputs), copy.deepcopy(n.attrs), n.name)
            for n in self.nodes
        ]
        g.types = dict(self.types)
        g._fresh = itertools.count(next(copy.copy(self._fresh)))
        return g

    def __str__(self) -> str:
        lines = [f"graph {self.name}("]
        lines += [f"  {v}: {self.types[v]}" for v in self.inputs]
        lines.append(") {")
        for v in self.constants:
            lines.append(f"  const {v}: {self.types[v]}")
        for n in self.nodes:
            outs = ", ".join(f"{o}: {self.types[o]}" for o in n.outputs)
            lines.append(f"  {n}    -> {outs}")
        lines.append(f"  return {', '.join(self.outputs)}")
        lines.append("}")
        return "\n".join(lines)

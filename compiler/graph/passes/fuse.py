"""Operator fusion: TVM's rule-based grouping by fusion category and post-dominance.

Each node's category comes from the registry (`Category`, TVM's four patterns). Two phases walk
the nodes in topological order, each looking at a node's immediate post-dominator `p` (every path
from the node to the graph's exit passes through `p`):

0. A complex-out-fusable node (conv2d, dense, matmul), and later any node already in its group,
   absorbs `p` and every node on the paths to it when all of them are injective: conv + bias +
   ReLU + residual add become one group whose anchor is the convolution.
1. An injective node joins `p`'s group, with the paths to it, when everything on the paths is
   injective and `p`'s group is injective or a reduction (reductions take injective inputs).

Reductions and opaque nodes never start a fusion; an opaque node is always alone. A merge that
would put two complex-out-fusable nodes in one group, or that would make the groups cyclic, is
refused. A fused value read outside its group (or returned by the graph) is a group output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from compiler.graph.ir import Graph, GraphError, Node
from compiler.graph.ops import node_category
from compiler.graph.passes.dominators import (
    SINK,
    immediate_post_dominators,
    nodes_between,
    successors,
)
from compiler.graph.registry import Category

CategoryFn = Callable[[Graph, Node], Category]


@dataclass(frozen=True)
class FusedGroup:
    """Nodes compiled as one kernel.

    `anchor` is the member of the highest category (the last such node for ties); `inputs` are
    the values the group reads from outside (graph inputs, constants, other groups' outputs);
    `outputs` the values it defines that are read outside it or returned by the graph.
    """

    index: int
    nodes: tuple[Node, ...]
    anchor: Node
    category: Category
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.nodes)

    def internal_values(self) -> set[str]:
        """Values defined in the group that no other group and no graph output needs."""
        return {v for n in self.nodes for v in n.outputs} - set(self.outputs)


@dataclass
class FusionPlan:
    """The groups of a graph, in an order in which each reads only earlier groups' outputs."""

    graph: Graph
    groups: list[FusedGroup]
    _group_of_value: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._group_of_value = {v: g.index for g in self.groups for n in g.nodes for v in n.outputs}

    def group_of(self, value: str) -> FusedGroup:
        """The group defining node output `value`."""
        try:
            return self.groups[self._group_of_value[value]]
        except KeyError:
            raise KeyError(f"no fused group defines {value!r}") from None

    def summary(self) -> str:
        """One line per group: index, anchor category and op, members, inputs, outputs."""
        lines = [
            f"fusion plan of {self.graph.name}: {len(self.graph)} nodes, {len(self.groups)} groups"
        ]
        for g in self.groups:
            lines.append(
                f"  #{g.index} {g.category.name.lower()} anchor={g.anchor.op} "
                f"[{' -> '.join(g.ops)}] in=({', '.join(g.inputs)}) "
                f"out=({', '.join(g.outputs)})"
            )
        return "\n".join(lines)


class _Groups:
    """Union-find over node indices with each set's members, category and complex count."""

    def __init__(self, categories: list[Category]) -> None:
        self.parent = list(range(len(categories)))
        self.members = [{i} for i in range(len(categories))]
        self.category = list(categories)
        self.complex = [int(c == Category.COMPLEX_OUT_FUSABLE) for c in categories]

    def root(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union_all(self, nodes: list[int]) -> None:
        roots = list(dict.fromkeys(self.root(i) for i in nodes))
        top = roots[0]
        for r in roots[1:]:
            self.parent[r] = top
            self.members[top] |= self.members[r]
            self.category[top] = max(self.category[top], self.category[r])
            self.complex[top] += self.complex[r]
            self.members[r] = set()


def _creates_cycle(succ: list[list[int]], merged: set[int]) -> bool:
    """Whether some path leaves `merged` and comes back into it (the merged group would be cyclic)."""
    stack = [s for i in merged for s in succ[i] if s != SINK and s not in merged]
    seen: set[int] = set()
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        for s in succ[i]:
            if s in merged:
                return True
            if s != SINK:
                stack.append(s)
    return False


def fuse(graph: Graph, category_of: CategoryFn = node_category) -> FusionPlan:
    """Group `graph`'s nodes into fused kernels (see the module docstring for the rules).

    Guarantees: every node is in exactly one group; a group has at most one complex-out-fusable
    node, and an opaque node is alone; groups are listed in a topological order of the group
    DAG, members in graph order. `category_of(graph, node)` gives each node's category (by
    default the registry's, with gathers by computed indices opaque).
    """
    nodes = graph.nodes
    succ = successors(graph)
    ipdom = immediate_post_dominators(graph, succ)
    categories = [category_of(graph, n) for n in nodes]
    groups = _Groups(categories)

    def try_fuse(i: int, allowed_target: Callable[[Category], bool]) -> None:
        p = ipdom[i]
        if p == SINK or groups.root(p) == groups.root(i):
            return
        if not allowed_target(groups.category[groups.root(p)]):
            return
        path = nodes_between(succ, i, p)
        if any(groups.category[groups.root(j)] != Category.INJECTIVE for j in path if j != p):
            return
        roots = {groups.root(j) for j in [i, *path]}
        if sum(groups.complex[r] for r in roots) > 1:
            return
        merged = set().union(*(groups.members[r] for r in roots))
        if _creates_cycle(succ, merged):
            return
        groups.union_all([i, *path])

    for i in range(len(nodes)):  # phase 0: complex-out-fusable groups grow through injective ops
        if groups.category[groups.root(i)] == Category.COMPLEX_OUT_FUSABLE:
            try_fuse(i, lambda c: c == Category.INJECTIVE)
    for i in range(len(nodes)):  # phase 1: injective groups join injective or reduction groups
        if groups.category[groups.root(i)] == Category.INJECTIVE:
            try_fuse(i, lambda c: c <= Category.REDUCTION)
    return FusionPlan(graph, _make_groups(graph, groups, categories, succ))


def _make_groups(
    graph: Graph, groups: _Groups, categories: list[Category], succ: list[list[int]]
) -> list[FusedGroup]:
    roots = sorted(
        {groups.root(i) for i in range(len(graph.nodes))}, key=lambda r: min(groups.members[r])
    )
    root_of = {i: groups.root(i) for i in range(len(graph.nodes))}
    # Topological order of the group DAG (Kahn), preferring groups whose first node comes first.
    preds: dict[int, set[int]] = {r: set() for r in roots}
    for i, nxt in enumerate(succ):
        for s in nxt:
            if s != SINK and root_of[s] != root_of[i]:
                preds[root_of[s]].add(root_of[i])
    order: list[int] = []
    done: set[int] = set()
    while len(order) < len(roots):
        ready = next((r for r in roots if r not in done and preds[r] <= done), None)
        if ready is None:  # _creates_cycle refuses such merges; this guards the invariant
            raise GraphError(f"fusion of graph {graph.name!r} produced cyclic groups")
        order.append(ready)
        done.add(ready)
    outputs = set(graph.outputs)
    readers: dict[str, set[int]] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            readers.setdefault(v, set()).add(root_of[i])
    result = []
    for index, r in enumerate(order):
        members = sorted(groups.members[r])
        group_nodes = tuple(graph.nodes[i] for i in members)
        defined = {v for n in group_nodes for v in n.outputs}
        top = max(categories[i] for i in members)
        anchor = graph.nodes[max(i for i in members if categories[i] == top)]
        ins = dict.fromkeys(v for n in group_nodes for v in n.inputs if v not in defined)
        outs = [
            v for n in group_nodes for v in n.outputs if v in outputs or readers.get(v, set()) - {r}
        ]
        result.append(FusedGroup(index, group_nodes, anchor, top, tuple(ins), tuple(outs)))
    return result

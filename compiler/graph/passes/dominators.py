"""Post-dominators of a graph's dataflow DAG, over nodes, for the fusion pass.

Node `p` post-dominates node `n` when every path from `n` to the graph's exit passes through `p`.
The exit is a virtual sink after every graph output and every node whose outputs nobody reads.
"""

from __future__ import annotations

from compiler.graph.ir import Graph

SINK = -1  # the virtual exit node's index


def successors(graph: Graph) -> list[list[int]]:
    """For each node index, the indices of the nodes reading its outputs (SINK for an exit)."""
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.nodes):
        for v in dict.fromkeys(node.inputs):
            readers.setdefault(v, []).append(i)
    outputs = set(graph.outputs)
    succ: list[list[int]] = []
    for node in graph.nodes:
        nxt: dict[int, None] = {}
        for v in node.outputs:
            for r in readers.get(v, []):
                nxt[r] = None
            if v in outputs:
                nxt[SINK] = None
        succ.append(list(nxt) if nxt else [SINK])
    return succ


def immediate_post_dominators(graph: Graph, succ: list[list[int]] | None = None) -> list[int]:
    """For each node index, its immediate post-dominator's index (SINK when only the exit is).

    Nodes are visited in reverse topological order; a node's immediate post-dominator is the
    nearest common ancestor, in the post-dominator tree built so far, of all its successors.
    """
    succ = successors(graph) if succ is None else succ
    n = len(graph.nodes)
    ipdom = [SINK] * n
    depth = [0] * n

    def dep(i: int) -> int:
        return 0 if i == SINK else depth[i]

    def common(a: int, b: int) -> int:
        while a != b:  # climb from the deeper one; SINK (depth 0) is everyone's ancestor
            if dep(a) >= dep(b):
                a = ipdom[a]
            else:
                b = ipdom[b]
        return a

    for i in range(n - 1, -1, -1):
        dom = succ[i][0]
        for s in succ[i][1:]:
            dom = common(dom, s)
        ipdom[i] = dom
        depth[i] = dep(dom) + 1
    return ipdom


def nodes_between(succ: list[list[int]], src: int, dst: int) -> list[int]:
    """Nodes on some path from `src` to its post-dominator `dst`: `dst` included, `src` not."""
    seen: set[int] = set()
    stack = list(succ[src])
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        if i != dst and i != SINK:
            stack.extend(succ[i])
    seen.discard(SINK)
    return sorted(seen)

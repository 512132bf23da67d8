"""Tuning tasks of a fused graph: one per distinct anchor workload, weighted by occurrence.

A group anchored on a `conv2d_nchwc` node, a `dense` node, or a `matmul` whose second operand is
a 2-D constant (a dense layer over the leading axes of its first operand) is a task of the
anchor's `compiler.ops` template, with the workload in that template's own form:

- conv2d_nchwc / conv2d_1x1_nchwc / conv2d_stem_nchwc: (N, IC, H, W, OC, KH, KW, stride, pad,
  epilogue), epilogue 1 (+ bias), 2 (+ bias + ReLU: the group's next node is a ReLU of the
  convolution alone), 3 (+ bias + ReLU6, a clip to [0, 6]) or 0 (no bias, no ReLU).
  Asymmetric pads are applied by the model's pad kernel, so the workload is that of the padded
  input with pad 0 (the spec's `note` says so).
- depthwise_conv2d_nchwc: (N, C, H, W, KH, KW, stride, pad, epilogue), the epilogue as above.
- dense: (M, N, K); a bias is added by the group's following kernel.

Anchors no template covers (unequal strides, dilation, a batched matmul of two computed
values) are specs with `template` None and a `note` naming the reason: the model builds them
with a generic kernel and they are not tuned. Specs with equal (template, workload) merge;
`weight` counts their groups. Order: first occurrence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from compiler.graph.ir import Graph, Node
from compiler.graph.passes.fuse import FusedGroup, FusionPlan

Workload = tuple[int, ...]
TaskKey = tuple[str, Workload]


@dataclass(frozen=True)
class AnchorWorkload:
    """How one anchor maps to a template: its workload and what the model's kernels add."""

    template: str | None
    workload: Workload
    note: str = ""
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # applied by a pad kernel when nonzero
    relu: bool = False  # the ReLU after the anchor is the template's epilogue


@dataclass(frozen=True)
class TaskSpec:
    """One tuning task: `template` (None: not tunable, see `note`), its workload, its count."""

    template: str | None
    workload: Workload
    weight: int
    anchor_op: str
    note: str = ""
    groups: tuple[int, ...] = field(default=())
    # an anchor's output joins a concat in one of its groups: another output block there takes
    # the concat (and what follows it) out of its blocked layout (`joins_concat`)
    joined: bool = False

    @property
    def key(self) -> TaskKey:
        """The (template, workload) pair configs are looked up by."""
        return (self.template or "", self.workload)


def fused_relu(group: FusedGroup) -> Node | None:
    """The ReLU (or ReLU6: a clip to [0, 6]) a conv template's epilogue can apply: the next
    node, reading only the anchor."""
    nodes = list(group.nodes)
    i = nodes.index(group.anchor)
    out = group.anchor.outputs[0]
    if i + 1 >= len(nodes) or out in group.outputs:
        return None
    nxt = nodes[i + 1]
    readers = [n for n in nodes if out in n.inputs]
    if nxt.inputs != [out] or readers != [nxt]:
        return None
    if nxt.op == "relu" or is_relu6(nxt):
        return nxt
    return None


def is_relu6(node: Node) -> bool:
    """Whether `node` clips to [0, 6] (MobileNet's ReLU6)."""
    return (
        node.op == "clip"
        and node.attrs.get("min") is not None
        and float(node.attrs["min"]) == 0.0
        and node.attrs.get("max") is not None
        and float(node.attrs["max"]) == 6.0
    )


def anchor_workload(graph: Graph, group: FusedGroup) -> AnchorWorkload:
    """The template and workload of `group`'s anchor (see the module docstring)."""
    node = group.anchor
    if node.op == "conv2d_nchwc":
        return _conv_workload(graph, group)
    if node.op in ("dense", "matmul"):
        a, b = (graph.type_of(v) for v in node.inputs[:2])
        if len(b.shape) == 2 and node.inputs[1] in graph.constants and len(a.shape) >= 2:
            k, n = b.shape
            return AnchorWorkload("dense", (math.prod(a.shape[:-1]), n, k))
        return AnchorWorkload(None, (), f"{node.op} of {a} by {b}: no constant 2-D weight")
    return AnchorWorkload(None, (), f"no template for anchor op {node.op}")


def _conv_workload(graph: Graph, group: FusedGroup) -> AnchorWorkload:
    node = group.anchor
    x = graph.type_of(node.inputs[0])
    n, _, h, w, icb = x.shape
    ic = x.shape[1] * icb
    out = graph.type_of(node.outputs[0])
    oc = out.shape[1] * out.shape[4]
    template = str(node.attrs["template"])
    strides = tuple(int(s) for s in node.attrs.get("strides", (1, 1)))
    top, left, bottom, right = (int(p) for p in node.attrs.get("pads", (0, 0, 0, 0)))
    dilations = tuple(int(d) for d in node.attrs.get("dilations", (1, 1)))
    wshape = graph.type_of(node.inputs[1]).shape
    kh, kw = (wshape[1], wshape[2]) if template == "depthwise_conv2d_nchwc" else wshape[2:4]
    if strides[0] != strides[1] or dilations != (1, 1):
        return AnchorWorkload(
            None, (), f"strides {strides} / dilations {dilations}: templates take one stride"
        )
    pads = (top, left, bottom, right)
    note = ""
    pad = top
    if len(set(pads)) != 1:
        h, w, pad = h + top + bottom, w + left + right, 0
        note = f"asymmetric pads {pads} applied by the pad kernel: workload of the padded input"
    elif template == "conv2d_1x1_nchwc" and pad:
        template = "conv2d_nchwc"
    act = fused_relu(group)
    relu = act is not None
    epilogue = (
        (3 if is_relu6(act) else 2) if act is not None else (1 if len(node.inputs) > 2 else 0)
    )
    if template == "depthwise_conv2d_nchwc":
        return AnchorWorkload(
            template, (n, ic, h, w, kh, kw, strides[0], pad, epilogue), note, pads, relu
        )
    if template == "grouped_conv2d_1x1_nchwc":
        groups = int(node.attrs["groups"])
        shape = (n, ic, h, w, oc, kh, kw, strides[0], pad, epilogue, groups)
        return AnchorWorkload(template, shape, note, pads, relu)
    return AnchorWorkload(
        template, (n, ic, h, w, oc, kh, kw, strides[0], pad, epilogue), note, pads, relu
    )


def extract_tasks(plan: FusionPlan) -> list[TaskSpec]:
    """One spec per distinct (template, workload) of the plan's anchored groups, with counts."""
    specs: dict[tuple[str | None, Workload, str], TaskSpec] = {}
    users = plan.graph.consumers()
    for group in plan.groups:
        if group.anchor.op not in ("conv2d_nchwc", "dense", "matmul"):
            continue
        aw = anchor_workload(plan.graph, group)
        key = (aw.template, aw.workload, aw.note if aw.template is None else "")
        joined = joins_concat(plan.graph, group.anchor, users)
        old = specs.get(key)
        if old is None:
            specs[key] = TaskSpec(
                aw.template, aw.workload, 1, group.anchor.op, aw.note, (group.index,), joined
            )
        else:
            specs[key] = TaskSpec(
                old.template,
                old.workload,
                old.weight + 1,
                old.anchor_op,
                old.note,
                (*old.groups, group.index),
                old.joined or joined,
            )
    return list(specs.values())


def joins_concat(graph: Graph, node: Node, users: dict[str, list[Node]]) -> bool:
    """Whether `node`'s output, through ops of one computed input (ReLU, a scale, ...), reaches
    a concat: the layout pass keeps a concat blocked only when all its inputs share a block, so
    another output block there runs the concat, and the pool or conv reading it, in NCHW
    (GoogLeNet-style zoo net: a tuned 1x1 branch with other blocks put a 1.5 ms NCHW max pool
    into the build)."""
    frontier = list(node.outputs)
    for _ in range(8):
        nxt: list[str] = []
        for v in frontier:
            for user in users.get(v, []):
                if user.op == "concat":
                    return True
                if sum(u not in graph.constants for u in dict.fromkeys(user.inputs)) == 1:
                    nxt.extend(user.outputs)
        if not nxt:
            return False
        frontier = nxt
    return False

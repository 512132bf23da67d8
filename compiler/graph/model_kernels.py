"""A fused graph as a sequence of kernel calls over named values: the model builder's plan.

`lower_model(plan, configs, target)` turns every group of a fusion plan into one or more steps,
each a `Kernel` with the names of the values it reads and writes (in argument order):

- an anchored group on a conv2d_nchwc / dense / 2-D matmul: an optional pad step (the conv's
  input into a pre-padded buffer, by the graph's `pad` op through `group_kernel`), the anchor
  step (the template's kernel for its config, weights re-packed with the template's
  `pack_inputs` from the logical weights), and a tail step (`group_kernel` on the group's
  remaining injective nodes, plus a bias add the template's epilogue does not cover);
- an anchor no template covers (a batched matmul of computed values, a convolution with
  unequal strides or dilation): a generic te kernel (after a pad step for a convolution), then
  the tail with the bias add; these kernels are correct but untuned;
- a gather by computed indices (OPAQUE): a one-node te kernel;
- every other group: `group_kernel`.

New values (padded inputs, anchor outputs before the tail, re-packed weights) live in `values`,
a copy of the graph holding every value's type and every constant; `steps_graph` has one node
per step, so `plan_memory(steps_graph)` places every intermediate buffer, pad buffers included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from compiler import te
from compiler.build import Kernel
from compiler.graph.group_kernel import group_kernel
from compiler.graph.ir import Graph, GraphError, Node, TensorType
from compiler.graph.passes.fuse import FusedGroup, FusionPlan
from compiler.graph.registry import Category, get_op
from compiler.graph.tasks import AnchorWorkload, TaskKey, anchor_workload, fused_relu
from compiler.graph.te_ops import TE_COMPUTES
from compiler.ir import expr as E
from compiler.ir.stmt import ForKind
from compiler.ops import op_templates
from compiler.ops.base import (
    NO_PARALLEL,
    PARALLEL_KNOB,
    OpTemplate,
    register_file,
    threaded_space,
)
from compiler.ops.space import Config, ConfigSpace
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.tensor import Tensor

Configs = Mapping[TaskKey, Config]
VECTOR_FACTORS = (16, 8)


@dataclass(frozen=True)
class Step:
    """One kernel call: `reads` and `writes` name the values of its arguments, in order."""

    kernel: Kernel
    group: int
    role: str  # "group", "pad", "anchor" or "tail"
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    config: Config | None = None


# An untuned kernel of fewer FLOPs than this stays on one thread on a multi-thread build: an
# OpenMP region costs microseconds to open and close, a large part of a smaller kernel's time.
# MobileNetV2's depthwise convolutions at 14x14 and 7x7 (0.7-1.4 MFLOP, 7-18 us on one thread)
# still gained from a second thread (the whole model 2-5% faster on two than with 2e6 here).
PARALLEL_MIN_FLOP = 5e5
# A parallel loop whose iterations share out over the threads at least this evenly is taken
# as it is: 3 output-channel blocks on 2 threads (0.75) waste a quarter of the threads' time,
# 9 blocks (0.9) a tenth, so a choice that fuses in more loops (more, smaller chunks) is taken
# instead.
PARALLEL_MIN_BALANCE = 0.95


def default_config(
    template: OpTemplate,
    workload: tuple[int, ...],
    target: str,
    blocks: Mapping[str, int],
    threads: int = 1,
) -> Config:
    """The first config of the template's space (for `threads` threads: `threaded_space`) with
    the given knob values that is worth measuring (the lowest by the template's `default_rank`,
    where it has one: the 1x1 template's flat tiles), with the direct conv's `prefetch` on where
    that is worth measuring too (`_prefetched`).

    `blocks` pins the layout knobs (ic_block, oc_block, c_block) to the graph's layout. The
    first config with those values is the answer when no config is worth measuring. On more
    than one thread a kernel of PARALLEL_MIN_FLOP or more runs its outer output loops in
    parallel: of the template's parallel choices (after "none") that have a config worth
    measuring, the first whose parallel loop shares out evenly over the threads
    (`parallel_balance` at least PARALLEL_MIN_BALANCE), else the best balanced one; when none
    leaves anything to share, "none".
    """
    space = threaded_space(template, workload, threads)
    chosen = _default_in(template, workload, target, space, blocks, threads)
    return _prefetched(template, workload, target, space, chosen)


# The direct conv's `prefetch` knob came after the first records, so its first choice is off
# (a config written without it keeps its meaning). Untuned, it is on where worth measuring:
# ResNet-18 untuned, whose six direct convs (the stride-2 3x3s and layer 4) take it, ran 1.14
# and 1.18x faster on one thread and 1.11x on two (Xeon, 11 interleaved rounds each).
PREFETCH_KNOB = "prefetch"


def _prefetched(
    template: OpTemplate, workload: tuple[int, ...], target: str, space: ConfigSpace, config: Config
) -> Config:
    """`config` with PREFETCH_KNOB on, where it has that knob off and the config with it on is
    worth measuring; else `config`."""
    if config.get(PREFETCH_KNOB, True):
        return config
    on = space.get(space.index_of({**config, PREFETCH_KNOB: True}))
    return on if template.worth_measuring(workload, on, target) else config


def _default_in(
    template: OpTemplate,
    workload: tuple[int, ...],
    target: str,
    space: ConfigSpace,
    blocks: Mapping[str, int],
    threads: int,
) -> Config:
    """`default_config` before `_prefetched`."""
    parallel = next((k for k in space.knobs if k.name == PARALLEL_KNOB), None)
    if parallel is None:
        return _first_config(template, workload, target, space, blocks)[0]
    serial = {**blocks, PARALLEL_KNOB: NO_PARALLEL}
    if template.flop(workload) < PARALLEL_MIN_FLOP:
        return _first_config(template, workload, target, space, serial)[0]
    candidates = [
        _first_config(template, workload, target, space, {**blocks, PARALLEL_KNOB: choice})
        for choice in parallel.choices[1:]
    ]
    worth = [config for config, plausible in candidates if plausible]
    if not worth:  # nothing plausible under any choice: the first choice's first config
        return candidates[0][0]
    best: tuple[float, Config] | None = None
    for config in worth:
        balance = parallel_balance(template, workload, config, threads)
        if balance >= PARALLEL_MIN_BALANCE:
            return config
        if best is None or balance > best[0]:
            best = (balance, config)
    assert best is not None
    if best[0] == 0.0:  # no choice leaves anything to share out
        return _first_config(template, workload, target, space, serial)[0]
    return best[1]


def parallel_balance(
    template: OpTemplate, workload: tuple[int, ...], config: Config, threads: int
) -> float:
    """How evenly `config`'s parallel loop shares out over `threads` threads: its iterations
    over `threads` times the most any thread runs (1.0: even; 0.75: 3 iterations on 2
    threads); 0.0 when it has no parallel loop of more than one iteration."""
    sch, _ = template.instantiate(workload, config)
    extents = [
        int(axis.extent)
        for stage in sch.stages
        for axis, kind in stage.kinds.items()
        if kind is ForKind.PARALLEL
    ]
    iterations = min(extents, default=1)
    if iterations < 2:
        return 0.0
    return iterations / (threads * -(-iterations // threads))


def _first_config(
    template: OpTemplate,
    workload: tuple[int, ...],
    target: str,
    space: ConfigSpace,
    pinned: Mapping[str, object],
) -> tuple[Config, bool]:
    """The first config of `space` with the `pinned` knob values that is worth measuring (of
    those, the lowest by the template's `default_rank` where it has one), else the first with
    them; and whether it is worth measuring."""
    rank = getattr(template, "default_rank", None)
    first: Config | None = None
    best: tuple[tuple[int, ...], Config] | None = None
    for i in range(len(space)):
        config = space.get(i)
        if any(config.get(k) != v for k, v in pinned.items() if k in config):
            continue
        if first is None:
            first = config
        if not template.worth_measuring(workload, config, target):
            continue
        if rank is None:
            return config, True
        key = tuple(rank(workload, config))
        if best is None or key < best[0]:
            best = (key, config)
    if best is not None:
        return best[1], True
    if first is None:
        raise GraphError(f"{template.name}{workload}: no config has the layout's blocks {pinned}")
    return first, False


def logical_weight(template: str, packed: np.ndarray) -> np.ndarray:
    """The OIHW weight of a conv2d_nchwc constant packed by the layout pass."""
    if template == "depthwise_conv2d_nchwc":
        cc, kh, kw, cb = packed.shape
        return np.ascontiguousarray(packed.transpose(0, 3, 1, 2).reshape(cc * cb, 1, kh, kw))
    occ, icc, kh, kw, icb, ocb = packed.shape
    return np.ascontiguousarray(
        packed.transpose(0, 5, 1, 4, 2, 3).reshape(occ * ocb, icc * icb, kh, kw)
    )


class _Lowering:
    def __init__(self, plan: FusionPlan, configs: Configs, target: str, threads: int = 1) -> None:
        self.graph = plan.graph
        self.threads = threads
        self.plan = plan
        self.configs = configs
        self.target = target
        self.values = plan.graph.copy()
        self.steps: list[Step] = []

    # -- values ---------------------------------------------------------------------------------

    def fresh(self, hint: str, t: TensorType) -> str:
        name = self.values.fresh_name(hint)
        self.values.types[name] = t
        return name

    def constant(self, hint: str, value: np.ndarray) -> str:
        return self.values.add_constant(self.values.fresh_name(hint), value)

    def node(self, op: str, inputs: list[str], attrs: dict, hint: str) -> Node:
        """A node of `op` on `inputs`, typed by the registry, kept in `values` only."""
        types = get_op(op).infer([self.values.type_of(v) for v in inputs], attrs)
        outs = [self.fresh(hint, t) for t in types]
        return Node(op, inputs, outs, attrs, hint)

    def symbol(self, group: FusedGroup, role: str) -> str:
        return f"m_g{group.index}" + ("" if role == "group" else f"_{role}")

    # -- steps ----------------------------------------------------------------------------------

    def add_group_kernel(self, group: FusedGroup, role: str) -> None:
        # A one-thread build has no parallel loop anywhere: its elementwise kernels must not
        # take the other cores of a process whose OpenMP runs more threads.
        sch, args, _ = group_kernel(self.values, group, parallel=self.threads > 1)
        kernel = Kernel(sch, args, self.symbol(group, role))
        self.steps.append(Step(kernel, group.index, role, group.inputs, group.outputs))

    def sub_group(
        self, group: FusedGroup, nodes: list[Node], outputs: tuple[str, ...]
    ) -> FusedGroup:
        defined = {v for n in nodes for v in n.outputs}
        inputs = tuple(dict.fromkeys(v for n in nodes for v in n.inputs if v not in defined))
        return FusedGroup(group.index, tuple(nodes), nodes[-1], Category.INJECTIVE, inputs, outputs)

    def lower(self) -> list[Step]:
        for group in self.plan.groups:
            if group.category <= Category.REDUCTION:
                self.add_group_kernel(group, "group")
            elif group.anchor.op == "gather" and len(group.nodes) == 1:
                self.gather(group)
            elif group.category == Category.COMPLEX_OUT_FUSABLE:
                self.anchored(group)
            else:
                ops = ", ".join(group.ops)
                raise GraphError(f"group #{group.index} ({ops}): no kernel for an opaque op")
        return self.steps

    def gather(self, group: FusedGroup) -> None:
        (node,) = group.nodes
        ins = [
            te.placeholder(self.values.type_of(v).shape, self.values.type_of(v).dtype, name=v)
            for v in node.inputs
        ]
        types = [self.values.type_of(o) for o in node.outputs]
        (out,) = TE_COMPUTES["gather"](ins, node.attrs, types, name=node.outputs[0])
        kernel = Kernel(create_schedule(out), [*ins, out], self.symbol(group, "group"))
        self.steps.append(Step(kernel, group.index, "group", tuple(node.inputs), group.outputs))

    def anchored(self, group: FusedGroup) -> None:
        anchor = group.anchor
        if group.nodes[0] is not anchor:
            raise GraphError(f"group #{group.index}: anchor {anchor.op} is not its first node")
        aw = anchor_workload(self.graph, group)
        relu = fused_relu(group) if aw.relu else None
        out = relu.outputs[0] if relu is not None else anchor.outputs[0]
        bias_node: Node | None = None
        if aw.template is None:
            bias_node = self.generic(group, anchor, aw)
        elif anchor.op == "conv2d_nchwc":
            bias_node = self.conv(group, anchor, aw, out)
        else:
            bias_node = self.dense(group, anchor, aw)
        tail = [n for n in group.nodes if n is not anchor and n is not relu]
        if bias_node is not None:
            tail.insert(0, bias_node)
        if tail:
            defined = {v for n in tail for v in n.outputs}
            outputs = tuple(v for v in group.outputs if v in defined)
            self.add_group_kernel(self.sub_group(group, tail, outputs), "tail")

    def config_for(self, aw: AnchorWorkload, blocks: Mapping[str, int]) -> Config:
        assert aw.template is not None
        template = op_templates()[aw.template]
        config = self.configs.get((aw.template, aw.workload))
        if config is None:
            return default_config(template, aw.workload, self.target, blocks, self.threads)
        if any(k in config and config[k] != v for k, v in blocks.items()):
            # tuned for another of the task's convs, laid out in other blocks (`config_blocks`
            # leaves this one in its own): the default config of this layout
            return default_config(template, aw.workload, self.target, blocks, self.threads)
        return config

    def conv(self, group: FusedGroup, node: Node, aw: AnchorWorkload, out: str) -> Node | None:
        assert aw.template is not None
        template = op_templates()[aw.template]
        x = node.inputs[0]
        xt = self.values.type_of(x)
        ocb = self.values.type_of(node.outputs[0]).shape[4]
        depthwise = aw.template == "depthwise_conv2d_nchwc"
        blocks = {"c_block": xt.shape[4]} if depthwise else {"ic_block": xt.shape[4]}
        if not depthwise:
            blocks["oc_block"] = ocb
        config = self.config_for(aw, blocks)
        inside = template.internal_pad(aw.workload)  # pads the kernel applies itself
        top, left, bottom, right = (p - inside for p in aw.pads)
        below, beyond = template.extra_padding(aw.workload, config)
        x = self.padded(group, x, (top, left, bottom + below, right + beyond))
        weight = logical_weight(aw.template, self.values.constants[node.inputs[1]])
        n, c, h, w = xt.shape[0], xt.shape[1] * xt.shape[4], xt.shape[2], xt.shape[3]
        logical = [np.zeros((n, c, h, w), np.float32), weight]
        has_bias = len(node.inputs) > 2
        bias = self.values.constants[node.inputs[2]].reshape(-1) if has_bias else None
        if aw.workload[-1]:  # the epilogue: bias (zeros where the conv has none), activation
            logical.append(bias if bias is not None else np.zeros(weight.shape[0], np.float32))
        packed = template.pack_inputs(aw.workload, config, logical)[1:]
        hints = [node.inputs[1], node.inputs[2] if has_bias else f"{node.inputs[1]}_zero_bias"]
        params = [self.constant(f"{h}_cfg", p) for h, p in zip(hints, packed, strict=False)]
        self.template_step(group, template, aw, config, (x, *params), out)
        return None

    def dense(self, group: FusedGroup, node: Node, aw: AnchorWorkload) -> Node | None:
        assert aw.template is not None
        template = op_templates()[aw.template]
        config = self.config_for(aw, {})
        m, _, k = aw.workload
        weight = self.values.constants[node.inputs[1]].astype(np.float32)
        _, packed = template.pack_inputs(
            aw.workload, config, [np.zeros((m, k), np.float32), weight]
        )
        param = self.constant(f"{node.inputs[1]}_cfg", packed)
        out = node.outputs[0]
        raw, bias_node = out, None
        if len(node.inputs) > 2:
            raw = self.fresh(f"{out}_raw", self.values.type_of(out))
            bias_node = Node("add", [raw, node.inputs[2]], [out])
        self.template_step(group, template, aw, config, (node.inputs[0], param), raw)
        return bias_node

    def template_step(
        self,
        group: FusedGroup,
        template: OpTemplate,
        aw: AnchorWorkload,
        config: Config,
        reads: tuple[str, ...],
        out: str,
    ) -> None:
        sch, args = template.instantiate(aw.workload, config)
        for value, arg in zip([*reads, out], args, strict=True):
            have = self.values.type_of(value).nbytes
            want = int(np.prod(arg.shape)) * np.dtype(arg.dtype).itemsize
            if have != want:
                raise GraphError(
                    f"group #{group.index}: {aw.template}{aw.workload} argument {arg.name} "
                    f"{list(arg.shape)} does not match value {value!r} "
                    f"({self.values.type_of(value)})"
                )
        flop = template.flop(aw.workload)
        kernel = Kernel(sch, args, self.symbol(group, "anchor"), flop)
        self.steps.append(Step(kernel, group.index, "anchor", reads, (out,), config))

    def padded(self, group: FusedGroup, x: str, pads: tuple[int, int, int, int]) -> str:
        """`x` (NCHW[x]c) with `pads` (top, left, bottom, right) of zeros, by a pad step."""
        if not any(pads):
            return x
        top, left, bottom, right = pads
        attrs = {"pads": (0, 0, top, left, 0, 0, 0, bottom, right, 0), "mode": "constant"}
        pad = self.node("pad", [x], {**attrs, "value": 0.0}, "pad")
        self.add_group_kernel(self.sub_group(group, [pad], tuple(pad.outputs)), "pad")
        return pad.outputs[0]

    def conv_bias(self, node: Node) -> tuple[str, Node]:
        """A value for the conv's output before its bias, and the node adding the bias."""
        out = node.outputs[0]
        raw = self.fresh(f"{out}_raw", self.values.type_of(out))
        b = self.values.constants[node.inputs[2]]
        b5 = self.constant(f"{node.inputs[2]}_5d", b.reshape(1, b.shape[0], 1, 1, b.shape[1]))
        return raw, Node("add", [raw, b5], [out])

    def generic(self, group: FusedGroup, node: Node, aw: AnchorWorkload) -> Node | None:
        """A te kernel for an anchor no template covers; the bias node for the tail, if any."""
        out = node.outputs[0]
        out_t = self.values.type_of(out)
        raw, bias_node = out, None
        if node.op == "conv2d_nchwc":
            strides = tuple(int(v) for v in node.attrs.get("strides", (1, 1)))
            dilations = tuple(int(v) for v in node.attrs.get("dilations", (1, 1)))
            top, left, bottom, right = (int(v) for v in node.attrs.get("pads", (0, 0, 0, 0)))
            x = self.padded(group, node.inputs[0], (top, left, bottom, right))
            if len(node.inputs) > 2:
                raw, bias_node = self.conv_bias(node)
            reads = (x, node.inputs[1])
            xt, wt = (self.values.type_of(v) for v in reads)
            xp = te.placeholder(xt.shape, xt.dtype, name=x)
            wp = te.placeholder(wt.shape, wt.dtype, name=node.inputs[1])
            c = conv_compute(xp, wp, strides, dilations, out_t, name=raw)
        elif node.op in ("matmul", "dense"):
            reads = (node.inputs[0], node.inputs[1])
            a_t, b_t = (self.values.type_of(v) for v in reads)
            if len(a_t.shape) < 2 or len(b_t.shape) < 2:
                raise GraphError(f"group #{group.index}: matmul of {a_t} by {b_t}: 1-D operand")
            if len(node.inputs) > 2:
                raw = self.fresh(f"{out}_raw", out_t)
                bias_node = Node("add", [raw, node.inputs[2]], [out])
            xp = te.placeholder(a_t.shape, a_t.dtype, name=reads[0])
            wp = te.placeholder(b_t.shape, b_t.dtype, name=reads[1])
            c = matmul_compute(xp, wp, out_t, name=raw)
        else:
            raise GraphError(f"group #{group.index}: {node.op} not supported: {aw.note}")
        schedule = matmul_schedule(c, self.target) if node.op in ("matmul", "dense") else None
        kernel = Kernel(
            schedule or reduction_schedule(c), [xp, wp, c], self.symbol(group, "anchor")
        )
        self.steps.append(Step(kernel, group.index, "anchor", reads, (raw,)))
        return bias_node


def matmul_compute(a: Tensor, b: Tensor, out: TensorType, name: str) -> Tensor:
    """numpy matmul of two operands of rank >= 2, batch axes broadcast."""
    k = te.reduce_axis((0, a.shape[-1]), name="k")
    rank = len(out.shape)

    def batch(t: Tensor, index: tuple[E.Expr, ...]) -> list[E.Expr]:
        dims = t.shape[:-2]
        skip = rank - 2 - len(dims)
        return [E.IntImm(0) if d == 1 else index[skip + i] for i, d in enumerate(dims)]

    def body(*i: E.Expr) -> E.Expr:
        m, n = i[-2], i[-1]
        return te.sum(a[(*batch(a, i), m, k.var)] * b[(*batch(b, i), k.var, n)], axis=k)

    return te.compute(out.shape, body, name=name)


def conv_compute(
    x: Tensor,
    w: Tensor,
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    out: TensorType,
    name: str,
) -> Tensor:
    """conv2d_nchwc over pre-padded `x` with any strides and dilations (depthwise: 4-D `w`)."""
    sh, sw = strides
    dh, dw = dilations
    if len(w.shape) == 4:  # depthwise [C/cb][KH][KW][cb]
        ry = te.reduce_axis((0, w.shape[1]), name="ry")
        rx = te.reduce_axis((0, w.shape[2]), name="rx")

        def depthwise(b: E.Expr, c: E.Expr, y: E.Expr, xx: E.Expr, ci: E.Expr) -> E.Expr:
            iy, ix = y * sh + ry.var * dh, xx * sw + rx.var * dw
            return te.sum(x[b, c, iy, ix, ci] * w[c, ry, rx, ci], axis=(ry, rx))

        return te.compute(out.shape, depthwise, name=name)
    _, icc, kh, kw, icb, _ = w.shape
    rco = te.reduce_axis((0, icc), name="rco")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rci = te.reduce_axis((0, icb), name="rci")

    def full(b: E.Expr, co: E.Expr, y: E.Expr, xx: E.Expr, ci: E.Expr) -> E.Expr:
        iy, ix = y * sh + ry.var * dh, xx * sw + rx.var * dw
        return te.sum(x[b, rco, iy, ix, rci] * w[co, rco, ry, rx, rci, ci], axis=(rco, ry, rx, rci))

    return te.compute(out.shape, full, name=name)


# Rows of the generic matmul's register tile: with two vectors of columns, 6 rows are 12
# accumulators, which leave AVX2's 16 ymm room for two B vectors and one broadcast.
MATMUL_TILE_ROWS = 6


def matmul_schedule(c: Tensor, target: str = "host") -> Schedule | None:
    """A register-tiled schedule for a (batched) matmul of computed operands, or None when the
    output's last axis takes no vector tile.

    Per (batch, row tile, column tile): an accumulator tile of `MATMUL_TILE_ROWS` rows by two
    of `target`'s vectors (one where two do not divide the columns), kept in registers
    (`cache_write` local, computed at the column-tile loop), the reduction outermost in it,
    rows unrolled, columns vectorized; a row tail is the lowering's loop-partition business.
    BERT-tiny's attention products (128 x 128 x 64 per head) on Zen 3: 4 x 32 columns (16 ymm
    accumulators: spilled) 0.13 ms each, 6 x 16 0.10 ms.
    """
    sch = create_schedule(c)
    st = sch[c]
    *_, m, n = st.op.axis
    vector = register_file(target).lanes
    lanes = next((f for f in (2 * vector, vector) if n.extent % f == 0), 0)
    if not lanes or len(st.op.reduce_axis) != 1:
        return None
    local = sch.cache_write(c, "local")
    rows = min(MATMUL_TILE_ROWS, m.extent)
    _, no, _, ni = st.tile(m, n, rows, lanes)
    st.vectorize(ni)
    sch[local].compute_at(st, no)
    *_, ci, cj = sch[local].op.axis
    sch[local].reorder(sch[local].op.reduce_axis[0], ci, cj)
    sch[local].unroll(ci)
    sch[local].vectorize(cj)
    return sch


def reduction_schedule(c: Tensor) -> Schedule:
    """The reductions outside the innermost axis, which is vectorized when a vector divides it."""
    sch = create_schedule(c)
    st = sch[c]
    *outer, n = st.axis
    reduce = list(st.reduce_axis)
    factor = next((f for f in VECTOR_FACTORS if n.extent % f == 0), 0)
    if factor:
        no, ni = st.split(n, factor)
        st.reorder(*outer, no, *reduce, ni)
        st.vectorize(ni)
    else:
        st.reorder(*outer, *reduce, n)
    return sch


def steps_graph(graph: Graph, values: Graph, steps: list[Step]) -> Graph:
    """A graph with one node per step, for memory planning (bool values take C ints)."""
    g = Graph(f"{graph.name}.kernels")
    for v in graph.inputs:
        g.add_input(v, graph.type_of(v).shape, graph.type_of(v).dtype)
    for step in steps:
        for v in step.reads:
            if v in values.constants and v not in g.types:
                g.add_constant(v, values.constants[v])
        types = []
        for v in step.writes:
            t = values.type_of(v)
            types.append(TensorType(t.shape, "int32") if t.dtype == "bool" else t)
        g.add_node(
            "kernel",
            list(step.reads),
            types,
            name=step.kernel.symbol,
            output_names=list(step.writes),
        )
    for v in graph.outputs:
        t = graph.type_of(v)
        if v not in g.types and t.size == 0:  # no step writes an empty output: nothing to write
            g.add_constant(v, np.zeros(t.shape, "int32" if t.dtype == "bool" else t.dtype))
    g.set_outputs(graph.outputs)
    return g


def lower_model(
    plan: FusionPlan, configs: Configs | None = None, target: str = "host", threads: int = 1
) -> tuple[list[Step], Graph]:
    """The steps of `plan` in call order, and the graph holding every value they pass; anchors
    without a config take `default_config` for `threads` threads."""
    lowering = _Lowering(plan, configs or {}, target, threads)
    return lowering.lower(), lowering.values

"""Layout transformation: NCHW convolutions and what follows them run in NCHW[x]c.

`to_nchwc` rewrites every conv2d with constant weights (groups 1, depthwise, or grouped 1x1) to
`conv2d_nchwc`, with its weights (and bias) packed into new constants at compile time. Data stays
blocked between layout-aware ops: elementwise ops, broadcasting binary ops with a per-channel
(or scalar) constant (the constant is re-laid out at compile time) or another blocked value of
the same channels, pools, and channel concats of values in one blocked layout.
`layout_transform` nodes appear only at the boundaries: where a graph input enters a
convolution, where blocked data reaches an op that stays NCHW or a graph output, and between two
block sizes. Every value's NCHW form keeps its original name, so graph
inputs and outputs keep theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from compiler.graph.ir import Graph, GraphError, Node
from compiler.graph.ops import conv2d_template
from compiler.graph.ops_layout import NCHW, blocked, channel_tables, convert, layout_block
from compiler.graph.passes.rewrite import apply_renames, finish, node_label
from compiler.graph.registry import get_op
from compiler.ops.layout import pack_bias, pack_conv_weight, pack_depthwise_weight
from compiler.ops.util import VECTOR_LANES

BlockFn = Callable[[int], int]
ConvBlocks = Mapping[str, tuple[int, int]]  # conv node name -> (input block, output block)

ELEMENTWISE = frozenset(
    {
        "relu",
        "sigmoid",
        "tanh",
        "erf",
        "sqrt",
        "exp",
        "log",
        "neg",
        "hard_swish",
        "identity",
        "clip",
    }
    | {"cast"}
    | {"floor", "ceil", "round", "sin", "cos", "tan", "asin", "acos", "atan"}
    | {"sinh", "cosh", "asinh", "acosh", "atanh", "isnan", "isinf", "bitwise_not"}
)
BROADCASTING = frozenset({"add", "sub", "mul", "div", "pow"})
POOLS = {p: f"{p}_nchwc" for p in ("max_pool2d", "avg_pool2d", "global_avg_pool2d")}
# Output block of a 1x1 convolution whose channels it divides: two vectors of output channels
# per register tile row. The 1x1 template's tile is reg_n pixels x one block, so with blocks of
# one vector every FMA waits on a broadcast of an input value; with two, half as many.
WIDE_1X1_BLOCK = 2 * VECTOR_LANES


def default_block(channels: int) -> int:
    """The largest divisor of `channels` up to one vector of float32 lanes (16) that is a whole
    half vector (8 lanes: 24 channels take blocks of 8, not 12), else the largest multiple of 4
    up to two vectors (60 take blocks of 20, not 15: ShuffleNet-style zoo net 1.65 -> 1.31 ms
    untuned, its grouped convolutions' 20-channel groups and the depthwise ones between them in
    one block), else the largest divisor.

    Past 4 vectors of channels that no whole vector divides (a 1000-class head), the largest
    multiple of 8 up to 64 that divides them: 1000 takes blocks of 40, not 8. A block of 8 ran
    SqueezeNet's 512 -> 1000 1x1 head at 13x13 on half-width vectors, re-reading the whole input
    once per 8 channels: 2.08 ms untuned against 0.89 with blocks of 40 (AVX-512, one core).
    """
    if channels % VECTOR_LANES and channels > 4 * VECTOR_LANES:
        wide = [d for d in range(8, 4 * VECTOR_LANES + 1, 8) if channels % d == 0]
        if wide:
            return max(wide)
    fits = [d for d in range(1, min(channels, VECTOR_LANES) + 1) if channels % d == 0]
    halves = [d for d in fits if d % (VECTOR_LANES // 2) == 0]
    if halves:
        return max(halves)
    quarters = [d for d in range(4, min(channels, 2 * VECTOR_LANES) + 1, 4) if channels % d == 0]
    return max(quarters or fits)


def grouped_block(channels: int) -> int:
    """The output block of a grouped 1x1 convolution with `channels` output channels per group:
    a whole vector where one divides them, else the widest multiple of 8 up to 64 that does
    (40 per group take blocks of 40, not 8), else `default_block`. A group's reduction is short
    (its IC/groups channels), so a wide block reads each input value for more outputs:
    ShuffleNet-style zoo net 1.45 -> 1.31 ms untuned (AVX-512, one core)."""
    if channels % VECTOR_LANES == 0:
        return VECTOR_LANES
    wide = [d for d in range(8, 4 * VECTOR_LANES + 1, 8) if channels % d == 0]
    return max(wide) if wide else default_block(channels)


class _Rewriter:
    """Builds the NCHW[x]c graph, tracking each original value's forms in the new graph."""

    def __init__(self, src: Graph, block: BlockFn, conv_blocks: ConvBlocks) -> None:
        self.src = src
        self.block = block
        self.conv_blocks = conv_blocks
        self.g = Graph(src.name)
        self.home: dict[str, str] = {}  # the layout each original value is produced in
        self.forms: dict[str, dict[str, str]] = {}  # original value -> layout -> new name
        self.packed: dict[tuple[str, str, int, int], str] = {}
        self.consumers = src.consumers()
        self.producers = src.producers()
        for v in src.inputs:
            self.g.add_input(v, src.type_of(v).shape, src.type_of(v).dtype)
            self._define(v, NCHW, v)
        for v, arr in src.constants.items():
            self.g.add_constant(v, arr)
            self._define(v, NCHW, v)

    def _define(self, original: str, layout: str, name: str) -> None:
        self.home.setdefault(original, layout)
        self.forms.setdefault(original, {})[layout] = name

    def fresh(self, hint: str) -> str:
        while True:
            name = self.g.fresh_name(hint)
            if name not in self.src.types:
                return name

    def channel_block(self, channels: int, what: str) -> int:
        b = int(self.block(channels))
        if b < 1 or channels % b:
            raise GraphError(f"to_nchwc: block {b} for {channels} channels ({what}) must divide")
        return b

    def value_in(self, v: str, layout: str) -> str:
        """The name of original value `v` in `layout`, adding a transform on first request."""
        forms = self.forms[v]
        if layout in forms:
            return forms[layout]
        src_layout = self.home[v]
        src_name = forms[src_layout]
        name = v if layout == NCHW else self.fresh(f"{v}_{layout.lower()}")
        if src_name in self.g.constants:
            self.g.add_constant(name, convert(self.g.constants[src_name], src_layout, layout))
        else:
            (t,) = get_op("layout_transform").infer(
                [self.g.type_of(src_name)], {"src_layout": src_layout, "dst_layout": layout}
            )
            self.g.add_node(
                "layout_transform",
                [src_name],
                [t],
                {"src_layout": src_layout, "dst_layout": layout},
                output_names=[name],
            )
        forms[layout] = name
        return name

    def blocked_home(self, v: str) -> int:
        return layout_block(self.home[v])

    # -- per node -------------------------------------------------------------------------------

    def visit(self, node: Node) -> None:
        if node.op == "conv2d" and self.conv(node):
            return
        if node.op in POOLS and self.blocked_home(node.inputs[0]):
            self.carry_unary(node, POOLS[node.op])
            return
        if node.op in ELEMENTWISE and len(node.inputs) == 1 and self.blocked_home(node.inputs[0]):
            self.carry_unary(node, node.op)
            return
        if node.op in BROADCASTING and self.broadcast(node):
            return
        if node.op == "concat" and self.concat(node):
            return
        if node.op == "gather" and self.gather_channels(node):
            return
        inputs = [self.value_in(v, NCHW) for v in node.inputs]
        types = [self.src.type_of(v) for v in node.outputs]
        self.g.add_node(node.op, inputs, types, node.attrs, node.name, output_names=node.outputs)
        for v in node.outputs:
            self._define(v, NCHW, v)

    def carry_unary(self, node: Node, op: str) -> None:
        """Emit `op` on the blocked form its one input was produced in."""
        x = node.inputs[0]
        self.carry(node, op, [self.forms[x][self.home[x]]], self.home[x])

    def carry(
        self, node: Node, op: str, inputs: list[str], layout: str, attrs: dict | None = None
    ) -> None:
        """Emit `op` on already-converted `inputs`; its one output is produced in `layout`."""
        attrs = dict(node.attrs) if attrs is None else attrs
        types = get_op(op).infer([self.g.type_of(v) for v in inputs], attrs)
        (y,) = node.outputs
        name = self.fresh(f"{y}_{layout.lower()}")
        self.g.add_node(op, inputs, types, attrs, node.name, output_names=[name])
        self._define(y, layout, name)

    def concat(self, node: Node) -> bool:
        """A channel concat of values all produced in one blocked layout stays in it: axis 1 of
        NCHW[x]c counts channel blocks, so joining along it joins the channels (the branches of
        an inception block, a fire module, a dense block), with no transform either side."""
        axis = int(node.attrs.get("axis", 0))
        if len(self.src.type_of(node.outputs[0]).shape) != 4 or axis not in (1, -3):
            return False
        homes = {self.home[v] for v in node.inputs}
        if len(homes) != 1:
            return False
        (layout,) = homes
        if not layout_block(layout):
            return False
        inputs = [self.forms[v][layout] for v in node.inputs]
        self.carry(node, "concat", inputs, layout, {**node.attrs, "axis": 1})
        return True

    def conv(self, node: Node) -> bool:
        src = self.src
        x, w = node.inputs[0], node.inputs[1]
        xt, wt = src.type_of(x), src.type_of(w)
        if len(xt.shape) != 4 or not all(v in src.constants for v in node.inputs[1:]):
            return False
        template = conv2d_template(xt, wt, node.attrs)
        groups = int(node.attrs.get("groups", 1))
        oc, ic = wt.shape[0], xt.shape[1]
        if template == "depthwise_conv2d_nchwc":
            icb = ocb = self.input_block(x, ic, node)
        elif groups == 1:
            stem = template == "conv2d_stem_nchwc"
            icb = ic if stem else self.input_block(x, ic, node)
            if template == "conv2d_1x1_nchwc" and self.widens(node, oc):
                ocb = WIDE_1X1_BLOCK
            else:
                ocb = self.channel_block(oc, f"output of {node_label(node)}")
        elif template == "grouped_conv2d_1x1_nchwc":
            # blocks of one group's channels: each output block reads whole blocks of its group
            icb = self.input_block(x, ic // groups, node)
            if self.block is default_block:
                ocb = grouped_block(oc // groups)
            else:
                ocb = self.channel_block(oc // groups, f"output of {node_label(node)} per group")

        else:
            return False  # grouped, not 1x1, not depthwise: stays NCHW
        if node.name and node.name in self.conv_blocks:
            icb, ocb = self.chosen_blocks(node, template, ic, oc, groups)
        depthwise = template == "depthwise_conv2d_nchwc"
        inputs = [self.value_in(x, blocked(icb)), self.pack(w, "weight", icb, ocb, depthwise)]
        if len(node.inputs) > 2:
            inputs.append(self.pack(node.inputs[2], "bias", icb, ocb, depthwise))
        attrs = {**node.attrs, "groups": groups, "ic_block": icb, "oc_block": ocb}
        attrs["template"] = template
        self.carry(node, "conv2d_nchwc", inputs, blocked(ocb), attrs)
        return True

    def gather_channels(self, node: Node) -> bool:
        """A gather of channels (axis 1, constant indices) of a blocked value stays blocked, as
        `gather_channels_nchwc` by constant tables: ShuffleNet's shuffle between a grouped
        convolution and a depthwise one, which ran through NCHW and back (two transforms)."""
        src = self.src
        x, indices = node.inputs
        block = self.blocked_home(x)
        axis = int(node.attrs.get("axis", 0))
        shape = src.type_of(x).shape
        if not block or len(shape) != 4 or axis not in (1, -3) or indices not in src.constants:
            return False
        idx = np.asarray(src.constants[indices]).astype(np.int64)
        if idx.ndim != 1 or not idx.size or idx.min() < -shape[1] or idx.max() >= shape[1]:
            return False
        idx = np.where(idx < 0, idx + shape[1], idx)
        out_block = block if idx.size % block == 0 else self.channel_block(idx.size, "gather")
        tables = channel_tables(idx, block, out_block)
        names = [
            self.g.add_constant(self.fresh(f"{indices}_{k}"), t)
            for k, t in zip(("blocks", "lanes"), tables, strict=True)
        ]
        inputs = [self.forms[x][self.home[x]], *names]
        self.carry(node, "gather_channels_nchwc", inputs, blocked(out_block), {})
        return True

    def widens(self, node: Node, oc: int) -> bool:
        """Whether a 1x1 convolution's output takes WIDE_1X1_BLOCK: with the default blocks
        (a block function of the caller's is kept to), where it divides the channels, and where
        no concat joins the output (or an elementwise result of it) with values in other blocks
        (an inception branch, a fire module's expand: the concat and what follows would run
        NCHW), nor an add with a value of another block (ResNet-18's downsample)."""
        if self.block is not default_block or oc % WIDE_1X1_BLOCK:
            return False
        frontier = list(node.outputs)
        for _ in range(8):  # through the elementwise ops that carry the block (bias, relu, ...)
            users = [u for v in frontier for u in self.consumers.get(v, [])]
            if any(u.op == "concat" for u in users):
                return False
            for u in users:  # a residual add with a value in another block would transform
                partners = [
                    v for v in u.inputs if v not in frontier and v not in self.src.constants
                ]
                if u.op in BROADCASTING and any(not self.wide_source(v) for v in partners):
                    return False
            frontier = [o for u in users if u.op in ELEMENTWISE | BROADCASTING for o in u.outputs]
            if not frontier:
                return True
        return True

    def wide_source(self, v: str) -> bool:
        """Whether value `v` is (or will be) in WIDE_1X1_BLOCK: made by a 1x1 convolution of
        channels it divides, through elementwise ops."""
        if v in self.home:
            return layout_block(self.home[v]) == WIDE_1X1_BLOCK
        for _ in range(8):
            node = self.producers.get(v)
            if node is None:
                return False
            if node.op == "conv2d":
                xt, wt = self.src.type_of(node.inputs[0]), self.src.type_of(node.inputs[1])
                template = conv2d_template(xt, wt, node.attrs) if len(xt.shape) == 4 else None
                return template == "conv2d_1x1_nchwc" and wt.shape[0] % WIDE_1X1_BLOCK == 0
            if node.op not in ELEMENTWISE | BROADCASTING:
                return False
            v = node.inputs[0]
        return False

    def input_block(self, x: str, ic: int, node: Node) -> int:
        """The block a conv reads `x` in: the one it was produced in (no transform), else the
        default for its channels."""
        home = self.blocked_home(x)
        if home and ic % home == 0:
            return home
        return self.channel_block(ic, f"input of {node_label(node)}")

    def chosen_blocks(
        self, node: Node, template: str, ic: int, oc: int, groups: int = 1
    ) -> tuple[int, int]:
        """The (input, output) blocks `conv_blocks` names for a conv, checked against it (a
        grouped 1x1's against one group's channels)."""
        icb, ocb = (int(b) for b in self.conv_blocks[node.name])
        where = f"to_nchwc: blocks ({icb}, {ocb}) for {node_label(node)}"
        if template == "grouped_conv2d_1x1_nchwc":
            ic, oc = ic // groups, oc // groups
        if icb < 1 or ocb < 1 or ic % icb or oc % ocb:
            raise GraphError(f"{where} must divide its {ic} input and {oc} output channels")
        if template == "depthwise_conv2d_nchwc" and icb != ocb:
            raise GraphError(f"{where}: a depthwise convolution has one channel block")
        if template == "conv2d_stem_nchwc" and icb != ic:
            raise GraphError(f"{where}: a stem convolution takes its {ic} channels in one block")
        return icb, ocb

    def pack(self, const: str, role: str, icb: int, ocb: int, depthwise: bool) -> str:
        key = (const, role, icb, -ocb if depthwise else ocb)
        if key not in self.packed:
            arr = self.src.constants[const]
            if role == "bias":
                packed = pack_bias(arr, ocb)
            elif depthwise:
                packed = pack_depthwise_weight(arr, ocb)
            else:  # groups 1, or a grouped 1x1's [OC][IC/groups][1][1]
                packed = pack_conv_weight(arr, icb, ocb)
            self.packed[key] = self.g.add_constant(self.fresh(f"{const}_packed"), packed)
        return self.packed[key]

    def broadcast(self, node: Node) -> bool:
        """Emit a binary op in NCHW[x]c if one input is blocked and the other can follow."""
        src = self.src
        (y,) = node.outputs
        out = src.type_of(y)
        layout = next(
            (self.home[v] for v in node.inputs if self.blocked_home(v) and v not in src.constants),
            None,
        )
        if layout is None or len(out.shape) != 4:
            return False
        b, channels = layout_block(layout), out.shape[1]
        inputs = []
        for v in node.inputs:
            t = src.type_of(v)
            if v in src.constants:
                packed = _relayout_constant(src.constants[v], channels, b)
                if packed is None:
                    return False
                if packed.ndim:  # a scalar broadcasts the same in any layout: used as it is
                    v = self.g.add_constant(self.fresh(f"{v}_{layout.lower()}"), packed)
                inputs.append(v)
            elif len(t.shape) == 4 and t.shape[1] == channels:
                inputs.append(self.value_in(v, layout))
            else:
                return False
        self.carry(node, node.op, inputs, layout)
        return True


def _relayout_constant(value: np.ndarray, channels: int, block: int) -> np.ndarray | None:
    """A constant broadcasting over NCHW data, laid out to broadcast the same over NCHW[x]c."""
    if value.ndim == 0:
        return value
    if value.ndim > 4:
        return None
    n, c, h, w = (1,) * (4 - value.ndim) + value.shape
    four = value.reshape(n, c, h, w)
    if c == 1:
        return four.reshape(n, 1, h, w, 1)
    if c != channels:
        return None
    return np.ascontiguousarray(four.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def to_nchwc(
    graph: Graph, block: BlockFn = default_block, conv_blocks: ConvBlocks | None = None
) -> Graph:
    """A new graph computing `graph`'s outputs with convolutions in NCHW[x]c.

    `block(channels)` picks the channel block of every blocked value (it must divide channels);
    a stem convolution (few input channels) takes all its input channels in one block.
    `conv_blocks` overrides the (input, output) blocks of the convolutions it names (by node
    name): a tuned config's blocks. A conv's input is converted to its block where its producer
    made another (ops between convs follow their input's block).

    Guarantees: the same inputs and outputs (names, types, values up to float rounding);
    transforms only at boundaries (see the module docstring), each value converted at most once
    per layout; constants never need a transform (they are converted at compile time); the
    NCHW weights are dropped once nothing reads them. `graph` itself is not modified.
    """
    rw = _Rewriter(graph, block, conv_blocks or {})
    for node in graph.nodes:
        rw.visit(node)
    rw.g.outputs = [rw.value_in(v, NCHW) for v in graph.outputs]
    return cancel_layout_transforms(finish(rw.g))


def cancel_layout_transforms(graph: Graph) -> Graph:
    """A copy of `graph` where transforms of transforms are shortened.

    Guarantees: a layout_transform reading another's output reads that one's input instead (its
    source layout adjusted); a transform back to the layout its input started in, and a transform
    to the same layout, disappear (readers read the original value; a graph output so replaced
    takes the original's name); transforms nothing reads any more are dropped.
    """
    g = graph.copy()
    renames: dict[str, str] = {}
    made: dict[str, Node] = {}
    kept: list[Node] = []
    for node in g.nodes:
        node.inputs = [renames.get(v, v) for v in node.inputs]
        if node.op == "layout_transform":
            first = made.get(node.inputs[0])
            if first is not None:
                node.inputs = [first.inputs[0]]
                node.attrs = {**node.attrs, "src_layout": first.attrs["src_layout"]}
            if node.attrs["src_layout"] == node.attrs["dst_layout"]:
                renames[node.outputs[0]] = node.inputs[0]
                continue
            made[node.outputs[0]] = node
        kept.append(node)
    g.nodes = kept
    apply_renames(g, renames)
    live = set(g.outputs)
    needed: list[Node] = []
    for n in reversed(g.nodes):
        if n.op != "layout_transform" or any(v in live for v in n.outputs):
            needed.append(n)
            live.update(n.inputs)
    g.nodes = needed[::-1]
    return finish(g)

"""Inference-time simplification: batch norms and per-channel scales folded into convolutions.

At inference a batch norm is an affine map per channel, y = x * s + t with
s = scale / sqrt(var + eps) and t = bias - mean * s. After a convolution whose output nothing
else reads, it becomes part of the convolution: weights w[o] * s[o], bias b[o] * s[o] + t[o].
Scale factors and shifts are computed in float64 and rounded once to the weights' dtype.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node
from compiler.graph.passes.rewrite import finish

# Binary ops fold_scale_into_conv folds, and on which side the constant may stand.
_FOLDABLE = {"mul": (0, 1), "add": (0, 1), "sub": (1,), "div": (1,)}


class _Convs:
    """The conv2d nodes of a graph being rewritten whose weights and bias are constants."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        readers: dict[str, int] = {}
        for n in graph.nodes:
            for v in dict.fromkeys(n.inputs):
                readers[v] = readers.get(v, 0) + 1
        for v in graph.outputs:
            readers[v] = readers.get(v, 0) + 1
        self.readers = readers
        self.by_output: dict[str, Node] = {}

    def note(self, node: Node) -> None:
        if node.op == "conv2d" and all(v in self.graph.constants for v in node.inputs[1:]):
            self.by_output[node.outputs[0]] = node

    def sole_producer(self, value: str) -> Node | None:
        """The foldable conv2d defining `value` when exactly one node (and no output) reads it."""
        return self.by_output.get(value) if self.readers.get(value, 0) == 1 else None

    def rewrite(self, conv: Node, new_output: str, scale: np.ndarray, shift: np.ndarray) -> None:
        """Make `conv` compute conv(x) * scale + shift per output channel, into `new_output`."""
        g = self.graph
        w = g.constants[conv.inputs[1]]
        channels = w.shape[0]
        b = g.constants[conv.inputs[2]] if len(conv.inputs) > 2 else np.zeros(channels, w.dtype)
        new_w = (w.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(w.dtype)
        new_b = (b.astype(np.float64) * scale + shift).astype(w.dtype)
        conv.inputs = [
            conv.inputs[0],
            g.add_constant(g.fresh_name(f"{conv.inputs[1]}_folded"), new_w),
            g.add_constant(g.fresh_name(f"{conv.outputs[0]}_bias"), new_b),
        ]
        del self.by_output[conv.outputs[0]]
        conv.outputs = [new_output]
        self.by_output[new_output] = conv


def _per_channel(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (-1,) + (1,) * max(len(shape) - 2, 0)


def fold_batch_norm(graph: Graph) -> Graph:
    """A copy of `graph` without inference batch norms whose parameters are constants.

    Guarantees: `conv2d -> batch_norm`, where the convolution's weights (and bias, if any) are
    constants and only the batch norm reads its output, becomes one conv2d with scaled weights and
    a bias, defining the batch norm's output; any other such batch norm becomes
    `mul(x, s) -> add(., t)` with per-channel constants shaped to broadcast over axis 1. Outputs
    equal the original's up to float rounding. `graph` itself is not modified.
    """
    g = graph.copy()
    convs = _Convs(g)
    nodes, g.nodes = g.nodes, []
    for node in nodes:
        params = node.inputs[1:]
        if node.op != "batch_norm" or not all(v in g.constants for v in params):
            convs.note(node)
            g.nodes.append(node)
            continue
        scale, bias, mean, var = (g.constants[v].astype(np.float64) for v in params)
        s = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
        t = bias - mean * s
        x, (y,) = node.inputs[0], node.outputs
        conv = convs.sole_producer(x)
        if conv is not None:
            convs.rewrite(conv, y, s, t)
            continue
        xt = g.type_of(x)
        shape = _per_channel(xt.shape)
        s_name = g.add_constant(g.fresh_name("bn_scale"), s.astype(xt.dtype).reshape(shape))
        t_name = g.add_constant(g.fresh_name("bn_shift"), t.astype(xt.dtype).reshape(shape))
        (scaled,) = g.add_node(
            "mul", [x, s_name], [xt], name=f"{node.name}_scale" if node.name else ""
        )
        del g.types[y]  # redefined just below by the add
        g.add_node("add", [scaled, t_name], [xt], name=node.name, output_names=[y])
    return finish(g)


def _channel_vector(value: np.ndarray, channels: int) -> np.ndarray | None:
    """`value` as a [channels] float64 vector if it broadcasts per channel over NCHW data."""
    if value.ndim > 4:
        return None
    shape = (1,) * (4 - value.ndim) + value.shape
    if shape[0] != 1 or shape[2:] != (1, 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(shape[1]), (channels,)).astype(np.float64)


def fold_scale_into_conv(graph: Graph) -> Graph:
    """A copy of `graph` where per-channel constant scales and shifts live in conv weights.

    Guarantees: `conv2d -> mul/add` (constant on either side) and `conv2d -> sub/div` (constant
    on the right), where the convolution has constant weights (and bias), only that op reads its
    output, and the constant broadcasts per output channel over NCHW (shape [C,1,1], [1,C,1,1],
    or a scalar), become one conv2d with new weights/bias defining the op's output; chains (conv
    -> mul -> add) fold completely. A division by a constant with a zero is not folded. Outputs
    equal the original's up to float rounding. `graph` itself is not modified.
    """
    g = graph.copy()
    convs = _Convs(g)
    kept: list[Node] = []
    for node in g.nodes:
        folded = node.op in _FOLDABLE and len(node.inputs) == 2 and _fold_one(g, convs, node)
        if not folded:
            convs.note(node)
            kept.append(node)
    g.nodes = kept
    return finish(g)


def _fold_one(g: Graph, convs: _Convs, node: Node) -> bool:
    for const_side in _FOLDABLE[node.op]:
        k, x = node.inputs[const_side], node.inputs[1 - const_side]
        conv = convs.sole_producer(x) if k in g.constants else None
        if conv is None or g.type_of(node.outputs[0]) != g.type_of(x):
            continue
        vec = _channel_vector(g.constants[k], g.type_of(x).shape[1])
        if vec is None or (node.op == "div" and not np.all(vec)):
            continue
        ones, zeros = np.ones_like(vec), np.zeros_like(vec)
        scale, shift = {
            "mul": (vec, zeros),
            "div": (1.0 / vec, zeros),
            "add": (ones, vec),
            "sub": (ones, -vec),
        }[node.op]
        convs.rewrite(conv, node.outputs[0], scale, shift)
        return True
    return False

"""ONNX Einsum, lowered at import into transpose / reshape / gather / reduce_sum / matmul.

The equation (numpy's notation: explicit `->` output or the implicit one, `...` for broadcast
axes) is read into one label per axis of every operand. Each operand then loses, in order:
- a repeated label (a diagonal, "ii"): the two axes moved last, merged, and a `gather` of the
  static positions k * (n + 1);
- a label no other operand and not the output has: a `reduce_sum`.
Operands are then combined left to right: the labels both share are batch axes when still
needed (by the output or a later operand) and contracted otherwise, so each pair is one
`matmul` of [batch, M, K] by [batch, K, N] between reshapes and transposes. A transpose puts
the last result's labels in the output's order. Size-1 broadcast axes are expanded first.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

import numpy as np

from compiler.frontend.onnx_context import ImportContext
from compiler.frontend.onnx_ops import converter
from compiler.graph.ir import GraphError

ELLIPSIS = "..."


@dataclass
class Operand:
    """A value with one label per axis (broadcast axes are labelled '.0', '.1', ...)."""

    value: str
    labels: list[str]


def parse_equation(equation: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """The labels of each operand's axes and of the output's, for operands of `ranks`."""
    text = equation.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise GraphError(f"equation {equation!r} has {len(terms)} operands, the node {len(ranks)}")
    letters = set(string.ascii_letters)
    broadcast = 0
    for term, rank in zip(terms, ranks, strict=True):
        named = len(term.replace(ELLIPSIS, ""))
        if ELLIPSIS in term:
            broadcast = max(broadcast, rank - named)

    def labels_of(term: str, rank: int | None) -> list[str]:
        head, dots, tail = term.partition(ELLIPSIS)
        if any(c not in letters for c in head + tail):
            raise GraphError(f"equation {equation!r}: term {term!r} has a character not a letter")
        width = broadcast if rank is None else rank - len(head) - len(tail)
        if not dots and width != 0:
            raise GraphError(f"equation {equation!r}: term {term!r} does not fit rank {rank}")
        if width < 0:
            raise GraphError(f"equation {equation!r}: term {term!r} has more labels than axes")
        dims = [f".{broadcast - width + k}" for k in range(width)] if dots else []
        return [*head, *dims, *tail]

    inputs = [labels_of(t, r) for t, r in zip(terms, ranks, strict=True)]
    if arrow:
        output = labels_of(rhs, None)
    else:
        counts: dict[str, int] = {}
        for labels in inputs:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        dims = [f".{k}" for k in range(broadcast)]
        output = dims + sorted(k for k, n in counts.items() if n == 1 and k in letters)
    if len(set(output)) != len(output):
        raise GraphError(f"equation {equation!r}: the output repeats a label")
    missing = [lab for lab in output if not any(lab in labels for labels in inputs)]
    if missing:
        raise GraphError(f"equation {equation!r}: output labels {missing} are in no operand")
    return inputs, output


class _Lowering:
    def __init__(self, ctx: ImportContext, output: list[str]) -> None:
        self.ctx = ctx
        self.output = output
        self.sizes: dict[str, int] = {}

    def shape(self, op: Operand) -> tuple[int, ...]:
        return self.ctx.type_of(op.value).shape

    def emit(self, graph_op: str, inputs: list[str], attrs: dict) -> str:
        return self.ctx.emit(graph_op, inputs, attrs)[0]

    def transpose(self, op: Operand, labels: list[str]) -> Operand:
        if labels == op.labels:
            return op
        perm = tuple(op.labels.index(lab) for lab in labels)
        return Operand(self.emit("transpose", [op.value], {"perm": perm}), labels)

    def reshape(self, value: str, shape: tuple[int, ...]) -> str:
        if self.ctx.type_of(value).shape == shape:
            return value
        return self.emit("reshape", [value], {"shape": shape})

    def diagonal(self, op: Operand) -> Operand:
        """`op` with every repeated label taken once (the diagonal of its axes)."""
        while len(set(op.labels)) != len(op.labels):
            label = next(lab for lab in op.labels if op.labels.count(lab) > 1)
            first = op.labels.index(label)
            second = op.labels.index(label, first + 1)
            n = self.shape(op)[first]
            if self.shape(op)[second] != n:
                raise GraphError(f"label {label!r} has sizes {n} and {self.shape(op)[second]}")
            rest = [lab for k, lab in enumerate(op.labels) if k not in (first, second)]
            perm = [k for k in range(len(op.labels)) if k not in (first, second)]
            moved = self.emit("transpose", [op.value], {"perm": (*perm, first, second)})
            shape = self.ctx.type_of(moved).shape
            flat = self.reshape(moved, (*shape[:-2], n * n))
            positions = self.ctx.constant(np.arange(n, dtype=np.int64) * (n + 1), "diagonal")
            taken = self.emit("gather", [flat, positions], {"axis": len(shape) - 2})
            op = Operand(taken, [*rest, label])
        return op

    def sum_out(self, op: Operand, keep: set[str]) -> Operand:
        gone = [k for k, lab in enumerate(op.labels) if lab not in keep]
        if not gone:
            return op
        value = self.emit("reduce_sum", [op.value], {"axes": tuple(gone), "keepdims": False})
        return Operand(value, [lab for lab in op.labels if lab in keep])

    def broadcast(self, op: Operand) -> Operand:
        """`op` with its size-1 axes expanded to their label's size elsewhere."""
        want = tuple(self.sizes[lab] for lab in op.labels)
        if want == self.shape(op):
            return op
        return Operand(self.emit("expand", [op.value], {"shape": want}), op.labels)

    def combine(self, a: Operand, b: Operand, keep: set[str]) -> Operand:
        """The product of `a` and `b` summed over their shared labels not in `keep`."""
        batch = [lab for lab in a.labels if lab in b.labels and lab in keep]
        contract = [lab for lab in a.labels if lab in b.labels and lab not in keep]
        a_only = [lab for lab in a.labels if lab not in b.labels]
        b_only = [lab for lab in b.labels if lab not in a.labels]
        size = self.sizes
        bt = math.prod(size[lab] for lab in batch)
        m = math.prod(size[lab] for lab in a_only)
        k = math.prod(size[lab] for lab in contract)
        n = math.prod(size[lab] for lab in b_only)
        lead = (bt,) if batch else ()
        left = self.reshape(self.transpose(a, batch + a_only + contract).value, (*lead, m, k))
        right = self.reshape(self.transpose(b, batch + contract + b_only).value, (*lead, k, n))
        product = self.emit("matmul", [left, right], {})
        labels = batch + a_only + b_only
        return Operand(self.reshape(product, tuple(size[lab] for lab in labels)), labels)

    def run(self, operands: list[Operand]) -> str:
        for op in operands:
            for lab, d in zip(op.labels, self.shape(op), strict=True):
                if d != 1 and self.sizes.get(lab, 1) not in (1, d):
                    raise GraphError(f"label {lab!r} has sizes {self.sizes[lab]} and {d}")
                self.sizes[lab] = max(d, self.sizes.get(lab, 1))
        operands = [self.diagonal(op) for op in operands]
        for i, op in enumerate(operands):
            others = {lab for k, o in enumerate(operands) if k != i for lab in o.labels}
            operands[i] = self.broadcast(self.sum_out(op, others | set(self.output)))
        result = operands[0]
        for i in range(1, len(operands)):
            keep = {lab for o in operands[i + 1 :] for lab in o.labels} | set(self.output)
            result = self.combine(result, operands[i], keep)
        result = self.sum_out(result, set(self.output))
        return self.transpose(result, self.output).value


@converter("Einsum")
def _einsum(ctx: ImportContext) -> None:
    equation = ctx.attr("equation")
    if not isinstance(equation, str) or not equation.strip():
        raise GraphError("the equation attribute is required")
    values = [ctx.input(i) for i in range(len(ctx.node.input))]
    dtypes = {ctx.type_of(v).dtype for v in values}
    if len(dtypes) != 1:
        raise GraphError(f"operands must share one dtype, got {sorted(dtypes)}")
    ranks = [len(ctx.type_of(v).shape) for v in values]
    inputs, output = parse_equation(equation, ranks)
    lowering = _Lowering(ctx, output)
    operands = [Operand(v, labels) for v, labels in zip(values, inputs, strict=True)]
    ctx.bind(0, lowering.run(operands))

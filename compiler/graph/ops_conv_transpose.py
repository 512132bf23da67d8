"""Graph ops of transposed convolutions: `conv_transpose1d`, `conv_transpose2d`, `conv_transpose3d`.

`conv_transposeNd(x, w[, b]; strides, pads, dilations, groups, output_padding)`: data
[N, C, *spatial], weights [C, O / groups, *kernel] (ONNX's layout), bias [O]. Every input
position i and kernel tap k add x[i] * w[k] to output position i * stride + k * dilation - pad.
REDUCTION: the te compute (`te_conv_transpose`) sums, per output position, over the group's
input channels and every kernel tap whose source position is a whole input position (see the
compute's docstring for its cost).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.graph.ir import TensorType
from compiler.graph.ops_util import (
    expect_float,
    expect_inputs,
    expect_rank,
    fail,
    int_attr,
    int_tuple,
)
from compiler.graph.registry import Category, InferFn, OpDef, ReferenceFn, register

Attrs = Mapping[str, Any]


@dataclass(frozen=True)
class ConvTransposeGeometry:
    """A transposed convolution's attributes over `rank` spatial axes.

    `pads` are (begin..., end...) crops of the full output, which is
    stride * (size - 1) + output_padding + dilation * (kernel - 1) + 1 long per axis; a negative
    pad (ONNX's output_shape larger than the full output) adds zeros there instead.
    """

    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    output_padding: tuple[int, ...]
    groups: int

    @property
    def rank(self) -> int:
        return len(self.strides)

    def full(self, axis: int, size: int, kernel: int) -> int:
        """Length of the uncropped output along spatial `axis`."""
        s, d = self.strides[axis], self.dilations[axis]
        return s * (size - 1) + self.output_padding[axis] + d * (kernel - 1) + 1

    def out(self, axis: int, size: int, kernel: int) -> int:
        return self.full(axis, size, kernel) - self.pads[axis] - self.pads[self.rank + axis]


def conv_transpose_geometry(op: str, attrs: Attrs, rank: int) -> ConvTransposeGeometry:
    """The attributes of conv_transpose{rank}d `op`, checked (GraphError naming the bad one)."""
    geometry = ConvTransposeGeometry(
        strides=int_tuple(op, attrs, "strides", rank, 1),
        pads=int_tuple(op, attrs, "pads", 2 * rank, 0),
        dilations=int_tuple(op, attrs, "dilations", rank, 1),
        output_padding=int_tuple(op, attrs, "output_padding", rank, 0),
        groups=int_attr(op, attrs, "groups", 1),
    )
    if geometry.groups < 1:
        raise fail(op, f"groups {geometry.groups} must be >= 1")
    if min(geometry.strides) < 1 or min(geometry.dilations) < 1:
        raise fail(op, f"strides {geometry.strides} / dilations {geometry.dilations} must be >= 1")
    if min(geometry.output_padding) < 0:
        raise fail(op, f"output_padding {geometry.output_padding} must be >= 0")
    return geometry


def _convt_infer(op: str, rank: int) -> InferFn:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        expect_inputs(op, inputs, 2, 3)
        x, w = inputs[0], inputs[1]
        expect_rank(op, "data", x, rank + 2)
        expect_rank(op, "weight", w, rank + 2)
        expect_float(op, "data", x)
        dtypes = {t.dtype for t in inputs}
        if len(dtypes) != 1:
            raise fail(op, f"inputs must share one dtype, got {sorted(dtypes)}")
        geometry = conv_transpose_geometry(op, attrs, rank)
        n, c = x.shape[:2]
        if c != w.shape[0]:
            raise fail(op, f"input channels {c} != weight input channels {w.shape[0]}")
        if c % geometry.groups:
            raise fail(op, f"input channels {c} are not a multiple of groups {geometry.groups}")
        o = w.shape[1] * geometry.groups
        if len(inputs) > 2 and inputs[2].shape != (o,):
            raise fail(op, f"bias shape {list(inputs[2].shape)} must be [{o}]")
        out = []
        for a in range(rank):
            length = geometry.out(a, x.shape[2 + a], w.shape[2 + a])
            if length < 1:
                raise fail(op, f"pads {geometry.pads} leave no output along spatial axis {a}")
            out.append(length)
        return [TensorType((n, o, *out), x.dtype)]

    return infer


def _convt_reference(op: str, rank: int) -> ReferenceFn:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x, w = inputs[0], inputs[1]
        geometry = conv_transpose_geometry(op, attrs, rank)
        groups, size, kernel = geometry.groups, x.shape[2:], w.shape[2:]
        n, c = x.shape[:2]
        cg, og = c // groups, w.shape[1]
        out = [geometry.out(a, size[a], kernel[a]) for a in range(rank)]
        # The full output on a canvas wide enough for negative pads on either side.
        before = [max(0, -geometry.pads[a]) for a in range(rank)]
        canvas_len = [
            before[a] + max(geometry.full(a, size[a], kernel[a]), geometry.pads[a] + out[a])
            for a in range(rank)
        ]
        canvas = np.zeros((n, groups, og, *canvas_len), np.float64)
        xg = x.reshape(n, groups, cg, -1).astype(np.float64)
        wg = w.reshape(groups, cg, og, *kernel).astype(np.float64)
        lead = (slice(None),) * 3  # the batch, group and channel axes
        for tap in np.ndindex(*kernel):
            # [N, G, Cg, S] x [G, Cg, Og] -> [N, G, Og, S], scattered with the strides
            contrib = np.einsum("ngcs,gco->ngos", xg, wg[lead + tap])
            at = tuple(
                slice(
                    before[a] + tap[a] * geometry.dilations[a],
                    before[a] + tap[a] * geometry.dilations[a]
                    + geometry.strides[a] * (size[a] - 1) + 1,
                    geometry.strides[a],
                )
                for a in range(rank)
            )  # fmt: skip
            canvas[lead + at] += contrib.reshape(n, groups, og, *size)
        crop = tuple(
            slice(before[a] + geometry.pads[a], before[a] + geometry.pads[a] + out[a])
            for a in range(rank)
        )
        y = canvas[lead + crop].reshape(n, groups * og, *out)
        if len(inputs) > 2:
            y = y + inputs[2].reshape(1, -1, *([1] * rank))
        return [np.ascontiguousarray(y, dtype=x.dtype)]

    return reference


for _rank in (1, 2, 3):
    _name = f"conv_transpose{_rank}d"
    register(
        OpDef(
            _name,
            Category.REDUCTION,
            _convt_infer(_name, _rank),
            _convt_reference(_name, _rank),
            doc=f"{_rank}-D transposed convolution, weights [C_in, O/groups, *kernel], bias [O].",
        )
    )

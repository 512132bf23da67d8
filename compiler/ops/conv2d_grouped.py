"""Grouped 1x1 convolution in NCHW[x]c (ShuffleNet's pointwise group convolutions).

Workload (N, IC, H, W, OC, KH, KW, stride, pad, epilogue, groups): `conv2d_1x1_nchwc`'s fields
with KH = KW = 1, stride 1, pad 0, and `groups` >= 2 dividing IC and OC. Output channel `o`
reads only the IC/groups input channels of its group, o // (OC/groups).

Blocks divide a group's channels (ic_block | IC/groups, oc_block | OC/groups), so every block
of output channels lies in one group and reads whole blocks of input: output block `oco` reads
the input blocks from (oco // out_blocks_per_group) * in_blocks_per_group on, and the kernel is
the 1x1 template's flat pixel GEMM with that offset on the input. Arguments: the input
`[N][IC/icb][H*W][icb]`, the packed weight `[OC/ocb][IC/groups/icb][1][1][icb][ocb]` (each
output block's slice of its group's weight), the bias `[OC/ocb][ocb]` with an epilogue, the
output `[N][OC/ocb][H*W][ocb]`.

One kernel for all groups, where importing a grouped convolution as one convolution per group
joined by a concat ran each group's 20-80 channels as a separate narrow kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler import te
from compiler.ops.conv2d import (
    FIELDS,
    FLAT_TILES,
    OC_ORDERS,
    RELU6_CAP,
    Conv2d1x1Template,
    conv2d_reference,
    conv_geometry,
    with_epilogue,
)
from compiler.ops.layout import pack_bias, pack_conv_weight, pack_nchwc
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import channel_blocks
from compiler.te.tensor import Tensor

GROUPED_FIELDS: tuple[str, ...] = (*FIELDS, "groups")


def grouped_conv2d_reference(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    groups: int,
    relu: bool,
    cap: float | None,
) -> np.ndarray:
    """NCHW grouped convolution (stride 1, no padding) of `x` with `w` [OC][IC/groups][KH][KW]."""
    per_in, per_out = x.shape[1] // groups, w.shape[0] // groups
    parts = [
        conv2d_reference(
            x[:, g * per_in : (g + 1) * per_in],
            w[g * per_out : (g + 1) * per_out],
            None if bias is None else bias[g * per_out : (g + 1) * per_out],
            1,
            0,
            relu,
            cap,
        )
        for g in range(groups)
    ]
    return np.concatenate(parts, axis=1)


class GroupedConv2d1x1Template(Conv2d1x1Template):
    """A grouped 1x1 convolution at stride 1: the 1x1 template's flat register tile of `reg_n`
    pixels x one output block, the reduction over the output block's group only."""

    name = "grouped_conv2d_1x1_nchwc"
    fields: tuple[str, ...] = GROUPED_FIELDS

    def geometry(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The first ten fields' geometry (as `conv2d_1x1_nchwc`'s), checked for groups."""
        if len(shape) != len(GROUPED_FIELDS):
            raise ValueError(
                f"{self.name}: workload must be {GROUPED_FIELDS}, got {len(shape)} values"
            )
        geometry = conv_geometry(self.name, tuple(shape[:-1]))
        _, ic, _, _, oc, kh, kw, stride, pad, *_ = geometry
        groups = shape[-1]
        if (kh, kw, stride, pad) != (1, 1, 1, 0):
            raise ValueError(f"{self.name}: takes 1x1 kernels at stride 1 without padding")
        if groups < 2 or ic % groups or oc % groups:
            raise ValueError(
                f"{self.name}: groups={groups} must be >= 2 and divide IC={ic} and OC={oc}"
            )
        return geometry

    @staticmethod
    def groups(shape: tuple[int, ...]) -> int:
        return int(shape[-1])

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        _, ic, _, _, oc, _, _, _, _, _, oh, ow = self.geometry(shape)
        g = self.groups(shape)
        return ConfigSpace(
            [
                Knob("ic_block", channel_blocks(ic // g)),
                Knob("oc_block", channel_blocks(oc // g)),
                Knob("reg_n", tuple(t for t in FLAT_TILES if t <= oh * ow)),
                Knob("oc_order", OC_ORDERS),
            ]
        )

    def blocks(self, shape: tuple[int, ...], config: Config | None) -> tuple[int, int]:
        if config is not None:
            return int(config["ic_block"]), int(config["oc_block"])
        _, ic, _, _, oc, *_ = self.geometry(shape)
        g = self.groups(shape)
        return channel_blocks(ic // g)[0], channel_blocks(oc // g)[0]

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        n, ic, h, w, oc, _, _, _, _, epilogue, _, _ = self.geometry(shape)
        shapes: list[tuple[int, ...]] = [(n, ic, h, w), (oc, ic // self.groups(shape), 1, 1)]
        return [*shapes, (oc,)] if epilogue else shapes

    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        epilogue = self.geometry(shape)[9]
        bias = inputs[2] if epilogue else None
        cap = RELU6_CAP if epilogue == 3 else None
        return grouped_conv2d_reference(
            inputs[0], inputs[1], bias, self.groups(shape), epilogue >= 2, cap
        )

    def flop(self, shape: tuple[int, ...]) -> float:
        return super().flop(shape) / self.groups(shape)

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, ic, _, _, oc, _, _, _, _, epilogue, oh, ow = self.geometry(shape)
        g = self.groups(shape)
        icb, ocb = self.blocks(shape, config)
        in_blocks, out_blocks = ic // g // icb, oc // g // ocb  # per group
        x = te.placeholder((n, ic // icb, oh * ow, icb), name="data")
        wt = te.placeholder((oc // ocb, in_blocks, 1, 1, icb, ocb), name="weight")
        rco = te.reduce_axis((0, in_blocks), name="rco")
        rci = te.reduce_axis((0, icb), name="rci")
        conv = te.compute(
            (n, oc // ocb, oh * ow, ocb),
            lambda b, oco, p, oci: te.sum(
                x[b, (oco // out_blocks) * in_blocks + rco, p, rci] * wt[oco, rco, 0, 0, rci, oci],
                axis=(rco, rci),
            ),
            name="conv",
        )
        return with_epilogue([x, wt], conv, epilogue)

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        epilogue = self.geometry(shape)[9]
        icb, ocb = self.blocks(shape, config)
        data = pack_nchwc(np.asarray(inputs[0], np.float32), icb)
        n, blocks, h, w, _ = data.shape
        packed = [
            data.reshape(n, blocks, h * w, icb),
            pack_conv_weight(np.asarray(inputs[1], np.float32), icb, ocb),
        ]
        if epilogue:
            packed.append(pack_bias(np.asarray(inputs[2], np.float32), ocb))
        return packed

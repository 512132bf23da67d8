"""Depthwise conv2d in NCHW[x]c: each channel convolved with its own KxK filter.

Workload (N, C, H, W, KH, KW, stride, pad, epilogue), float32; `epilogue` as conv2d's: 0 (none),
1 (+ bias), 2 (+ bias, then ReLU) or 3 (+ bias, then ReLU6). Arguments: the input
`[N][C/cb][H][W][cb]` (not padded), the packed weight `[C/cb][KH][KW][cb]` (see `layout`), the
bias `[C/cb][cb]` when there is an epilogue, and the output `[N][C/cb][OH][OW][cb]`. The
register tile is `reg_n` output pixels x one channel block: every tap loads one input vector
per pixel and one weight vector (no broadcasts: channels are lanes). The epilogue is applied to
the accumulators as they are stored (MobileNetV2's bias and clip: no pass of their own over the
output).

The padding is the kernel's own, a `data_pad` stage computed inside the kernel (knob `pad_at`):
per channel block ("block": the block's padded plane, each element built once, 215 KB at 56x56,
in L2) or per output row ("row": the KH padded rows that row reads, in L1, each input row built
KH / stride times). A separate pad kernel had cost MobileNetV2 0.55 ms of its ~10 (its
96-channel 112x112 input alone is 4.8 MB); rows alone made its stride-1 layers 1.5x slower
than with that kernel (every row built 3 times), planes alone left the 112x112 layers' planes
(831 KB) beyond L2.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler import te
from compiler.ir import expr as E
from compiler.ops.base import NO_PARALLEL, OpTemplate, parallel_of, parallelize
from compiler.ops.conv2d import (
    EPILOGUES,
    PARALLEL,
    PARALLEL_LOOPS,
    RELU6_CAP,
    local_accumulators,
    reference_epilogue,
    with_epilogue,
)
from compiler.ops.layout import (
    pack_bias,
    pack_depthwise_weight,
    pack_nchwc,
    pad_spatial,
    unpack_nchwc,
)
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import channel_blocks, check_workload, tile_choices
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.math import all_of, clamp, in_range
from compiler.te.tensor import Tensor

FIELDS = ("N", "C", "H", "W", "KH", "KW", "stride", "pad", "epilogue")
PAD_AT = ("block", "row")  # where the padded input is built (see the module doc)


def depthwise_reference(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """NCHW depthwise convolution with a [C][1][KH][KW] weight, by numpy."""
    n, c, h, wd = x.shape
    _, _, kh, kw = w.shape
    xp = pad_spatial(x.astype(np.float64), pad)
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, c, oh, ow), np.float64)
    for y in range(kh):
        for xx in range(kw):
            window = xp[
                :,
                :,
                y : y + stride * (oh - 1) + 1 : stride,
                xx : xx + stride * (ow - 1) + 1 : stride,
            ]
            out += window * w[:, 0, y, xx].astype(np.float64).reshape(1, c, 1, 1)
    return out.astype(np.float32)


def padded(x: Tensor, pad: int) -> Tensor:
    """NCHW[x]c `x` with `pad` zero rows and columns on every side (reads clamped into `x`, so
    a vectorized select never loads outside it)."""
    n, blocks, h, w, cb = x.shape

    def body(b: E.Var, co: E.Var, y: E.Var, xx: E.Var, ci: E.Var) -> E.Expr:
        iy, ix = y - E.IntImm(pad), xx - E.IntImm(pad)
        value = x[b, co, clamp(iy, h), clamp(ix, w), ci]
        return E.Select(all_of(in_range(iy, h), in_range(ix, w)), value, E.FloatImm(0.0))

    return te.compute((n, blocks, h + 2 * pad, w + 2 * pad, cb), body, name="data_pad")


class Depthwise(OpTemplate):
    """What a depthwise convolution template shares, whatever its device and layout: the
    workload (N, C, H, W, KH, KW, stride, pad, epilogue), its checks and output size, the numpy
    reference and FLOPs. Subclasses lay out and schedule it."""

    fields = FIELDS

    def geometry(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The workload checked, with (OH, OW) appended.

        Raises:
            ValueError: a malformed workload, an unknown epilogue, or a kernel larger than the
                padded input.
        """
        _, _, h, w, kh, kw, stride, pad, epilogue = check_workload(
            self.name, shape, FIELDS, may_be_zero=("pad", "epilogue")
        )
        if epilogue not in EPILOGUES:
            raise ValueError(f"{self.name}: epilogue must be one of {EPILOGUES}, got {epilogue}")
        if h + 2 * pad < kh or w + 2 * pad < kw:
            raise ValueError(f"{self.name}: the {kh}x{kw} kernel does not fit the padded input")
        return (*shape, (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1)

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        n, c, h, w, kh, kw, _, _, epilogue, _, _ = self.geometry(shape)
        shapes: list[tuple[int, ...]] = [(n, c, h, w), (c, 1, kh, kw)]
        return [*shapes, (c,)] if epilogue else shapes

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        raise TypeError(f"{self.name}: the reference needs the workload; call reference_for")

    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        *_, stride, pad, epilogue, _, _ = self.geometry(shape)
        out = depthwise_reference(inputs[0], inputs[1], stride, pad)
        if not epilogue:
            return out
        cap = RELU6_CAP if epilogue == 3 else None
        return reference_epilogue(out.astype(np.float64), inputs[2], epilogue >= 2, cap)

    def flop(self, shape: tuple[int, ...]) -> float:
        n, c, _, _, kh, kw, _, _, _, oh, ow = self.geometry(shape)
        return 2.0 * n * c * oh * ow * kh * kw


class DepthwiseConv2dTemplate(Depthwise):
    """Depthwise convolution with channels as vector lanes and an ow register tile."""

    name = "depthwise_conv2d_nchwc"
    layout_knobs = ("c_block",)

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        c, ow = self.geometry(shape)[1], self.geometry(shape)[-1]
        return ConfigSpace(
            [
                Knob("c_block", channel_blocks(c)),
                Knob("reg_n", tile_choices(ow, 16)),
                Knob("unroll_kw", (True, False)),
                Knob("pad_at", PAD_AT),
            ]
        )

    def parallel_choices(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The `parallel` choices: "outer" fuses batch and channel blocks into the parallel
        loop, "fused" the rows too (the padded input is then made per row, whatever `pad_at`
        says)."""
        return PARALLEL

    def _block(self, shape: tuple[int, ...], config: Config | None) -> int:
        return int(config["c_block"]) if config is not None else channel_blocks(shape[1])[0]

    def internal_pad(self, shape: tuple[int, ...]) -> int:
        """The kernel pads its input itself (see the module doc)."""
        return int(self.geometry(shape)[7])

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, c, h, w, kh, kw, stride, pad, epilogue, oh, ow = self.geometry(shape)
        cb = self._block(shape, config)
        data = te.placeholder((n, c // cb, h, w, cb), name="data")
        x = padded(data, pad) if pad else data
        wt = te.placeholder((c // cb, kh, kw, cb), name="weight")
        ry = te.reduce_axis((0, kh), name="ry")
        rx = te.reduce_axis((0, kw), name="rx")
        out = te.compute(
            (n, c // cb, oh, ow, cb),
            lambda b, co, y, xx, ci: te.sum(
                x[b, co, y * stride + ry.var, xx * stride + rx.var, ci] * wt[co, ry, rx, ci],
                axis=(ry, rx),
            ),
            name="conv" if epilogue else "out",
        )
        return with_epilogue([data, wt], out, epilogue)

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """Loops n, c block, oh, owo | ry, rx, owi (unrolled), ci (vector): the `reg_n` x cb
        accumulators are a `cache_write` local tile at owo, which register promotion keeps in
        registers, stored once after the last tap (through the epilogue, into which the
        convolution's own stage is inlined)."""
        out = args[-1]
        sch = create_schedule(out)
        pad = next((g for g in sch.stages if g.tensor.name == "data_pad"), None)
        acc = local_accumulators(sch, out)
        st = sch[out]
        b, co, y, xx, ci = st.axis
        xo, xi = st.split(xx, int(config["reg_n"]))
        st.reorder(b, co, y, xo, xi, ci)
        st.unroll(xi)
        st.vectorize(ci)
        parallel = parallel_of(config)
        if parallel != NO_PARALLEL:
            count = PARALLEL_LOOPS[parallel]
            fused = parallelize(st, [b, co, y], count)[0]
            co = fused
            y = fused if count == 3 else y
        if pad is not None:
            pad.compute_at(st, co if config.get("pad_at", "block") == "block" else y)
            pad.vectorize(pad.axis[-1])
        sa = sch[acc]
        sa.compute_at(st, xo)
        ry, rx = sa.reduce_axis
        ab, aco, ay, ax, aci = sa.axis
        sa.reorder(ry, rx, ab, aco, ay, ax, aci)
        if config["unroll_kw"]:
            sa.unroll(rx)
        sa.unroll(ax)
        sa.vectorize(aci)
        return sch

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        epilogue = self.geometry(shape)[8]
        cb = self._block(shape, config)
        packed = [
            pack_nchwc(np.asarray(inputs[0], np.float32), cb),
            pack_depthwise_weight(np.asarray(inputs[1], np.float32), cb),
        ]
        if epilogue:
            packed.append(pack_bias(np.asarray(inputs[2], np.float32), cb))
        return packed

    def unpack_output(
        self, shape: tuple[int, ...], config: Config | None, output: np.ndarray
    ) -> np.ndarray:
        return unpack_nchwc(output)

"""conv2d in NCHW[x]c (TVM's x86 direct convolution), for KxK, 1x1 and the small-channel stem.

Workload (N, IC, H, W, OC, KH, KW, stride, pad, epilogue), float32; H and W are the unpadded
input's, `epilogue` is 0 (none), 1 (+ bias), 2 (+ bias, then ReLU) or 3 (+ bias, then ReLU6,
MobileNet's clip to [0, 6]). Arguments, in order:
the pre-padded input `[N][IC/icb][H+2p][W+2p][icb]`, the packed weight
`[OC/ocb][IC/icb][KH][KW][icb][ocb]`, the bias `[OC/ocb][ocb]` when there is an epilogue, and the
output `[N][OC/ocb][OH][OW][ocb]` (see `layout`).

The schedule's micro-kernel is a register tile of `reg_n` output pixels of one row times one
block of `ocb` output channels (reg_n x ocb/16 vector accumulators); per input channel and
kernel tap it broadcasts one input value per pixel and reads one vector of weights per 16
channels. The accumulators are a `cache_write` "local" tile computed at (compute_at) the output's
register-tile loop; the epilogue is its own stage, into which the convolution's stage is
inlined, so bias and ReLU are applied to the accumulators as they are stored (and the OW tail,
when reg_n does not divide OW, is the core's loop partition's business).
On more than one thread the `parallel` knob (see `base.threaded_space`) runs the output's
outer loops on OpenMP's threads: "outer" the batch fused with the next loop (output-channel
blocks, or rows of tiles with oc_order "inner"), "fused" with the next two (more, smaller
chunks). Every reduction stays inside one output tile, so no two threads add into one output.
A choice whose fused loop includes a tile loop that the tile does not divide is not worth
measuring (`parallel_splits_a_tail`): that tail cannot be partitioned out of a fused loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler import te
from compiler.ir import expr as E
from compiler.ops.base import (
    NO_PARALLEL,
    OpTemplate,
    parallel_of,
    parallelize,
    register_file,
    register_tile_fits,
)
from compiler.ops.layout import pack_bias, pack_conv_weight, pack_nchwc, pad_spatial, unpack_nchwc
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import ceil_div, channel_blocks, check_workload, tile_choices
from compiler.schedule.schedule import Schedule, Stage, create_schedule
from compiler.te.tensor import ComputeOp, IterVar, Reduce, Tensor

FIELDS = ("N", "IC", "H", "W", "OC", "KH", "KW", "stride", "pad", "epilogue")
EPILOGUES = {0: "none", 1: "bias", 2: "bias_relu", 3: "bias_relu6"}
RELU6_CAP = 6.0
# Where the output-channel block loop sits: outside the rows ("outer": a block's weights stay
# in L1/L2 across the image) or inside the pixel tile ("inner": the input tile stays in L1).
OC_ORDERS = ("outer", "inner")
# The `parallel` knob's choices on more than one thread, and how many outer loops each fuses.
PARALLEL = (NO_PARALLEL, "outer", "fused")
PARALLEL_LOOPS = {"outer": 2, "fused": 3}
# How the register tile covers the image: "rows" is reg_n pixels of oh_tile rows; "flat" is
# reg_n consecutive pixels of the image taken as one axis, across row ends (any count fits).
PIXEL_TILINGS = ("rows", "flat")
CONV_MAX_TILE = 24  # accumulator vectors: a conv tile also keeps weight vectors live per tap
# Flat pixel tiles: AVX-512's long ones, then every count from 16 down (AVX2's 12-accumulator
# tiles are 6x2, 4x3 and 12x1 vectors). Largest first; an untuned 1x1 build takes the tile
# `Conv2d1x1Template.default_rank` ranks first.
FLAT_TILES = (28, 24, 20, *range(16, 0, -1))
# An untuned 1x1 build's flat tile takes at most this many pixels: a pixel is one broadcast
# per input channel, and on one vector of output channels the 20- and 24-pixel tiles (the
# largest that fit) ran 1.2-1.8x slower than 16 on every such MobileNetV2 layer (AVX-512).
DEFAULT_FLAT_MAX_PIXELS = 16


def conv_geometry(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The workload checked, with (OH, OW) appended.

    Raises:
        ValueError: a field is out of range or the kernel does not fit the padded image.
    """
    _, _, h, w, _, kh, kw, stride, pad, epilogue = check_workload(
        name, shape, FIELDS, may_be_zero=("pad", "epilogue")
    )
    if epilogue not in EPILOGUES:
        raise ValueError(f"{name}: epilogue must be one of {EPILOGUES}, got {epilogue}")
    if h + 2 * pad < kh or w + 2 * pad < kw:
        raise ValueError(
            f"{name}: a {kh}x{kw} kernel does not fit the padded {h + 2 * pad}x{w + 2 * pad} input"
        )
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (w + 2 * pad - kw) // stride + 1
    return (*shape, oh, ow)


def conv2d_reference(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    stride: int,
    pad: int,
    relu: bool,
    cap: float | None = None,
) -> np.ndarray:
    """NCHW convolution of `x` with OIHW `w`, by numpy (float64 sums, float32 result); then
    max(., 0) if `relu` and min(., cap) if `cap`."""
    _, _, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = pad_spatial(x.astype(np.float64), pad)
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((x.shape[0], oc, oh, ow), np.float64)
    for y in range(kh):
        for xx in range(kw):
            window = xp[
                :,
                :,
                y : y + stride * (oh - 1) + 1 : stride,
                xx : xx + stride * (ow - 1) + 1 : stride,
            ]
            out += np.einsum("nchw,oc->nohw", window, w[:, :, y, xx].astype(np.float64))
    return reference_epilogue(out, bias, relu, cap)


def reference_epilogue(
    out: np.ndarray, bias: np.ndarray | None, relu: bool, cap: float | None = None
) -> np.ndarray:
    """NCHW float64 sums + bias per channel, then max(., 0) if `relu` and min(., cap) if `cap`,
    as float32."""
    if bias is not None:
        out = out + np.asarray(bias, np.float64).reshape(1, -1, 1, 1)
    if relu:
        out = np.maximum(out, 0.0)
    if cap is not None:
        out = np.minimum(out, cap)
    return out.astype(np.float32)


def conv2d_nchwc_compute(
    x: Tensor, w: Tensor, stride: int, out_hw: tuple[int, int], name: str = "conv"
) -> Tensor:
    """The convolution sums over pre-padded NCHW[x]c `x` and packed `w`, in NCHW[x]c."""
    n = x.shape[0]
    oc_blocks, ic_blocks, kh, kw, icb, ocb = w.shape
    rco = te.reduce_axis((0, ic_blocks), name="rco")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rci = te.reduce_axis((0, icb), name="rci")
    return te.compute(
        (n, oc_blocks, *out_hw, ocb),
        lambda b, oco, oh, ow, oci: te.sum(
            x[b, rco, oh * stride + ry.var, ow * stride + rx.var, rci]
            * w[oco, rco, ry, rx, rci, oci],
            axis=(rco, ry, rx, rci),
        ),
        name=name,
    )


def conv2d_flat_compute(
    x: Tensor, w: Tensor, stride: int, out_hw: tuple[int, int], name: str = "conv"
) -> Tensor:
    """`conv2d_nchwc_compute` with the output's pixels as one axis p = oh * OW + ow:
    `[N][OC/ocb][OH*OW][ocb]`, the same bytes as the 5-D form. A register tile of consecutive
    pixels may then cross row ends; each pixel finds its input window by p // OW and p % OW,
    which do not change inside the reduction and are computed once per tile."""
    n = x.shape[0]
    oc_blocks, ic_blocks, kh, kw, icb, ocb = w.shape
    _, ow = out_hw
    rco = te.reduce_axis((0, ic_blocks), name="rco")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rci = te.reduce_axis((0, icb), name="rci")
    return te.compute(
        (n, oc_blocks, out_hw[0] * ow, ocb),
        lambda b, oco, p, oci: te.sum(
            x[b, rco, (p // ow) * stride + ry.var, (p % ow) * stride + rx.var, rci]
            * w[oco, rco, ry, rx, rci, oci],
            axis=(rco, ry, rx, rci),
        ),
        name=name,
    )


def epilogue_compute(
    conv: Tensor, bias: Tensor, relu: bool, name: str = "out", cap: float | None = None
) -> Tensor:
    """conv + bias per output channel, then max(., 0) if `relu` and min(., cap) if `cap`, in
    NCHW[x]c (5-D) or its flat-pixel form (4-D)."""

    def body(*i: E.Var) -> E.Expr:  # (b, co, y, xx, ci), or (b, co, pixel, ci) flat
        value: E.Expr = conv[i] + bias[i[1], i[-1]]
        if relu:
            value = E.Max(value, E.FloatImm(0.0))
        return E.Min(value, E.FloatImm(cap)) if cap is not None else value

    return te.compute(conv.shape, body, name=name)


def with_epilogue(inputs: list[Tensor], conv: Tensor, epilogue: int) -> list[Tensor]:
    """A template's arguments: `inputs`, then the output `conv` itself (epilogue 0), or a bias
    `[blocks][block]` placeholder and `epilogue_compute` over `conv` (see `EPILOGUES`)."""
    if not epilogue:
        return [*inputs, conv]
    bias = te.placeholder((conv.shape[1], conv.shape[-1]), name="bias")
    cap = RELU6_CAP if epilogue == 3 else None
    return [*inputs, bias, epilogue_compute(conv, bias, relu=epilogue >= 2, cap=cap)]


def local_accumulators(sch: Schedule, out: Tensor) -> Tensor:
    """The reduction behind `out` cache-written to a "local" tile (its stage inlined into an
    epilogue `out`, so the epilogue applies to the accumulators on their way to memory)."""
    assert isinstance(out.op, ComputeOp)
    conv = out
    if not isinstance(out.op.body, Reduce):
        conv = next(t for t in out.op.inputs if isinstance(t.op, ComputeOp))
    acc = sch.cache_write(conv, "local")
    if conv is not out:
        sch[conv].compute_inline()
    return acc


def prefetch_next_block(st: Stage, acc: Stage, attach: IterVar, weight: Tensor) -> None:
    """Prefetch the next output-channel block's weights while this block computes (knob
    `prefetch`), a share at each step of the kernel rows of each pixel tile.

    In a model a layer's weights come from memory (ResNet-18's 46 MB do not stay in the
    caches between its calls), and the first pixel tile of each block waits for them: a
    512-channel 3x3 layer's 32-channel block is 590 KB, 100 us at one core's 6 GB/s on the
    Xeon this was measured on, against 16 us of compute a tile. Spread in 55-line pieces over
    the taps (tiles x rco x ry) the fetch overlaps the compute: 1.28-1.37x on cold calls of
    that layer, and no slower warm (13 interleaved rounds; asked for all at once at the start
    of each tile, 7.5x larger pieces, it ran 1.12x cold and 0.93x warm). The loop is the output
    channel block's, or the parallel loop it was fused into; every iteration prefetches its
    next one's block, so with OpenMP's contiguous chunks only a chunk's last block goes to
    waste.
    """
    outer = st.leaf_iter_vars[: next(i for i, v in enumerate(st.leaf_iter_vars) if v is attach) + 1]
    oco = st.axis[1]
    axis = oco if any(v is oco for v in outer) else outer[0]
    inside = outer[next(i for i, v in enumerate(outer) if v is axis) + 1 :]
    rco, ry = acc.reduce_axis[:2]
    st.prefetch(weight, axis, 1, (*inside, rco, ry))


class Conv2dNCHWcTemplate(OpTemplate):
    """Direct KxK convolution in NCHW[x]c with a register tile of output pixels: `reg_n` of a
    row times `oh_tile` rows, or (knob `pixels` = "flat") `reg_n` consecutive pixels of the
    image across row ends, each finding its window by p // OW, p % OW. AVX2's 12-accumulator
    tile is 6 pixels x 2 vectors, which no divisor of 14, 28 or 112 gives as rows: ResNet-18's
    3x3/2 at 28x28 (128->256) went from 65 to 92 GFLOP/s with it on Zen 3."""

    name = "conv2d_nchwc"
    fields: tuple[str, ...] = FIELDS
    layout_knobs = ("ic_block", "oc_block", "pixels")

    def geometry(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return conv_geometry(self.name, shape)

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        _, ic, _, _, oc, _, _, _, _, _, oh, ow = self.geometry(shape)
        return ConfigSpace(
            [
                Knob("ic_block", channel_blocks(ic)),
                Knob("oc_block", channel_blocks(oc)),
                Knob("reg_n", self.pixel_tiles(oh, ow)),
                # Output rows in the register tile: rows share each weight vector they load.
                Knob("oh_tile", tuple(t for t in (1, 2, 4) if t <= oh)),
                Knob("unroll_kw", (True, False)),
                Knob("oc_order", OC_ORDERS),
                Knob("pixels", PIXEL_TILINGS),
                Knob("prefetch", (False, True), added_later=True),
            ]
        )

    def parallel_choices(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        return PARALLEL

    @staticmethod
    def pixel_tiles(oh: int, ow: int) -> tuple[int, ...]:
        """reg_n's choices: the row tiles (powers of two and divisors of OW) and the flat ones."""
        flat = (t for t in FLAT_TILES if t <= oh * ow)
        return tuple(sorted(set(tile_choices(ow, 32)) | set(flat)))

    @staticmethod
    def is_flat(config: Config | None) -> bool:
        """Whether `config` tiles the output's pixels as one axis (knob `pixels`)."""
        return config is not None and config.get("pixels") == "flat"

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        rows = int(config["oh_tile"]) if "oh_tile" in config else 1
        if self.parallel_splits_a_tail(shape, config, self.is_flat(config)):
            return False
        if config.get("prefetch") and self.geometry(shape)[4] <= int(config["oc_block"]):
            return False  # one block of weights: no next block to prefetch
        if self.is_flat(config):
            # the flat tile has no rows: one config stands for all
            return rows == 1 and self.flat_tile_fits(shape, config, target)
        geometry = self.geometry(shape)
        oc, ow = geometry[4], geometry[-1]
        regs = register_file(target)
        vectors = ceil_div(int(config["oc_block"]), regs.lanes)
        if int(config["reg_n"]) not in tile_choices(ow, 32):
            return False  # a flat-only tile
        most = min(ow * rows, 28) * min(ceil_div(oc, regs.lanes), 4)
        # Measured on AVX-512: 28-vector conv tiles ran at half the speed of 14-vector ones.
        limit = min(CONV_MAX_TILE, regs.max_accumulators)
        return register_tile_fits(int(config["reg_n"]) * rows * vectors, most, limit)

    def parallel_splits_a_tail(self, shape: tuple[int, ...], config: Config, flat: bool) -> bool:
        """Whether `config`'s parallel loop fuses a tile loop whose tile does not divide it:
        the last tile can then not be a loop of its own (loop partition), and every tile of the
        fused loop takes a min() bound and loses its unrolled register tile."""
        parallel = parallel_of(config)
        if parallel == NO_PARALLEL:
            return False
        oh, ow = self.geometry(shape)[-2:]
        reg_n = int(config["reg_n"])
        if flat:  # loops b, oco, po (oc_order "outer") or b, po, oco
            tails = [False, False, (oh * ow) % reg_n != 0]
        else:  # loops b, oco, oho, owo or b, oho, owo, oco
            tails = [False, False, oh % int(config.get("oh_tile", 1)) != 0, ow % reg_n != 0]
        if config.get("oc_order", "outer") != "outer":
            tails = [tails[0], *tails[2:], tails[1]]
        return any(tails[: PARALLEL_LOOPS[parallel]])

    def flat_tile_fits(self, shape: tuple[int, ...], config: Config, target: str) -> bool:
        """Whether `config`'s flat tile of reg_n pixels x its block's vectors fits `target`'s
        registers beside one weight vector per vector of the block and one broadcast."""
        geometry = self.geometry(shape)
        oc, oh, ow = geometry[4], geometry[-2], geometry[-1]
        regs = register_file(target)
        vectors = ceil_div(int(config["oc_block"]), regs.lanes)
        most = min(oh * ow, 28) * min(ceil_div(oc, regs.lanes), 4)
        limit = min(CONV_MAX_TILE, regs.registers - vectors - 1)
        return register_tile_fits(int(config["reg_n"]) * vectors, most, limit)

    def blocks(self, shape: tuple[int, ...], config: Config | None) -> tuple[int, int]:
        """(ic_block, oc_block) of `config`, or of the default layout."""
        if config is not None:
            return int(config["ic_block"]), int(config["oc_block"])
        _, ic, _, _, oc, *_ = self.geometry(shape)
        return channel_blocks(ic)[0], channel_blocks(oc)[0]

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        n, ic, h, w, oc, kh, kw, _, _, epilogue, _, _ = self.geometry(shape)
        shapes: list[tuple[int, ...]] = [(n, ic, h, w), (oc, ic, kh, kw)]
        return [*shapes, (oc,)] if epilogue else shapes

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """Needs the workload's stride and pad: use `reference_for`."""
        raise TypeError(f"{self.name}: the reference needs the workload; call reference_for")

    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        """The NCHW output for logical inputs (x, w[, bias])."""
        *_, stride, pad, epilogue, _, _ = self.geometry(shape)
        bias = inputs[2] if epilogue else None
        cap = RELU6_CAP if epilogue == 3 else None
        return conv2d_reference(inputs[0], inputs[1], bias, stride, pad, epilogue >= 2, cap)

    def flop(self, shape: tuple[int, ...]) -> float:
        n, ic, _, _, oc, kh, kw, _, _, _, oh, ow = self.geometry(shape)
        return 2.0 * n * oc * oh * ow * ic * kh * kw

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, ic, h, w, oc, kh, kw, stride, pad, epilogue, oh, ow = self.geometry(shape)
        icb, ocb = self.blocks(shape, config)
        x = te.placeholder((n, ic // icb, h + 2 * pad, w + 2 * pad, icb), name="data")
        wt = te.placeholder((oc // ocb, ic // icb, kh, kw, icb, ocb), name="weight")
        if self.is_flat(config):
            conv = conv2d_flat_compute(x, wt, stride, (oh, ow))
        else:
            conv = conv2d_nchwc_compute(x, wt, stride, (oh, ow))
        return with_epilogue([x, wt], conv, epilogue)

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """Accumulators in a local tile computed at the output's register-tile loop.

        The convolution is cache-written to a "local" tile; with an epilogue, the convolution's
        own stage is inlined into the epilogue, so bias and ReLU apply to the accumulators on
        their way to memory.
        """
        out = args[-1]
        sch = create_schedule(out)
        acc = local_accumulators(sch, out)
        st = sch[out]
        attach = self.schedule_output(st, config)
        st.vectorize(st.leaf_iter_vars[-1])
        sch[acc].compute_at(st, attach)
        self.schedule_accumulators(sch[acc], config)
        if config.get("prefetch"):
            prefetch_next_block(st, sch[acc], attach, args[1])
        return sch

    def schedule_output(self, st: Stage, config: Config) -> IterVar:
        """oh and ow tiled: loops n, oco, oho, owo | ohi, owi (unrolled), oci; returns the last outer.

        The register tile is `oh_tile` rows (1 where the space has no such knob) of `reg_n`
        pixels. With oc_order "inner" the output-channel blocks loop inside the pixel tile (n,
        oho, owo, oco): a tile of input stays in L1 while every block of weights passes over it.
        """
        if len(st.axis) == 4:  # flat: n, oco, po | pi (unrolled), oci
            b, oco, p, oci = st.axis
            po, pi = st.split(p, int(config["reg_n"]))
            flat = [b, oco, po] if config["oc_order"] == "outer" else [b, po, oco]
            st.reorder(*flat, pi, oci)
            st.unroll(pi)
            return self.parallel_outer(st, flat, config)[-1]
        b, oco, oh, ow, oci = st.axis
        oho, ohi = st.split(oh, int(config.get("oh_tile", 1)))
        owo, owi = st.split(ow, int(config["reg_n"]))
        outer = [b, oco, oho, owo] if config["oc_order"] == "outer" else [b, oho, owo, oco]
        st.reorder(*outer, ohi, owi, oci)
        st.unroll(ohi)
        st.unroll(owi)
        return self.parallel_outer(st, outer, config)[-1]

    @staticmethod
    def parallel_outer(st: Stage, outer: list[IterVar], config: Config) -> list[IterVar]:
        """`outer` (the output's loops outside its tile) after the `parallel` knob fused the
        first of them into the loop OpenMP runs (see the module doc)."""
        parallel = parallel_of(config)
        if parallel == NO_PARALLEL:
            return outer
        return parallelize(st, outer, PARALLEL_LOOPS[parallel])

    def schedule_accumulators(self, st: Stage, config: Config) -> None:
        """Loops rco, ry, rx, rci | oh, ow (unrolled), oci (vector) inside the output's tile.

        With unroll_kw the kernel columns move inside the channel loop and are unrolled (TVM's
        order rco, ry, rci, rx): one loop body of KW x reg_n FMAs per vector, whose input
        broadcasts for neighbouring columns share cache lines.
        """
        *outer, oci = st.axis  # b, oco, oh, ow or, flat, b, oco, p
        rco, ry, rx, rci = st.reduce_axis
        if config["unroll_kw"]:
            st.reorder(rco, ry, rci, rx, *outer, oci)
            st.unroll(rx)
        else:
            st.reorder(rco, ry, rx, rci, *outer, oci)
        for pixel_axis in outer[2:]:
            st.unroll(pixel_axis)
        st.vectorize(oci)

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        *_, pad, epilogue, _, _ = self.geometry(shape)
        icb, ocb = self.blocks(shape, config)
        packed = [
            pack_nchwc(pad_spatial(np.asarray(inputs[0], np.float32), pad), icb),
            pack_conv_weight(np.asarray(inputs[1], np.float32), icb, ocb),
        ]
        if epilogue:
            packed.append(pack_bias(np.asarray(inputs[2], np.float32), ocb))
        return packed

    def unpack_output(
        self, shape: tuple[int, ...], config: Config | None, output: np.ndarray
    ) -> np.ndarray:
        if output.ndim == 4:  # flat pixels: the same bytes as [N][OC/ocb][OH][OW][ocb]
            oh, ow = self.geometry(shape)[10:12]
            n, blocks, _, ocb = output.shape
            output = output.reshape(n, blocks, oh, ow, ocb)
        return unpack_nchwc(output)


class Conv2d1x1Template(Conv2dNCHWcTemplate):
    """1x1 convolution: a GEMM over pixels, with a register tile of pixels x output channels.

    At stride 1 a 1x1 convolution maps pixel p of the (pre-padded) input to pixel p of the
    output, and in NCHW[x]c a channel block's pixels are one row-major run, so the image is one
    axis of OH*OW pixels ("flat"): the data is `[N][IC/icb][OH*OW][icb]` and the output
    `[N][OC/ocb][OH*OW][ocb]` (the same bytes as their 5-D forms). The register tile is `reg_n`
    consecutive pixels, free of the row width: MobileNetV2's 7x7 and 14x14 layers take 5- and
    6-pixel tiles (12 ymm accumulators with ocb=16), which no divisor of 7 or 14 gives, and the
    last tile of the image is the loop partition's tail. Measured on Zen 3 (AVX2) against the
    row tiles (reg_n pixels of oh_tile rows): 576->96 at 14x14 94 vs 55 GFLOP/s, 320->1280 at
    7x7 93 vs 53. At stride 2 (ResNet's downsample) the tile is reg_n pixels of oh_tile rows.
    """

    name = "conv2d_1x1_nchwc"

    def geometry(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        geometry = conv_geometry(self.name, shape)
        if geometry[5:7] != (1, 1):
            raise ValueError(f"{self.name}: kernel must be 1x1, got {geometry[5]}x{geometry[6]}")
        return geometry

    def flat(self, shape: tuple[int, ...]) -> bool:
        """Whether the workload's pixels are one axis (stride 1; see the class doc)."""
        return self.geometry(shape)[7] == 1

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        _, ic, _, _, oc, _, _, _, _, _, oh, ow = self.geometry(shape)
        blocks = [Knob("ic_block", channel_blocks(ic)), Knob("oc_block", channel_blocks(oc))]
        if self.flat(shape):
            tiles = tuple(t for t in FLAT_TILES if t <= oh * ow)
            return ConfigSpace([*blocks, Knob("reg_n", tiles), Knob("oc_order", OC_ORDERS)])
        return ConfigSpace(
            [
                *blocks,
                Knob("reg_n", tile_choices(ow, 32)),
                Knob("oh_tile", tuple(t for t in (1, 2, 4) if t <= oh)),
                Knob("oc_order", OC_ORDERS),
            ]
        )

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        if not self.flat(shape):
            return super().worth_measuring(shape, config, target)
        if self.parallel_splits_a_tail(shape, config, flat=True):
            return False
        return self.flat_tile_fits(shape, config, target)

    def default_rank(self, shape: tuple[int, ...], config: Config) -> tuple[int, ...]:
        """How an untuned build ranks `config` among those worth measuring (lowest first; ties
        in space order): a flat tile of at most DEFAULT_FLAT_MAX_PIXELS, one that divides the
        pixels (no tail tile, and a "fused" parallel loop may split it), the largest."""
        if not self.flat(shape):
            return ()
        oh, ow = self.geometry(shape)[-2:]
        reg_n = int(config["reg_n"])
        return (reg_n > DEFAULT_FLAT_MAX_PIXELS, (oh * ow) % reg_n != 0, -reg_n)

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        if not self.flat(shape):
            return super().tensors(shape, config)
        n, ic, _, _, oc, _, _, _, _, epilogue, oh, ow = self.geometry(shape)
        icb, ocb = self.blocks(shape, config)
        x = te.placeholder((n, ic // icb, oh * ow, icb), name="data")
        wt = te.placeholder((oc // ocb, ic // icb, 1, 1, icb, ocb), name="weight")
        rco = te.reduce_axis((0, ic // icb), name="rco")
        rci = te.reduce_axis((0, icb), name="rci")
        conv = te.compute(
            (n, oc // ocb, oh * ow, ocb),
            lambda b, oco, p, oci: te.sum(
                x[b, rco, p, rci] * wt[oco, rco, 0, 0, rci, oci], axis=(rco, rci)
            ),
            name="conv",
        )
        return with_epilogue([x, wt], conv, epilogue)

    def schedule_accumulators(self, st: Stage, config: Config) -> None:
        """Loops rco, rci | pixels (unrolled), oci (vector) inside the output's tile."""
        if len(st.axis) == 4:
            b, oco, p, oci = st.axis
            rco, rci = st.reduce_axis
            st.reorder(rco, rci, b, oco, p, oci)
            st.unroll(p)
        else:
            b, oco, oh, ow, oci = st.axis
            rco, ry, rx, rci = st.reduce_axis
            st.reorder(rco, ry, rx, rci, b, oco, oh, ow, oci)
            st.unroll(oh)
            st.unroll(ow)
        st.vectorize(oci)

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        packed = super().pack_inputs(shape, config, inputs)
        if self.flat(shape):
            n, blocks, h, w, icb = packed[0].shape
            packed[0] = packed[0].reshape(n, blocks, h * w, icb)
        return packed


class Conv2dStemTemplate(Conv2dNCHWcTemplate):
    """The small-channel stem (ResNet's 7x7/2 on 3 channels): input channels in one block.

    With 3 input channels a channel block of 16 is impossible, so the input is one block of IC
    channels per pixel (RGB interleaved) and the kernel's taps and channels are unrolled around
    the register tile: for each kernel row, KW x IC broadcasts per pixel against one weight
    vector each.
    """

    name = "conv2d_stem_nchwc"

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        _, ic, _, _, oc, _, _, _, _, _, oh, ow = self.geometry(shape)
        return ConfigSpace(
            [
                Knob("ic_block", (ic,)),
                Knob("oc_block", channel_blocks(oc)),
                Knob("reg_n", self.pixel_tiles(oh, ow)),
                Knob("unroll_kw", (True, False)),
                Knob("oc_order", OC_ORDERS),
                Knob("pixels", PIXEL_TILINGS),
            ]
        )

    def blocks(self, shape: tuple[int, ...], config: Config | None) -> tuple[int, int]:
        _, ic, _, _, oc, *_ = self.geometry(shape)
        return ic, int(config["oc_block"]) if config is not None else channel_blocks(oc)[0]

    def schedule_accumulators(self, st: Stage, config: Config) -> None:
        """Loops ry, rx (unrolled or not), rci (unrolled) | ow or the flat pixels (unrolled),
        oci (vector)."""
        *outer, oci = st.axis  # b, oco, oh, ow or, flat, b, oco, p
        rco, ry, rx, rci = st.reduce_axis
        st.reorder(rco, ry, rx, rci, *outer, oci)
        if config["unroll_kw"]:
            st.unroll(rx)
        st.unroll(rci)
        st.unroll(outer[-1])
        st.vectorize(oci)

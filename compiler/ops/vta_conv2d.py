"""`vta_conv2d`: an int8 2-D convolution with its epilogue, scheduled for the VTA-like accelerator.

The compute, in the tensor-expression language, is the reference definition (batch 1):

    acc[ob, y, x, o] = sum_{cb, ky, kx, i} int32(x_pad[cb, y*s + ky, x*s + kx, i])
                                           * int32(w[ob, cb, ky, kx, o, i])
    y[ob, y, x, o]   = requant(acc[ob, y, x, o], bias[ob, o])          (vta_dense's epilogue)

over channel-blocked tensors: x int8[C/16, H, W, 16], w int8[O/16, C/16, K, K, 16, 16],
bias int32[O/16, 16], y int8[O/16, OH, OW, 16] (NCHW16c, channels padded to the block). Blocked
NCHW rather than NHWC because one accelerator entry is 16 channels of one pixel (an INP entry of
input channels, an ACC entry of output channels, a WGT entry a 16x16 block), so with the channel
block innermost every entry is contiguous in DRAM and a rectangle of pixels of one channel block is
one 2-D strided DMA (rows `W` entries apart); NHWC would need the same blocking of C to feed the
GEMM and gains nothing. The program's entry still takes plain NCHW / OIHW arrays: its DRAM
layouts (`protos.vta_program.ArgLayout`) pad and block them.

The workload is (C, H, W, O, K, stride, pad). On the host the template builds like any other (the
naive schedule of the plain-layout compute is the check reference); for the target "vta",
`accel_schedule` schedules the blocked compute with the schedule language and
`compiler.codegen.vta_lower` lowers it into the instruction stream:

- the output is tiled (`tile_h` rows x `tile_w` columns x `tile_oc` channel blocks); its tile
  loops run on the host side of the stream (the code generator unrolls them into instructions);
- `cache_write(y, "vta.acc")` computes the epilogue in the accumulator buffer (ALU
  instructions), and `y` itself becomes the copy out (STORE); `acc` lives in "vta.acc" too;
- `cache_read` of the padded input into "vta.inp" (the padding stage inlined into it: a DMA with
  a zero ring), of the weights into "vta.wgt", of the bias into "vta.acc", each attached where
  its region is consumed: the input and weights per step of `tile_ic` input-channel blocks;
- the 16x16 block is `tensorize`d onto the GEMM intrinsic; the loops around it become the GEMM
  instruction's micro-op loop nest;
- with `vthreads` V > 1 the output-channel tiles (or, when V does not divide their count, the
  row tiles) are split V ways and the split bound to "vthread.x": `compiler.lower.vthread`
  interleaves the threads, each with its own buffers, and the code generator's dependency
  tokens let one thread's loads run while another computes.
`worth_measuring` rejects configs whose buffers overflow the on-chip memories.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler import te
from compiler.codegen.vta import VTHREAD_CHOICES
from compiler.codegen.vta_intrin import gemm_intrin
from compiler.codegen.vta_lower import lower_program
from compiler.ops.reference import naive_schedule
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.vta_dense import VtaOpTemplate, _clipped, requant, requantize
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.math import clamp
from compiler.te.tensor import ComputeOp, IterVar, Tensor
from protos.vta import Buffer, VtaSpec
from protos.vta_program import ArgLayout, Program

_TILE_HW = (1, 2, 4, 7, 8, 14, 16, 28, 56)
_TILE_C = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class ConvShape:
    """A batch-1 convolution's sizes, and its blocked sizes on a spec's 16x16 block."""

    c: int
    h: int
    w: int
    o: int
    k: int
    stride: int
    pad: int
    block: int = 16

    @property
    def cb(self) -> int:
        return -(-self.c // self.block)

    @property
    def ob(self) -> int:
        return -(-self.o // self.block)

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.pad - self.k) // self.stride + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.pad - self.k) // self.stride + 1


def conv_shape(shape: tuple[int, ...], spec: VtaSpec | None = None) -> ConvShape:
    """The workload (C, H, W, O, K, stride, pad) as a ConvShape.

    Raises:
        ValueError: not seven sizes, a size out of range, or a spec whose GEMM block is not square
            with batch 1.
    """
    spec = spec or VtaSpec()
    if len(shape) != 7:
        raise ValueError(f"vta_conv2d takes (C, H, W, O, K, stride, pad), got {shape}")
    c, h, w, o, k, stride, pad = shape
    if min(c, h, w, o, k, stride) < 1 or pad < 0 or pad > 15:
        raise ValueError(f"vta_conv2d workload {shape}: sizes >= 1, pad 0..15")
    if spec.batch != 1 or spec.block_in != spec.block_out:
        raise ValueError("vta_conv2d needs a spec of batch 1 and a square GEMM block")
    g = ConvShape(c, h, w, o, k, stride, pad, spec.block_in)
    if g.oh < 1 or g.ow < 1:
        raise ValueError(f"vta_conv2d workload {shape}: the kernel is larger than the input")
    return g


def blocked_compute(g: ConvShape) -> list[Tensor]:
    """[x, w, bias, y] of the blocked compute of the module docstring."""
    b, p, s = g.block, g.pad, g.stride
    x = te.placeholder((g.cb, g.h, g.w, b), "int8", name="x")
    w = te.placeholder((g.ob, g.cb, g.k, g.k, b, b), "int8", name="w")
    bias = te.placeholder((g.ob, b), "int32", name="bias")
    data = x
    if p:
        data = te.compute(
            (g.cb, g.h + 2 * p, g.w + 2 * p, b),
            lambda c, yy, xx, i: te.if_then_else(
                te.all_of(
                    te.greater_equal(yy, p),
                    te.less(yy, g.h + p),
                    te.greater_equal(xx, p),
                    te.less(xx, g.w + p),
                ),
                x[c, clamp(yy - p, g.h), clamp(xx - p, g.w), i],
                0,
            ),
            name="x_pad",
        )
    rc = te.reduce_axis((0, g.cb), name="rc")
    ry = te.reduce_axis((0, g.k), name="ry")
    rx = te.reduce_axis((0, g.k), name="rx")
    ri = te.reduce_axis((0, b), name="ri")
    acc = te.compute(
        (g.ob, g.oh, g.ow, b),
        lambda ob, yy, xx, o: te.sum(
            te.cast("int32", data[rc, yy * s + ry, xx * s + rx, ri])
            * te.cast("int32", w[ob, rc, ry, rx, o, ri]),
            axis=[rc, ry, rx, ri],
        ),
        name="acc",
    )
    y = te.compute(
        (g.ob, g.oh, g.ow, b),
        lambda ob, yy, xx, o: requant(acc[ob, yy, xx, o], bias[ob, o]),
        name="y",
    )
    return [x, w, bias, y]


@dataclass(frozen=True)
class ConvTiling:
    """A point of the schedule space: output tile (rows, columns, channel blocks), input-channel
    blocks per reduction step, virtual threads."""

    tile_h: int
    tile_w: int
    tile_oc: int
    tile_ic: int
    vthreads: int = 1


def conv_tiling(config: Mapping[str, Any]) -> ConvTiling:
    """The tiling a `vta_conv2d` config names."""
    return ConvTiling(
        int(config["tile_h"]), int(config["tile_w"]), int(config["tile_oc"]),
        int(config["tile_ic"]), int(config["vthreads"]),
    )  # fmt: skip


def accel_schedule(
    g: ConvShape, tiling: ConvTiling, spec: VtaSpec | None = None
) -> tuple[Schedule, list[Tensor]]:
    """The accelerator's schedule of the blocked compute (see the module docstring)."""
    spec = spec or VtaSpec()
    x, w, bias, y = blocked_compute(g)
    sch = create_schedule(y)
    assert isinstance(y.op, ComputeOp)
    acc = next(t for t in y.op.inputs if t.name == "acc")
    assert isinstance(acc.op, ComputeOp)
    res = sch.cache_write(y, "vta.acc")
    sch[acc].set_scope("vta.acc")
    data = next(t for t in acc.op.inputs if t is not w)
    data_l = sch.cache_read(data, "vta.inp", [acc])
    while data is not x:  # the padding, inlined into the DMA's copy
        assert isinstance(data.op, ComputeOp)
        sch[data].compute_inline()
        data = data.op.inputs[0]
    w_l = sch.cache_read(w, "vta.wgt", [acc])
    bias_l = sch.cache_read(bias, "vta.acc", [res])

    out = sch[y]
    ob, oy, ox, oi = out.axis
    ob_o, ob_i = out.split(ob, tiling.tile_oc)
    oy_o, oy_i = out.split(oy, tiling.tile_h)
    ox_o, ox_i = out.split(ox, tiling.tile_w)
    out.reorder(ob_o, oy_o, ox_o, ob_i, oy_i, ox_i, oi)
    point: IterVar = ox_o
    if tiling.vthreads > 1:
        # Threads take output-channel tiles (each its own weights) unless V divides only the
        # row tiles, or there are fewer channel tiles than rows (a tail is guarded).
        v = tiling.vthreads
        on_oc = ob_o.extent % v == 0 or (oy_o.extent % v != 0 and ob_o.extent >= oy_o.extent)
        _, t = out.split(ob_o if on_oc else oy_o, v)
        out.reorder(*(leaf for leaf in out.leaf_iter_vars[:4] if leaf is not t), t)
        out.bind(t, "vthread.x")
        point = t
    for stage in (bias_l, acc, res):
        sch[stage].compute_at(out, point)

    conv = sch[acc]
    a_ob, a_y, a_x, a_o = conv.axis
    rc, ry, rx, ri = conv.reduce_axis
    rc_o, rc_i = conv.split(rc, tiling.tile_ic)
    conv.reorder(rc_o, a_y, a_x, ry, rx, rc_i, a_ob, a_o, ri)
    sch[data_l].compute_at(conv, rc_o)
    sch[w_l].compute_at(conv, rc_o)
    conv.tensorize(a_o, gemm_intrin(spec))
    return sch, [x, w, bias, y]


def arg_layouts(g: ConvShape) -> tuple[ArgLayout, ...]:
    """How the entry's plain arguments (x NCHW, w OIHW, bias, y NCHW) become the blocked tensors
    (offsets 0: the code generator places them)."""
    b, cp, op = g.block, g.cb * g.block, g.ob * g.block
    return (
        ArgLayout("x", (1, g.c, g.h, g.w), "int8", 0, (1, cp, g.h, g.w),
                  (g.cb, b, g.h, g.w), (0, 2, 3, 1)),
        ArgLayout("w", (g.o, g.c, g.k, g.k), "int8", 0, (op, cp, g.k, g.k),
                  (g.ob, b, g.cb, b, g.k, g.k), (0, 2, 4, 5, 1, 3)),
        ArgLayout("bias", (g.o,), "int32", 0, (op,), (g.ob, b)),
        ArgLayout("y", (1, g.o, g.oh, g.ow), "int8", 0, (1, op, g.oh, g.ow),
                  (g.ob, b, g.oh, g.ow), (0, 2, 3, 1)),
    )  # fmt: skip


def tiling_problem(g: ConvShape, tiling: ConvTiling, spec: VtaSpec) -> str | None:
    """Why `tiling` cannot run on `spec` (an on-chip buffer overflows), or None when it can."""
    if tiling.vthreads not in VTHREAD_CHOICES:
        return f"vthreads must be one of {VTHREAD_CHOICES}"
    v = tiling.vthreads
    th, tw = min(tiling.tile_h, g.oh), min(tiling.tile_w, g.ow)
    toc, tic = min(tiling.tile_oc, g.ob), min(tiling.tile_ic, g.cb)
    rows, cols = (th - 1) * g.stride + g.k, (tw - 1) * g.stride + g.k
    needs = (
        ("INP", v * tic * rows * cols, spec.depth(Buffer.INP)),
        ("WGT", v * toc * tic * g.k * g.k, spec.depth(Buffer.WGT)),
        ("ACC", v * toc * (th * tw + 1), spec.depth(Buffer.ACC)),
    )
    for name, entries, depth in needs:
        if entries > depth:
            return f"{name} needs {entries} entries, the buffer holds {depth}"
    return None


class VtaConv2dTemplate(VtaOpTemplate):
    """int8 y = requant(relu(conv2d(x, w) + bias)) on the accelerator; workload
    (C, H, W, O, K, stride, pad), batch 1."""

    name = "vta_conv2d"
    fields = ("c", "h", "w", "o", "k", "stride", "pad")

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        """The plain-layout compute (NCHW, OIHW): the host's check reference."""
        g = conv_shape(shape, self.spec)
        p, s = g.pad, g.stride
        x = te.placeholder((1, g.c, g.h, g.w), "int8", name="x")
        w = te.placeholder((g.o, g.c, g.k, g.k), "int8", name="w")
        bias = te.placeholder((g.o,), "int32", name="bias")
        data = x
        if p:
            data = te.compute(
                (1, g.c, g.h + 2 * p, g.w + 2 * p),
                lambda n, c, yy, xx: te.if_then_else(
                    te.all_of(te.greater_equal(yy, p), te.less(yy, g.h + p),
                              te.greater_equal(xx, p), te.less(xx, g.w + p)),
                    x[n, c, clamp(yy - p, g.h), clamp(xx - p, g.w)], 0,
                ),
                name="x_pad",
            )  # fmt: skip
        rc = te.reduce_axis((0, g.c), name="rc")
        ry = te.reduce_axis((0, g.k), name="ry")
        rx = te.reduce_axis((0, g.k), name="rx")
        acc = te.compute(
            (1, g.o, g.oh, g.ow),
            lambda n, o, yy, xx: te.sum(
                te.cast("int32", data[n, rc, yy * s + ry, xx * s + rx])
                * te.cast("int32", w[o, rc, ry, rx]),
                axis=[rc, ry, rx],
            ),
            name="acc",
        )
        y = te.compute(
            (1, g.o, g.oh, g.ow), lambda n, o, yy, xx: requant(acc[n, o, yy, xx], bias[o]), name="y"
        )
        return [x, w, bias, y]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """The host's schedule (naive: it is the reference); the accelerator's is
        `accel_schedule`, which `program` lowers into instructions."""
        return naive_schedule(args)

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        g = conv_shape(shape, self.spec)
        return [(1, g.c, g.h, g.w), (g.o, g.c, g.k, g.k), (g.o,)]

    def random_inputs(self, shape: tuple[int, ...], rng: np.random.Generator) -> list[np.ndarray]:
        """int8 x and w over their whole range, int32 bias of a few products' size."""
        x_shape, w_shape, b_shape = self.logical_shapes(shape)
        return [
            rng.integers(-128, 128, x_shape, dtype=np.int8),
            rng.integers(-128, 128, w_shape, dtype=np.int8),
            rng.integers(-(1 << 16), 1 << 16, b_shape, dtype=np.int32),
        ]

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """The output for stride 1 and no padding; `reference_for` knows the workload's."""
        x, w, bias = inputs
        return conv_reference(x, w, bias, 1, 0)

    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        g = conv_shape(shape, self.spec)
        x, w, bias = inputs
        return conv_reference(x, w, bias, g.stride, g.pad)

    def flop(self, shape: tuple[int, ...]) -> float:
        g = conv_shape(shape, self.spec)
        return 2.0 * g.o * g.oh * g.ow * g.c * g.k * g.k

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        """Output tiles along rows, columns and channel blocks, the reduction step in input
        channel blocks (each clipped to the workload), and vthreads."""
        g = conv_shape(shape, self.spec)
        return ConfigSpace(
            [
                Knob("tile_h", _clipped(_TILE_HW, g.oh)),
                Knob("tile_w", _clipped(_TILE_HW, g.ow)),
                Knob("tile_oc", _clipped(_TILE_C, g.ob)),
                Knob("tile_ic", _clipped(_TILE_C, g.cb)),
                Knob("vthreads", VTHREAD_CHOICES),
            ]
        )

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        """False for a tiling whose buffers overflow the accelerator's memories."""
        g = conv_shape(shape, self.spec)
        return tiling_problem(g, conv_tiling(config), self.spec) is None

    def program(self, shape: tuple[int, ...], config: Mapping[str, Any]) -> Program:
        """The accelerator program of `config`, lowered from `accel_schedule`.

        Raises:
            ValueError: the tiling cannot run (`worth_measuring` is False for it).
        """
        g = conv_shape(shape, self.spec)
        tiling = conv_tiling(config)
        problem = tiling_problem(g, tiling, self.spec)
        if problem:
            raise ValueError(f"vta_conv2d {shape} {tiling}: {problem}")
        sch, args = accel_schedule(g, tiling, self.spec)
        return lower_program(sch, args, arg_layouts(g), self.spec, "vta_conv2d")


def conv_reference(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray, stride: int, pad: int
) -> np.ndarray:
    """The op by numpy on plain arrays: x int8[1, C, H, W], w int8[O, C, K, K], bias int32[O]."""
    k = w.shape[2]
    xp = np.pad(x[0].astype(np.int64), ((0, 0), (pad, pad), (pad, pad)))
    oh = (xp.shape[1] - k) // stride + 1
    ow = (xp.shape[2] - k) // stride + 1
    acc = np.zeros((w.shape[0], oh, ow), np.int64)
    for ky in range(k):
        for kx in range(k):
            window = xp[:, ky : ky + stride * oh : stride, kx : kx + stride * ow : stride]
            acc += np.einsum("chw,oc->ohw", window, w[:, :, ky, kx].astype(np.int64))
    return requantize(acc + bias.astype(np.int64)[:, None, None])[None]


def dense_program(
    shape: tuple[int, ...], config: Mapping[str, Any], spec: VtaSpec | None = None
) -> Program:
    """A `vta_dense` config's program through this TE path: the dense layer y = x @ w.T is the
    1x1 convolution of an M x 1 image with K channels into N, so the same schedule and lowering
    apply (`tile_m` rows as `tile_h`, `tile_n` / `tile_k` as the channel-block tiles). Its
    entry takes vta_dense's plain arguments x [M, K], w [N, K], bias [N], y [M, N].

    Raises:
        ValueError: the tiling does not fit the on-chip buffers.
    """
    spec = spec or VtaSpec()
    m, n, k = shape
    g = ConvShape(k, m, 1, n, 1, 1, 0, spec.block_in)
    tiling = ConvTiling(
        int(config["tile_m"]), 1, int(config["tile_n"]), int(config["tile_k"]),
        int(config["vthreads"]),
    )  # fmt: skip
    problem = tiling_problem(g, tiling, spec)
    if problem:
        raise ValueError(f"vta_dense {shape} via TE {tiling}: {problem}")
    b, kp, np_ = g.block, g.cb * g.block, g.ob * g.block
    layouts = (
        ArgLayout("x", (m, k), "int8", 0, (m, kp), (m, g.cb, b), (1, 0, 2)),
        ArgLayout("w", (n, k), "int8", 0, (np_, kp), (g.ob, b, g.cb, b), (0, 2, 1, 3)),
        ArgLayout("bias", (n,), "int32", 0, (np_,), (g.ob, b)),
        ArgLayout("y", (m, n), "int8", 0, (m, np_), (m, g.ob, b), (1, 0, 2)),
    )
    sch, args = accel_schedule(g, tiling, spec)
    return lower_program(sch, args, layouts, spec, "vta_dense")

"""CUDA conv2d templates, NCHW input and OIHW weights: `cuda_conv2d` (direct) and
`cuda_conv2d_gemm` (implicit GEMM).

Workload (N, C, H, W, O, KH, KW, stride, pad[, epilogue]), float32, for both; H and W are the
unpadded input's (the kernels pad it themselves: a read outside the image is a zero), and
`epilogue` is a `gemm.Epilogue` (0 none, 1 + bias, 2 + bias then ReLU, 3 + bias then ReLU6,
as the CPU conv templates number them, 4 + bias + residual then ReLU), applied per output
channel to the accumulators as they are stored. Arguments: the input [N][C][H][W], the weight
(see each template), the bias [O] and the residual [N][O][OH][OW] (epilogue 4),
and the output, declared in the config's tile shape with the bytes of [N][O][OH][OW] (as the
GEMM templates do, see `gemm`): `unpack_output` reshapes it.

Nothing here was measured: no GPU was at hand when these templates were written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from compiler import te
from compiler.ir import expr as E
from compiler.ops.conv2d import conv2d_reference, local_accumulators
from compiler.ops.cuda.gemm import (
    MAX_ACCUMULATORS,
    AxisTile,
    Epilogue,
    GemmOperand,
    GemmProblem,
    GemmTemplateBase,
    ReshapedArgsTemplate,
    apply_epilogue,
    axis_tile_choices,
    epilogue_reference,
    most_threads,
    parse_epilogue,
)
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import check_workload, divisors
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te import math as tm
from compiler.te.tensor import Tensor

FIELDS = ("N", "C", "H", "W", "O", "KH", "KW", "stride", "pad", "epilogue")


def conv_workload(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The workload checked (epilogue 0 when left out), with (OH, OW) appended.

    Raises:
        ValueError: a field is out of range or the kernel does not fit the padded input.
    """
    if isinstance(shape, tuple) and len(shape) == len(FIELDS) - 1:
        shape = (*shape, 0)
    _, _, h, w, _, kh, kw, stride, pad, epilogue = check_workload(
        name, shape, FIELDS, may_be_zero=("pad", "epilogue")
    )
    parse_epilogue(name, epilogue)
    if h + 2 * pad < kh or w + 2 * pad < kw:
        raise ValueError(f"{name}: a {kh}x{kw} kernel does not fit the padded input")
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (w + 2 * pad - kw) // stride + 1
    return (*shape, oh, ow)


def padded_read(x: Tensor, n: E.Expr, c: E.Expr, ih: E.Expr, iw: E.Expr, pad: int) -> E.Expr:
    """x[n, c, ih, iw], zero outside the image (indices clamped: both sides are evaluated)."""
    _, _, h, w = x.shape
    if not pad:
        return x[n, c, ih, iw]
    inside = tm.all_of(tm.in_range(ih, h), tm.in_range(iw, w))
    return tm.if_then_else(inside, x[n, c, tm.clamp(ih, h), tm.clamp(iw, w)], 0.0)


class _ConvBase(ReshapedArgsTemplate):
    fields = FIELDS

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        n, c, h, w, o, kh, kw, _, _, epi, oh, ow = conv_workload(self.name, shape)
        shapes: list[tuple[int, ...]] = [(n, c, h, w), (o, c, kh, kw)]
        if epi:
            shapes.append((o,))
        if epi == Epilogue.BIAS_ADD_RELU:
            shapes.append((n, o, oh, ow))
        return shapes

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        n, _, _, _, o, *_, oh, ow = conv_workload(self.name, shape)
        return (n, o, oh, ow)

    def flop(self, shape: tuple[int, ...]) -> float:
        n, c, _, _, o, kh, kw, *_, oh, ow = conv_workload(self.name, shape)
        return 2.0 * n * o * oh * ow * c * kh * kw

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        raise NotImplementedError("a convolution's reference needs its workload: reference_for")

    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        *_, stride, pad, epi, _, _ = conv_workload(self.name, shape)
        out = conv2d_reference(inputs[0], inputs[1], None, stride, pad, relu=False)
        bias = np.asarray(inputs[2], np.float64).reshape(1, -1, 1, 1) if epi else None
        residual = inputs[3].astype(np.float64) if epi == Epilogue.BIAS_ADD_RELU else None
        return epilogue_reference(out.astype(np.float64), bias, residual, Epilogue(epi))


class CudaConv2dGemmTemplate(_ConvBase, GemmTemplateBase):
    """Implicit GEMM: per image, [O] x [OH*OW] = W [O][C*KH*KW] . im2col(X) [C*KH*KW][OH*OW].

    The GEMM schedule of `gemm` (same knobs) with M = O, N = OH*OW, K = C*KH*KW and the batch
    on blockIdx.z; the weight is declared [O][C*KH*KW] (OIHW's bytes), and the B tile is
    gathered from the input by index arithmetic as it is copied into shared memory (pixel p,
    reduction index k -> x[c, oh*s + ky - pad, ow*s + kx - pad], zero in the padding), so no
    im2col matrix is ever written. Output rows are channels: the output tile is NCHW directly
    and the bias is indexed by row.
    """

    name = "cuda_conv2d_gemm"

    def gemm_inputs(self, shape: tuple[int, ...]) -> list[Tensor]:
        n, c, h, w, o, kh, kw, *_ = conv_workload(self.name, shape)
        return [te.placeholder((n, c, h, w), name="X"), te.placeholder((o, c * kh * kw), name="W")]

    def epilogue_of(self, shape: tuple[int, ...]) -> Epilogue:
        return Epilogue(conv_workload(self.name, shape)[9])

    def problem(self, shape: tuple[int, ...], args: Sequence[Tensor]) -> GemmProblem:
        n, c, _, _, o, kh, kw, stride, pad, epi, oh, ow = conv_workload(self.name, shape)
        x, wt = args[0], args[1]

        def gather(b: E.Expr | None, p: E.Expr, k: E.Expr) -> E.Expr:
            assert b is not None
            ch, tap = k // (kh * kw), k % (kh * kw)
            ih = (p // ow) * stride + tap // kw - pad
            iw = (p % ow) * stride + tap % kw - pad
            return padded_read(x, b, ch, ih, iw, pad)

        return GemmProblem(
            n,
            o,
            oh * ow,
            c * kh * kw,
            GemmOperand(lambda _b, i, k: wt[i, k], k_contiguous=True, aligned=c * kh * kw % 4 == 0),
            GemmOperand(gather, k_contiguous=False),
            Epilogue(epi),
            bias_on_rows=True,
        )

    def vector_ok(self, shape: tuple[int, ...]) -> bool:
        _, c, _, _, _, kh, kw, *_ = conv_workload(self.name, shape)
        return (c * kh * kw) % 4 == 0


# -- direct -----------------------------------------------------------------------------------

MAX_THREADS = (16, 8, 8)  # threads along o, oh, ow: at most 1024 a block
MAX_REG = 8  # output pixels of a row or column a thread keeps
MAX_C_TILE = 16
SHARED_BYTES = 48 * 1024  # static shared memory of a block (nvcc refuses more)
MAX_WINDOW = 48  # input rows (columns) a block's shared window may span
WEIGHT_TILE_BYTES = 16 * 1024  # one input channel's weights of a block's output channels


def shared_footprint(
    shape: tuple[int, ...], tiles: tuple[AxisTile, AxisTile, AxisTile], c_tile: int, double: bool
) -> int:
    """Bytes of shared memory the direct schedule takes: the input window and the weights of
    `c_tile` channels, twice when double buffered."""
    _, _, _, _, _, kh, kw, stride, *_ = shape
    to, th, tw = tiles
    rows, cols = (th.block - 1) * stride + kh, (tw.block - 1) * stride + kw
    return c_tile * (rows * cols + to.block * kh * kw) * 4 * (2 if double else 1)


def pixel_tile_choices(extent: int, max_threads: int) -> tuple[str, ...]:
    """ "1xTxR" splits of an output-pixel axis that divide it, 8 elements a block first."""
    tiles = [
        AxisTile(1, t, r)
        for t in range(1, max_threads + 1)
        for r in range(1, MAX_REG + 1)
        if extent % (t * r) == 0
    ]
    tiles.sort(key=lambda a: (abs(math.log2(a.block / 8)), abs(math.log2(a.reg / 2))))
    return tuple(str(a) for a in tiles)


def _capped(choices: tuple[str, ...], max_threads: int) -> tuple[str, ...]:
    return tuple(c for c in choices if AxisTile.parse(c).threads <= max_threads)


class CudaConv2dTemplate(_ConvBase):
    """Direct convolution: a block computes BO channels x BH x BW output pixels of one image,
    each thread VO*RO channels x RH x RW pixels in registers (threadIdx.z/y/x over channels,
    rows, columns); per step of `c_tile` input channels the block copies the input window those
    pixels read (padding materialised as zeros) and the BO x c_tile x KH x KW weights into
    shared memory, then every thread runs its taps over them.

    Knobs: `tile_o` ("VxTxR", as the GEMM's: virtual threads spread a thread's channels BO/V
    apart), `tile_h` / `tile_w` ("1xTxR": threads and registers along output rows and columns;
    R consecutive pixels of a thread reuse overlapping input columns from registers), `c_tile`
    (input channels a shared step: more is fewer barriers, more shared memory), `taps_inner`
    (kernel taps inside the channel loop, unrolled: TVM's order rc, ry, rx innermost, so a
    tap's input reads are adjacent shared words), `double_buffer` (as the GEMM's).
    The tiles are capped so that one channel's window and weights fit 48 KiB of shared memory;
    a config whose c_tile (or double buffering) does not fit is built with the largest c_tile
    that does (`effective`), and is not worth measuring. Weight argument: OIHW as it is.
    """

    name = "cuda_conv2d"

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        _, c, _, _, o, kh, kw, stride, *_, oh, ow = conv_workload(self.name, shape)
        # the caps keep every config's smallest shared footprint (one channel, single
        # buffered) under SHARED_BYTES; `effective` then shrinks c_tile to fit
        max_bo = max(1, min(64, WEIGHT_TILE_BYTES // (4 * kh * kw)))
        tile_o = tuple(
            t
            for t in _capped(axis_tile_choices(o), MAX_THREADS[0])
            if AxisTile.parse(t).block <= max_bo or t == "1x1x1"
        )

        def pixels(extent: int, k: int, threads: int) -> tuple[str, ...]:
            return tuple(
                t
                for t in pixel_tile_choices(extent, threads)
                if (AxisTile.parse(t).block - 1) * stride + k <= MAX_WINDOW or t == "1x1x1"
            )

        return ConfigSpace(
            [
                Knob("tile_o", tile_o),
                Knob("tile_h", pixels(oh, kh, MAX_THREADS[1])),
                Knob("tile_w", pixels(ow, kw, MAX_THREADS[2])),
                Knob("c_tile", tuple(sorted(divisors(c, MAX_C_TILE), key=lambda d: -d))),
                Knob("taps_inner", (True, False)),
                Knob("double_buffer", (False, True)),
            ]
        )

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        if self.effective(shape, config) != (config["c_tile"], config["double_buffer"]):
            return False  # shrunk to fit shared memory: the same kernel as another config
        to, th, tw = (AxisTile.parse(config[k]) for k in ("tile_o", "tile_h", "tile_w"))
        accumulators = to.vthread * to.reg * th.reg * tw.reg
        space = self.config_space(shape)
        possible = math.prod(most_threads(k.choices) for k in space.knobs[:3])
        threads = to.threads * th.threads * tw.threads
        return accumulators <= MAX_ACCUMULATORS and threads >= min(32, possible)

    layout_knobs = ("tile_o", "tile_h", "tile_w")

    def effective(self, shape: tuple[int, ...], config: Config) -> tuple[int, bool]:
        """(c_tile, double_buffer) as built: the config's, or with c_tile shrunk to the largest
        divisor of C that fits SHARED_BYTES (then double buffering dropped, if even one channel
        does not fit twice)."""
        c = shape[1]
        tiles = self.tiles(shape, config)
        double = bool(config["double_buffer"])
        for db in (double, False) if double else (False,):
            for ct in (d for d in reversed(divisors(c)) if d <= int(config["c_tile"])):
                if shared_footprint(shape, tiles, ct, db) <= SHARED_BYTES:
                    return ct, db
        return 1, False

    def tiles(
        self, shape: tuple[int, ...], config: Config | None
    ) -> tuple[AxisTile, AxisTile, AxisTile]:
        space = self.config_space(shape) if config is None else None
        values = space.get(0) if space is not None else config
        assert values is not None
        to, th, tw = (AxisTile.parse(values[k]) for k in ("tile_o", "tile_h", "tile_w"))
        return to, th, tw

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, c, h, w, o, kh, kw, stride, pad, epi, oh, ow = conv_workload(self.name, shape)
        to, th, tw = self.tiles(shape, config)
        x = te.placeholder((n, c, h, w), name="X")
        wt = te.placeholder((o, c, kh, kw), name="W")
        hp, wp = h + 2 * pad, w + 2 * pad
        x_s = te.compute(
            (n, c, hp, wp),
            lambda b, ch, y, xx: padded_read(x, b, ch, y - pad, xx - pad, pad),
            name="X_shared",
        )
        w_s = te.compute((o, c, kh, kw), lambda *i: wt[i], name="W_shared")
        rc = te.reduce_axis((0, c), name="rc")
        ry = te.reduce_axis((0, kh), name="ry")
        rx = te.reduce_axis((0, kw), name="rx")

        def index(parts: Sequence[E.Expr], t: AxisTile) -> E.Expr:
            if len(parts) == 4:
                g, v, th_, r = parts
                return g * t.block + v * (t.threads * t.reg) + th_ * t.reg + r
            g, th_, r = parts
            return g * t.block + th_ * t.reg + r

        def body(b: E.Var, *ix: E.Var) -> E.Expr:
            oc = index(ix[:4], to)
            y = index(ix[4:7], th)
            xx = index(ix[7:], tw)
            return te.sum(
                x_s[b, rc, y * stride + ry, xx * stride + rx] * w_s[oc, rc, ry, rx],
                axis=[rc, ry, rx],
            )

        out_shape = (
            n,
            *(o // to.block, to.vthread, to.threads, to.reg),
            *(oh // th.block, th.threads, th.reg),
            *(ow // tw.block, tw.threads, tw.reg),
        )
        acc = te.compute(out_shape, body, name="C_acc")
        if not epi:
            return [x, wt, acc]
        bias = te.placeholder((o,), name="bias")
        extra = [bias]
        if epi == Epilogue.BIAS_ADD_RELU:
            extra.append(te.placeholder(out_shape, name="residual"))

        def epilogue(b: E.Var, *ix: E.Var) -> E.Expr:
            residual = extra[1][(b, *ix)] if len(extra) > 1 else None
            return apply_epilogue(acc[(b, *ix)], bias[index(ix[:4], to)], residual, Epilogue(epi))

        return [x, wt, *extra, te.compute(out_shape, epilogue, name="C")]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """Blocks (image x channel tiles on z, row tiles on y, column tiles on x), threads,
        a local accumulator tile, shared input and weight tiles per channel step."""
        to, th, tw = self.tiles(shape, config)
        out = args[-1]
        sch = create_schedule(out)
        acc = local_accumulators(sch, out)
        st = sch[out]
        b, go, vo, to_, ro, gh, th_, rh, gw, tw_, rw = st.axis
        st.reorder(b, go, gh, gw, to_, th_, tw_, vo, ro, rh, rw)
        bz = st.fuse(b, go)
        for ax, tag in (
            (bz, "blockIdx.z"),
            (gh, "blockIdx.y"),
            (gw, "blockIdx.x"),
            (to_, "threadIdx.z"),
            (th_, "threadIdx.y"),
            (tw_, "threadIdx.x"),
        ):
            st.bind(ax, tag)
        for ax in (vo, ro, rh):
            st.unroll(ax)
        # a thread's 4 consecutive pixels of a row as one 128-bit store where provably aligned
        if tw.reg % 4 == 0:
            st.vectorize(rw)
        else:
            st.unroll(rw)

        la = sch[acc]
        la.compute_at(st, tw_)
        lb, lgo, lvo, lto, lro, lgh, lth, lrh, lgw, ltw, lrw = la.axis
        rc, ry, rx = la.reduce_axis
        c_tile, double = self.effective(shape, config)
        rco, rci = la.split(rc, c_tile)
        tile = (lvo, lro, lrh, lrw)
        if config["taps_inner"]:
            la.reorder(lb, lgo, lto, lgh, lth, lgw, ltw, rco, rci, ry, rx, *tile)
            la.unroll(ry)
            la.unroll(rx)
        else:
            la.reorder(lb, lgo, lto, lgh, lth, lgw, ltw, rco, ry, rx, rci, *tile)
        for ax in tile:
            la.unroll(ax)

        stages = {s.op.name: s for s in sch.stages}
        nthreads = to.threads * th.threads * tw.threads
        for name in ("X_shared", "W_shared"):
            s = stages[name]
            s.set_scope("shared")
            s.compute_at(la, rco)
            if double:
                s.double_buffer()
            fused = s.fuse(*s.op.axis)
            _, flat = s.split(fused, nthreads)
            z, rest = s.split(flat, nparts=to.threads)
            y, x = s.split(rest, nparts=th.threads)
            s.bind(z, "threadIdx.z")
            s.bind(y, "threadIdx.y")
            s.bind(x, "threadIdx.x")
        return sch

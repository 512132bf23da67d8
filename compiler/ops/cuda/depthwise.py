"""Depthwise conv2d on a GPU, NCHW: each channel convolved with its own KxK filter.

Workload (N, C, H, W, KH, KW, stride, pad, epilogue) as the CPU template's (epilogue 0: none,
1: + bias, 2: + bias then ReLU, 3: + bias then ReLU6), in plain NCHW: the input `[N][C][H][W]`
(not padded), the weight `[C][1][KH][KW]` (ONNX's), the bias `[C]` when there is an epilogue,
and the output `[N][C][OH][OW]`.

A block computes a tile of `tile_c` channels x `tile_h` rows x `tile_w * reg_w` columns of
output, one thread (threadIdx.z, .y, .x) per channel, row and column of the tile, `reg_w`
pixels a thread `tile_w` apart (so a warp's stores are consecutive pixels). The block first
copies the input its tile reads, padding included ((tile_h - 1) * stride + KH rows by
(tile_w * reg_w - 1) * stride + KW columns a channel), into shared memory, every thread
fetching its share; each thread then accumulates each of its pixels in a register (a "local"
stage) from that tile and the channel's weights (read through the L1 cache), and the epilogue
is applied as the accumulator is stored. Overlapping windows read each input element
KH * KW / stride^2 times from shared memory instead of from L2. Sizes need not divide the
tile: tails are guarded. Knobs:
- `tile_c`, `tile_h`, `tile_w`: the threads of a block along channels, rows and columns, so the
  block's size and its tile's halo overhead (a taller, wider tile re-reads a smaller share of
  its input's border); the choices keep the shared tile within 48 KB.
- `reg_w`: output pixels a thread (more work per thread and per shared tile, fewer blocks).
- `unroll_kw`: unroll the window's column loop; when KH * KW <= 16 the row loop too, and the
  thread's channel weights are then loaded into registers once for its `reg_w` pixels.
Which tile wins depends on the GPU's occupancy and shared-memory bandwidth: measure it.
"""

from __future__ import annotations

from compiler import te
from compiler.ir import expr as E
from compiler.ops.conv2d import RELU6_CAP
from compiler.ops.depthwise import Depthwise
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.math import all_of, clamp, in_range
from compiler.te.tensor import Tensor

SHARED_BYTES = 48 * 1024  # static shared memory a block may declare
TILE_C = (1, 2, 4)
TILE_H = (1, 2, 4, 8)
TILE_W = (8, 16, 32)
REG_W = (1, 2)


def shared_tile_bytes(kh: int, kw: int, stride: int, tc: int, th: int, tw: int) -> int:
    """Bytes of the float32 input tile of a block of `tc` x `th` x `tw` output pixels."""
    return 4 * tc * ((th - 1) * stride + kh) * ((tw - 1) * stride + kw)


class CudaDepthwiseConv2dTemplate(Depthwise):
    """Depthwise convolution, a shared-memory input tile per block (see the module doc)."""

    name = "cuda_depthwise_conv2d"

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        _, _, _, _, kh, kw, stride, *_ = self.geometry(shape)
        tile_c, tile_h = list(TILE_C), list(TILE_H)
        # Drop the largest tiles until the largest combination's input tile fits shared memory.
        while (
            shared_tile_bytes(kh, kw, stride, tile_c[-1], tile_h[-1], TILE_W[-1] * REG_W[-1])
            > SHARED_BYTES
        ):
            if len(tile_c) >= len(tile_h) and len(tile_c) > 1:
                tile_c.pop()
            elif len(tile_h) > 1:
                tile_h.pop()
            else:
                raise ValueError(f"{self.name}: a {kh}x{kw}/{stride} window's tile is too big")
        return ConfigSpace(
            [
                Knob("tile_c", tuple(tile_c)),
                Knob("tile_h", tuple(tile_h)),
                Knob("tile_w", TILE_W),
                Knob("reg_w", REG_W),
                Knob("unroll_kw", (True, False)),
            ]
        )

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, c, h, w, kh, kw, stride, pad, epilogue, oh, ow = self.geometry(shape)
        data = te.placeholder((n, c, h, w), name="data")
        weight = te.placeholder((c, 1, kh, kw), name="weight")
        x = data
        if pad:

            def padded(b: E.Var, ch: E.Var, y: E.Var, xx: E.Var) -> E.Expr:
                iy, ix = y - E.IntImm(pad), xx - E.IntImm(pad)
                value = data[b, ch, clamp(iy, h), clamp(ix, w)]
                return E.Select(all_of(in_range(iy, h), in_range(ix, w)), value, E.FloatImm(0.0))

            x = te.compute((n, c, h + 2 * pad, w + 2 * pad), padded, name="data_pad")
        ry = te.reduce_axis((0, kh), name="ry")
        rx = te.reduce_axis((0, kw), name="rx")
        conv = te.compute(
            (n, c, oh, ow),
            lambda b, ch, y, xx: te.sum(
                x[b, ch, y * stride + ry.var, xx * stride + rx.var] * weight[ch, 0, ry, rx],
                axis=(ry, rx),
            ),
            name="conv" if epilogue else "out",
        )
        if not epilogue:
            return [data, weight, conv]
        bias = te.placeholder((c,), name="bias")

        def with_bias(b: E.Var, ch: E.Var, y: E.Var, xx: E.Var) -> E.Expr:
            value: E.Expr = conv[b, ch, y, xx] + bias[ch]
            if epilogue >= 2:
                value = E.Max(value, E.FloatImm(0.0))
            return E.Min(value, E.FloatImm(RELU6_CAP)) if epilogue == 3 else value

        return [data, weight, bias, te.compute(conv.shape, with_bias, name="out")]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """Block loop (n, c tile, row tile, column tile fused) | tz, ty, tx | reg_w pixels; the
        input tile in shared memory at the block loop, an accumulator per pixel."""
        kh, kw = self.geometry(shape)[4:6]
        out = args[-1]
        sch = create_schedule(out)
        conv = next((t for t in sch[out].op.inputs if t.name == "conv"), None)
        if conv is None:
            acc = sch.cache_write(out, "local")
        else:
            acc = conv
            sch[acc].set_scope("local")
        tc, th, tw, rw = (int(config[k]) for k in ("tile_c", "tile_h", "tile_w", "reg_w"))
        st = sch[out]
        b, ch, y, xx = st.axis
        co, ci = st.split(ch, tc)
        yo, yi = st.split(y, th)
        xo, xrest = st.split(xx, tw * rw)
        xr, xt = st.split(xrest, tw)
        st.reorder(b, co, yo, xo, ci, yi, xt, xr)
        block = st.fuse(b, co, yo, xo)
        st.bind(block, "blockIdx.x")
        for ax, tag in ((ci, "threadIdx.z"), (yi, "threadIdx.y"), (xt, "threadIdx.x")):
            st.bind(ax, tag)
        st.unroll(xr)
        sa = sch[acc]
        sa.compute_at(st, xr)
        ry, rx = sa.reduce_axis
        if config["unroll_kw"]:
            sa.unroll(rx)
            if kh * kw <= 16:
                sa.unroll(ry)
                # the whole window unrolled: the channel's weights in registers, loaded once
                # a thread for its reg_w pixels (constant indices, so register promotion takes
                # them; a loop over the window would leave them in local memory)
                wl = sch[sch.cache_read(args[1], "local", [acc])]
                wl.compute_at(st, xt)
                for ax in wl.axis[2:]:
                    wl.unroll(ax)
        pad_stage = next((s for s in sch.stages if s.name == "data_pad"), None)
        if pad_stage is not None:
            pad_stage.set_scope("shared")
            tile = pad_stage
        else:
            tile = sch[sch.cache_read(args[0], "shared", [acc])]
        tile.compute_at(st, block)
        flat = tile.fuse(*tile.axis)
        _, inner = tile.split(flat, tc * th * tw)
        tz, rest = tile.split(inner, th * tw)
        ty, tx = tile.split(rest, tw)
        for ax, tag in ((tz, "threadIdx.z"), (ty, "threadIdx.y"), (tx, "threadIdx.x")):
            tile.bind(ax, tag)
        return sch

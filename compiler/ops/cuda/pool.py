"""Pooling on a GPU, NCHW: max and average over KxK windows, and global average.

Window pooling, workload (N, C, H, W, K, stride, pad) as the CPU template's, but the input is
the plain NCHW tensor, not padded: the window reads outside the image as -inf (max) or 0
(average, whose divisor is always K*K: ONNX's count_include_pad=1) through a select, so no pad
kernel or padded copy runs first. One thread computes an output pixel, accumulating its window
in a register (a "local" cache_write); the output's axes are fused and mapped onto the grid as
an injective op's (`injective.bind_flat`), so a warp's stores are consecutive pixels of a row.
Knobs: `threads` a block, `unroll` pixels a thread (`threads` apart, so stores stay coalesced),
and `unroll_window` (unroll the KxK window: straight-line loads for the common 2x2 and 3x3).
Neighbouring windows overlap (stride < K) and their shared input is read again from L1/L2, not
staged in shared memory: pooling is bound by memory bandwidth, and only a GPU can say whether
a shared tile would pay for its barrier.

Global average, workload (N, C, H, W) -> (N, C). Knob `reduce`: "thread" gives a plane to one
thread (many channels, small planes: ResNet's 7x7), "block" gives a plane to a block of
`threads` threads that combine their sums in shared memory (few channels, large planes: a
cross-thread reduction, `compiler.lower.allreduce`).
"""

from __future__ import annotations

from compiler import te
from compiler.ir import expr as E
from compiler.ops.cuda.injective import bind_flat
from compiler.ops.pool import GLOBAL_FIELDS, GlobalAvgPool, WindowPool
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import check_workload
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.math import all_of, clamp, in_range
from compiler.te.tensor import Tensor

THREADS = (64, 128, 256, 512)


class CudaPool2dTemplate(WindowPool):
    """Max or average pooling of NCHW data, padding applied in the kernel."""

    def __init__(self, mode: str) -> None:
        super().__init__(mode, f"cuda_{mode}_pool2d")

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        self.geometry(shape)
        return ConfigSpace(
            [
                Knob("threads", THREADS),
                Knob("unroll", (1, 2, 4)),
                Knob("unroll_window", (True, False)),
            ]
        )

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, c, h, w, k, stride, pad, oh, ow = self.geometry(shape)
        x = te.placeholder((n, c, h, w), name="data")
        ry = te.reduce_axis((0, k), name="ry")
        rx = te.reduce_axis((0, k), name="rx")
        outside = E.FloatImm(float("-inf") if self.mode == "max" else 0.0)

        def body(b: E.Var, ch: E.Var, y: E.Var, xx: E.Var) -> E.Expr:
            iy = y * stride + ry.var - E.IntImm(pad)
            ix = xx * stride + rx.var - E.IntImm(pad)
            value: E.Expr = x[b, ch, iy, ix]
            if pad:
                inside = all_of(in_range(iy, h), in_range(ix, w))
                value = E.Select(inside, x[b, ch, clamp(iy, h), clamp(ix, w)], outside)
            if self.mode == "max":
                return te.max(value, axis=(ry, rx))
            return te.sum(value * (1.0 / (k * k)), axis=(ry, rx))

        return [x, te.compute((n, c, oh, ow), body, name="out")]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """Output pixels over the grid (`bind_flat`), each one's window in a local accumulator."""
        out = args[-1]
        sch = create_schedule(out)
        acc = sch.cache_write(out, "local")
        st = sch[out]
        inner = bind_flat(st, list(st.axis), int(config["threads"]), int(config["unroll"]))
        sa = sch[acc]
        sa.compute_at(st, inner)
        if config["unroll_window"]:
            sa.unroll(sa.reduce_axis[0])
            sa.unroll(sa.reduce_axis[1])
        return sch


class CudaGlobalAvgPoolTemplate(GlobalAvgPool):
    """The mean over H and W of NCHW data, per channel: a plane per thread or per block."""

    name = "cuda_global_avg_pool2d"

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        check_workload(self.name, shape, GLOBAL_FIELDS)
        return ConfigSpace([Knob("reduce", ("thread", "block")), Knob("threads", THREADS)])

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, c, h, w = check_workload(self.name, shape, GLOBAL_FIELDS)
        x = te.placeholder((n, c, h, w), name="data")
        ry = te.reduce_axis((0, h), name="ry")
        rx = te.reduce_axis((0, w), name="rx")
        scale = 1.0 / (h * w)
        out = te.compute(
            (n, c), lambda b, ch: te.sum(x[b, ch, ry, rx] * scale, axis=(ry, rx)), name="out"
        )
        return [x, out]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """ "thread": (n, c) over the grid, a plane in a local accumulator; "block": (n, c) on
        blockIdx.x, the plane's pixels fused and strided over the threads, a cross-thread sum."""
        out = args[-1]
        sch = create_schedule(out)
        threads = int(config["threads"])
        if config["reduce"] == "thread":
            acc = sch.cache_write(out, "local")
            st = sch[out]
            sch[acc].compute_at(st, bind_flat(st, list(st.axis), threads))
            return sch
        st = sch[out]
        st.bind(st.fuse(*st.axis), "blockIdx.x")
        _, pixel = st.split(st.fuse(*st.reduce_axis), threads)
        st.bind(pixel, "threadIdx.x")
        return sch

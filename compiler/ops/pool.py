"""Pooling in NCHW[x]c: max and average over KxK windows, and global average.

Window pooling, workload (N, C, H, W, K, stride, pad): the input comes pre-padded
`[N][C/cb][H+2p][W+2p][cb]` (with -inf for max, zeros for average, whose divisor is always K*K:
ONNX's count_include_pad=1), the output is `[N][C/cb][OH][OW][cb]`. The window is a max or
sum reduction over `ow_tile` pixel vectors at a time (max as a reduction, not a chain of max
expressions: C renders max(a, b) as a conditional that repeats its operands).
Global average, workload (N, C, H, W): `[N][C/cb][H][W][cb]` -> `[N][C/cb][cb]`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler import te
from compiler.ir import expr as E
from compiler.ops.base import NO_PARALLEL, OpTemplate, parallel_of, parallelize
from compiler.ops.conv2d import PARALLEL, PARALLEL_LOOPS
from compiler.ops.layout import pack_nchwc, pad_spatial, unpack_nchwc
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import channel_blocks, check_workload, tile_choices
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.tensor import Tensor

WINDOW_FIELDS = ("N", "C", "H", "W", "K", "stride", "pad")
GLOBAL_FIELDS = ("N", "C", "H", "W")


def pool_reference(x: np.ndarray, k: int, stride: int, pad: int, mode: str) -> np.ndarray:
    """NCHW max or average (count_include_pad) pooling, by numpy."""
    fill = -np.inf if mode == "max" else 0.0
    xp = pad_spatial(x.astype(np.float64), pad, fill)
    _, _, hp, wp = xp.shape
    oh, ow = (hp - k) // stride + 1, (wp - k) // stride + 1
    windows = [
        xp[:, :, y : y + stride * (oh - 1) + 1 : stride, xx : xx + stride * (ow - 1) + 1 : stride]
        for y in range(k)
        for xx in range(k)
    ]
    if mode == "max":
        return np.maximum.reduce(windows).astype(np.float32)
    return (np.sum(windows, axis=0) / (k * k)).astype(np.float32)


class WindowPool(OpTemplate):
    """What a KxK window pooling template shares, whatever its device and layout: the workload
    (N, C, H, W, K, stride, pad), its checks and output size, the numpy reference and FLOPs.
    Subclasses lay out and schedule it."""

    fields = WINDOW_FIELDS

    def __init__(self, mode: str, name: str) -> None:
        if mode not in ("max", "avg"):
            raise ValueError(f"pool mode must be max or avg, got {mode!r}")
        self.mode = mode
        self.name = name

    def geometry(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The workload checked, with (OH, OW) appended."""
        _, _, h, w, k, stride, pad = check_workload(
            self.name, shape, WINDOW_FIELDS, may_be_zero=("pad",)
        )
        if h + 2 * pad < k or w + 2 * pad < k:
            raise ValueError(f"{self.name}: the {k}x{k} window does not fit the padded input")
        if pad >= k:
            raise ValueError(f"{self.name}: pad {pad} must be smaller than the window {k}")
        return (*shape, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        return [self.geometry(shape)[:4]]

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        raise TypeError(f"{self.name}: the reference needs the workload; call reference_for")

    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        _, _, _, _, k, stride, pad, _, _ = self.geometry(shape)
        return pool_reference(inputs[0], k, stride, pad, self.mode)

    def flop(self, shape: tuple[int, ...]) -> float:
        n, c, _, _, k, _, _, oh, ow = self.geometry(shape)
        return float(n * c * oh * ow * k * k)


class GlobalAvgPool(OpTemplate):
    """What a global average pooling template shares: the workload (N, C, H, W), the numpy
    reference (the mean over H and W, per channel) and FLOPs."""

    fields = GLOBAL_FIELDS

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        return [check_workload(self.name, shape, GLOBAL_FIELDS)]

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        return inputs[0].astype(np.float64).mean(axis=(2, 3)).astype(np.float32)

    def flop(self, shape: tuple[int, ...]) -> float:
        n, c, h, w = check_workload(self.name, shape, GLOBAL_FIELDS)
        return float(n * c * h * w)


class Pool2dTemplate(WindowPool):
    """Max or average pooling over pre-padded NCHW[x]c data."""

    layout_knobs = ("c_block",)

    def __init__(self, mode: str) -> None:
        super().__init__(mode, f"{mode}_pool2d_nchwc")

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        geometry = self.geometry(shape)
        return ConfigSpace(
            [
                Knob("c_block", channel_blocks(geometry[1])),
                Knob("ow_tile", tile_choices(geometry[-1], 16)),
            ]
        )

    def parallel_choices(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The `parallel` choices: "outer" fuses batch and channel blocks into the parallel
        loop, "fused" the rows too."""
        return PARALLEL

    def _block(self, shape: tuple[int, ...], config: Config | None) -> int:
        return int(config["c_block"]) if config is not None else channel_blocks(shape[1])[0]

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, c, h, w, k, stride, pad, oh, ow = self.geometry(shape)
        cb = self._block(shape, config)
        x = te.placeholder((n, c // cb, h + 2 * pad, w + 2 * pad, cb), name="data")
        ry = te.reduce_axis((0, k), name="ry")
        rx = te.reduce_axis((0, k), name="rx")

        def body(b: E.Var, co: E.Var, y: E.Var, xx: E.Var, ci: E.Var) -> E.Expr:
            value = x[b, co, y * stride + ry.var, xx * stride + rx.var, ci]
            if self.mode == "max":
                return te.max(value, axis=(ry, rx))
            return te.sum(value * (1.0 / (k * k)), axis=(ry, rx))

        out = te.compute((n, c // cb, oh, ow, cb), body, name="out")
        return [x, out]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """Loops n, co, oh, owo | ky, kx | owi (unrolled), ci (vector).

        Average pooling reduces into a local tile (cache_write + compute_at), so its sums stay in
        registers. Max pooling reduces into the output directly: the core's cache_write keeps
        only sum reductions (its cache of a max starts at 0 and adds), see the D2 report.
        """
        out = args[-1]
        sch = create_schedule(out)
        acc = sch.cache_write(out, "local") if self.mode == "avg" else out
        st = sch[out]
        b, co, y, xx, ci = st.axis
        xo, xi = st.split(xx, int(config["ow_tile"]))
        if acc is out:
            ry, rx = st.reduce_axis
            st.reorder(b, co, y, xo, ry, rx, xi, ci)
            st.unroll(rx)
        else:
            st.reorder(b, co, y, xo, xi, ci)
        st.unroll(xi)
        st.vectorize(ci)
        parallel = parallel_of(config)
        if parallel != NO_PARALLEL:
            parallelize(st, [b, co, y], PARALLEL_LOOPS[parallel])
        if acc is not out:
            sch[acc].compute_at(st, xo)
            at = sch[acc]
            ry, rx = at.reduce_axis
            ab, aco, ay, ax, aci = at.axis
            at.reorder(ry, rx, ab, aco, ay, ax, aci)
            at.unroll(rx)
            at.unroll(ax)
            at.vectorize(aci)
        return sch

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        pad = self.geometry(shape)[6]
        fill = -np.inf if self.mode == "max" else 0.0
        padded = pad_spatial(np.asarray(inputs[0], np.float32), pad, fill)
        return [pack_nchwc(padded, self._block(shape, config))]

    def unpack_output(
        self, shape: tuple[int, ...], config: Config | None, output: np.ndarray
    ) -> np.ndarray:
        return unpack_nchwc(output)


class GlobalAvgPoolTemplate(GlobalAvgPool):
    """The mean over H and W of NCHW[x]c data, per channel."""

    name = "global_avg_pool2d_nchwc"
    layout_knobs = ("c_block",)

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        c = check_workload(self.name, shape, GLOBAL_FIELDS)[1]
        return ConfigSpace([Knob("c_block", channel_blocks(c)), Knob("unroll_w", (False, True))])

    def parallel_choices(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The `parallel` choices: "outer" fuses batch and channel blocks into the parallel
        loop."""
        return (NO_PARALLEL, "outer")

    def _block(self, shape: tuple[int, ...], config: Config | None) -> int:
        return int(config["c_block"]) if config is not None else channel_blocks(shape[1])[0]

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, c, h, w = check_workload(self.name, shape, GLOBAL_FIELDS)
        cb = self._block(shape, config)
        x = te.placeholder((n, c // cb, h, w, cb), name="data")
        ry = te.reduce_axis((0, h), name="ry")
        rx = te.reduce_axis((0, w), name="rx")
        scale = 1.0 / (h * w)
        out = te.compute(
            (n, c // cb, cb),
            lambda b, co, ci: te.sum(x[b, co, ry, rx, ci] * scale, axis=(ry, rx)),
            name="out",
        )
        return [x, out]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        out = args[-1]
        sch = create_schedule(out)
        st = sch[out]
        b, co, ci = st.axis
        ry, rx = st.reduce_axis
        st.reorder(b, co, ry, rx, ci)
        if config["unroll_w"]:
            st.unroll(rx)
        st.vectorize(ci)
        if parallel_of(config) != NO_PARALLEL:
            parallelize(st, [b, co], 2)
        return sch

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        return [pack_nchwc(np.asarray(inputs[0], np.float32), self._block(shape, config))]

    def unpack_output(
        self, shape: tuple[int, ...], config: Config | None, output: np.ndarray
    ) -> np.ndarray:
        n, co, ci = output.shape
        return output.reshape(n, co * ci)

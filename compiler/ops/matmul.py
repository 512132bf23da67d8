"""The matmul template: C[m, n] = sum_k A[m, k] * B[k, n] in float32, workload (M, N, K)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from compiler import te
from compiler.ops.reference import naive_schedule
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import tile_choices
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.tensor import Tensor

# Tile caps: m and k tiles stay small enough to keep A's and B's tiles in L1/L2; n is the vector axis.
_MAX_TILE_M, _MAX_TILE_N, _MAX_TILE_K = 64, 128, 256


class MatmulTemplate:
    name = "matmul"
    layout_knobs: tuple[str, ...] = ()  # B is [K][N] whatever the config

    def compute(self, shape: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
        m, n, k = _workload(shape)
        a = te.placeholder((m, k), "float32", name="A")
        b = te.placeholder((k, n), "float32", name="B")
        r = te.reduce_axis((0, k), name="k")
        c = te.compute((m, n), lambda m, n: te.sum(a[m, r] * b[r, n], axis=r), name="C")
        return a, b, c

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        a, b = inputs
        return np.matmul(a, b, dtype=np.float32)

    def flop(self, shape: tuple[int, ...]) -> float:
        m, n, k = _workload(shape)
        return 2.0 * m * n * k

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        m, n, k = _workload(shape)
        return ConfigSpace(
            [
                Knob("tile_m", tile_choices(m, _MAX_TILE_M)),
                Knob("tile_n", tile_choices(n, _MAX_TILE_N)),
                Knob("tile_k", tile_choices(k, _MAX_TILE_K)),
                Knob("vectorize", (False, True)),
                Knob("unroll", (False, True)),
            ]
        )

    def reference_kernel(
        self, shape: tuple[int, ...], config: Mapping[str, Any]
    ) -> tuple[Schedule, list[Tensor]]:
        """`compute(shape)` under the naive schedule (one layout for every config)."""
        args = list(self.compute(shape))
        return naive_schedule(args), args

    def instantiate(self, shape: tuple[int, ...], config: Config) -> tuple[Schedule, list[Any]]:
        """Tiles (mo, no, ko, mi, ki, ni): a C tile stays in registers/L1 across the k tile."""
        a, b, c = self.compute(shape)
        sch = create_schedule(c)
        stage = sch[c]
        m, n = stage.axis
        (k,) = stage.reduce_axis
        mo, mi = stage.split(m, config["tile_m"])
        no, ni = stage.split(n, config["tile_n"])
        ko, ki = stage.split(k, config["tile_k"])
        stage.reorder(mo, no, ko, mi, ki, ni)
        if config["vectorize"]:
            stage.vectorize(ni)
        if config["unroll"]:
            stage.unroll(ki)
        return sch, [a, b, c]


def _workload(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 3 or any(not isinstance(d, int) or d < 1 for d in shape):
        raise ValueError(f"matmul workload is (M, N, K) of positive ints, got {shape!r}")
    m, n, k = shape
    return m, n, k

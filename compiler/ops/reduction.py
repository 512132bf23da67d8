"""Sum reductions of a [rows][cols] float32 matrix over one axis.

Workload (rows, cols, axis): axis 1 sums each row (out[rows]), axis 0 each column (out[cols]).
Summing columns keeps the columns as vector lanes inside the row loop (one vector accumulator per
chunk); summing rows unrolls the inner part of a split reduction so the sum is a short dependency
chain per row rather than one long one.

On more than one thread the `parallel` knob (see `base.threaded_space`) runs the loop over output
tiles (row tiles of a row sum, column tiles of a column sum) on OpenMP's threads ("outer"): each
thread sums whole rows or whole columns, so no two add into one output. The output has one axis,
so there is no second data loop to fuse with it.
"""

from __future__ import annotations

import numpy as np

from compiler import te
from compiler.ops.base import NO_PARALLEL, OpTemplate, parallel_of
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import check_workload, tile_choices
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.tensor import Tensor

FIELDS = ("rows", "cols", "axis")


class ReduceSumTemplate(OpTemplate):
    """out = x.sum(axis) for a 2-D x."""

    name = "reduce_sum"
    fields = FIELDS

    def _check(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        rows, cols, axis = check_workload(self.name, shape, FIELDS, may_be_zero=("axis",))
        if axis not in (0, 1):
            raise ValueError(f"{self.name}: axis must be 0 or 1, got {axis}")
        return rows, cols, axis

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        rows, cols, axis = self._check(shape)
        if axis == 0:
            return ConfigSpace(
                [Knob("col_tile", tile_choices(cols, 64)), Knob("unroll_r", (1, 2, 4))]
            )
        return ConfigSpace(
            [Knob("row_tile", tile_choices(rows, 16)), Knob("unroll_r", (1, 2, 4, 8))]
        )

    def parallel_choices(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The `parallel` choices: "outer" runs the output tiles' loop on the threads."""
        self._check(shape)
        return (NO_PARALLEL, "outer")

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        rows, cols, _ = self._check(shape)
        return [(rows, cols)]

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        raise TypeError(f"{self.name}: the reference needs the workload; call reference_for")

    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        axis = self._check(shape)[2]
        return inputs[0].astype(np.float64).sum(axis=axis).astype(np.float32)

    def flop(self, shape: tuple[int, ...]) -> float:
        rows, cols, _ = self._check(shape)
        return float(rows * cols)

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        rows, cols, axis = self._check(shape)
        x = te.placeholder((rows, cols), name="x")
        if axis == 0:
            r = te.reduce_axis((0, rows), name="r")
            out = te.compute((cols,), lambda j: te.sum(x[r, j], axis=r), name="out")
        else:
            c = te.reduce_axis((0, cols), name="c")
            out = te.compute((rows,), lambda i: te.sum(x[i, c], axis=c), name="out")
        return [x, out]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        _, _, axis = self._check(shape)
        out = args[-1]
        sch = create_schedule(out)
        st = sch[out]
        (j,) = st.axis
        (r,) = st.reduce_axis
        unroll = int(config["unroll_r"])
        if axis == 0:
            jo, ji = st.split(j, int(config["col_tile"]))
            ro, ri = st.split(r, unroll)
            st.reorder(jo, ro, ri, ji)
            st.unroll(ri)
            st.vectorize(ji)
        else:
            jo, ji = st.split(j, int(config["row_tile"]))
            ro, ri = st.split(r, unroll)
            st.reorder(jo, ro, ri, ji)
            st.unroll(ri)
            st.unroll(ji)
        if parallel_of(config) != NO_PARALLEL:
            st.parallel(jo)
        return sch

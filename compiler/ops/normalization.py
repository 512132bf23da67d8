"""Softmax and layer norm over the last axis of a [rows][cols] float32 matrix.

Both are chains of small stages per row: softmax takes the row's max, exp(x - max), their sum and
the quotient; layer norm the mean, the variance (two passes, as numerically stable as numpy's),
1/sqrt(var + eps), then (x - mean) * rstd * gamma + beta. The schedule computes every per-row
stage at (compute_at) the output's row loop, so a row's intermediates live in a small local
buffer while the row is hot in L1, and splits the output's columns into vector chunks.

On more than one thread the `parallel` knob (see `base.threaded_space`) runs the output's row
loop on OpenMP's threads ("outer"). Every per-row stage is computed at that loop, so each thread
keeps its rows' intermediates in buffers of its own and no row is split between threads; the
columns are not fused into it, since the row statistics are computed once per row iteration.
"""

from __future__ import annotations

import numpy as np

from compiler import te
from compiler.ir import expr as E
from compiler.ops.base import NO_PARALLEL, OpTemplate, parallel_of
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import check_workload
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.tensor import ComputeOp, Tensor

FIELDS = ("rows", "cols")
LAYER_NORM_EPS = 1e-5


def _vectors(cols: int) -> tuple[int, ...]:
    return tuple(v for v in (8, 16, 32, 64) if v <= cols) or (cols,)


def _producers(out: Tensor) -> list[Tensor]:
    """Every compute tensor `out` depends on, producers first (out excluded)."""
    order: list[Tensor] = []

    def visit(t: Tensor) -> None:
        if t in order or not isinstance(t.op, ComputeOp):
            return
        for producer in t.op.inputs:
            visit(producer)
        order.append(t)

    visit(out)
    return order[:-1]


def _row_schedule(out: Tensor, config: Config, inline: tuple[Tensor, ...] = ()) -> Schedule:
    """Per-row stages at the output's row loop; the output's columns split into vectors; the
    rows on OpenMP's threads when the `parallel` knob says so."""
    sch = create_schedule(out)
    st = sch[out]
    r, c = st.axis
    _, ci = st.split(c, int(config["vector"]))
    st.vectorize(ci)
    if parallel_of(config) != NO_PARALLEL:
        st.parallel(r)
    for t in _producers(out):
        if t in inline:
            sch[t].compute_inline()
        else:
            sch[t].compute_at(st, r)
    return sch


class _RowTemplate(OpTemplate):
    """What softmax and layer norm share: the workload and the `parallel` knob."""

    fields = FIELDS

    def parallel_choices(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The `parallel` choices: "outer" runs the rows on the threads."""
        check_workload(self.name, shape, FIELDS)
        return (NO_PARALLEL, "outer")


class SoftmaxTemplate(_RowTemplate):
    """out[r, c] = exp(x[r, c] - max_c x[r]) / sum_c exp(x[r, c] - max_c x[r])."""

    name = "softmax"

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        _, cols = check_workload(self.name, shape, FIELDS)
        # Recompute exp in the output instead of keeping a row of it: less memory, twice the exps.
        return ConfigSpace([Knob("vector", _vectors(cols)), Knob("recompute_exp", (False, True))])

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        return [check_workload(self.name, shape, FIELDS)]

    def random_inputs(self, shape: tuple[int, ...], rng: np.random.Generator) -> list[np.ndarray]:
        # Spread wide enough that a softmax without its max subtraction would overflow.
        rows, cols = check_workload(self.name, shape, FIELDS)
        return [rng.uniform(-60.0, 100.0, size=(rows, cols)).astype(np.float32)]

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        x = inputs[0].astype(np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)

    def flop(self, shape: tuple[int, ...]) -> float:
        rows, cols = check_workload(self.name, shape, FIELDS)
        return 4.0 * rows * cols

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        rows, cols = check_workload(self.name, shape, FIELDS)
        x = te.placeholder((rows, cols), name="x")
        k1 = te.reduce_axis((0, cols), name="k1")
        mx = te.compute((rows,), lambda r: te.max(x[r, k1], axis=k1), name="row_max")
        e = te.compute((rows, cols), lambda r, c: te.exp(x[r, c] - mx[r]), name="exps")
        k2 = te.reduce_axis((0, cols), name="k2")
        s = te.compute((rows,), lambda r: te.sum(e[r, k2], axis=k2), name="row_sum")
        out = te.compute((rows, cols), lambda r, c: E.Div(e[r, c], s[r]), name="out")
        return [x, out]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        out = args[-1]
        exps = tuple(t for t in _producers(out) if t.name == "exps")
        return _row_schedule(out, config, inline=exps if config["recompute_exp"] else ())


class LayerNormTemplate(_RowTemplate):
    """out[r, c] = (x[r, c] - mean[r]) / sqrt(var[r] + 1e-5) * gamma[c] + beta[c]."""

    name = "layer_norm"

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        _, cols = check_workload(self.name, shape, FIELDS)
        return ConfigSpace([Knob("vector", _vectors(cols))])

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        rows, cols = check_workload(self.name, shape, FIELDS)
        return [(rows, cols), (cols,), (cols,)]

    def random_inputs(self, shape: tuple[int, ...], rng: np.random.Generator) -> list[np.ndarray]:
        x, gamma, beta = super().random_inputs(shape, rng)
        return [(x * 4.0 + 3.0).astype(np.float32), gamma, beta]  # off-centre rows

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        x, gamma, beta = (a.astype(np.float64) for a in inputs)
        mean = x.mean(axis=1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
        return ((x - mean) / np.sqrt(var + LAYER_NORM_EPS) * gamma + beta).astype(np.float32)

    def flop(self, shape: tuple[int, ...]) -> float:
        rows, cols = check_workload(self.name, shape, FIELDS)
        return 8.0 * rows * cols

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        rows, cols = check_workload(self.name, shape, FIELDS)
        x = te.placeholder((rows, cols), name="x")
        gamma = te.placeholder((cols,), name="gamma")
        beta = te.placeholder((cols,), name="beta")
        inv = 1.0 / cols
        k1 = te.reduce_axis((0, cols), name="k1")
        mean = te.compute((rows,), lambda r: te.sum(x[r, k1] * inv, axis=k1), name="mean")
        k2 = te.reduce_axis((0, cols), name="k2")

        def centred_square(r: E.Var) -> E.Expr:
            d = x[r, k2.var] - mean[r]
            return te.sum(d * d * inv, axis=k2)

        var = te.compute((rows,), centred_square, name="var")
        rstd = te.compute(
            (rows,),
            lambda r: E.Div(E.FloatImm(1.0), te.sqrt(var[r] + LAYER_NORM_EPS)),
            name="rstd",
        )
        out = te.compute(
            (rows, cols),
            lambda r, c: (x[r, c] - mean[r]) * rstd[r] * gamma[c] + beta[c],
            name="out",
        )
        return [x, gamma, beta, out]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        return _row_schedule(args[-1], config)

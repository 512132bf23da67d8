"""Injective (elementwise) ops over a [rows][cols] float32 view: add, multiply, relu, add+relu.

Workload (rows, cols): any tensor of rows * cols elements, e.g. a residual add over NCHW[x]c
activations viewed as [N*C/cb*H][W*cb]. The schedule splits the columns into vector chunks of
`vector` lanes and unrolls `unroll` chunks, so the loop body is straight-line SIMD code.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from compiler import te
from compiler.ir import expr as E
from compiler.ops.base import OpTemplate
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import check_workload
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.tensor import Tensor

FIELDS = ("rows", "cols")

_ZERO = 0.0


def _relu(a: E.Expr) -> E.Expr:
    return E.Max(a, E.FloatImm(_ZERO))


# name -> (arity, tensor-expression body, numpy reference)
_OPS: dict[str, tuple[int, Callable[..., E.Expr], Callable[..., np.ndarray]]] = {
    "add": (2, lambda a, b: a + b, lambda a, b: a + b),
    "multiply": (2, lambda a, b: a * b, lambda a, b: a * b),
    "relu": (1, _relu, lambda a: np.maximum(a, np.float32(0))),
    "add_relu": (2, lambda a, b: _relu(a + b), lambda a, b: np.maximum(a + b, np.float32(0))),
}
ELEMENTWISE_OPS = tuple(_OPS)


class ElementwiseTemplate(OpTemplate):
    """One elementwise op of ELEMENTWISE_OPS."""

    fields = FIELDS

    def __init__(self, op: str) -> None:
        if op not in _OPS:
            raise ValueError(f"no elementwise op {op!r}; known: {', '.join(_OPS)}")
        self.op = op
        self.name = op
        self.arity, self._body, self._numpy = _OPS[op]

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        _, cols = check_workload(self.name, shape, FIELDS)
        vectors = tuple(v for v in (4, 8, 16, 32, 64) if v <= cols) or (cols,)
        return ConfigSpace([Knob("vector", vectors), Knob("unroll", (1, 2, 4))])

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        return [check_workload(self.name, shape, FIELDS)] * self.arity

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        return np.asarray(self._numpy(*inputs), dtype=np.float32)

    def flop(self, shape: tuple[int, ...]) -> float:
        rows, cols = check_workload(self.name, shape, FIELDS)
        return float(rows * cols * (2 if self.op == "add_relu" else 1))

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        rows, cols = check_workload(self.name, shape, FIELDS)
        names = ("a", "b")[: self.arity]
        inputs = [te.placeholder((rows, cols), name=n) for n in names]
        out = te.compute(
            (rows, cols), lambda i, j: self._body(*(t[i, j] for t in inputs)), name="out"
        )
        return [*inputs, out]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        out = args[-1]
        sch = create_schedule(out)
        st = sch[out]
        _, j = st.axis
        vector, unroll = int(config["vector"]), int(config["unroll"])
        jo, ji = st.split(j, vector)
        if unroll > 1:
            _, joi = st.split(jo, unroll)
            st.unroll(joi)
        st.vectorize(ji)
        return sch

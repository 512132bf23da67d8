"""Tensor intrinsics for `tensorize`: a small compute that hardware (or a hand-written kernel) does
in one call, declared with its C implementation and a numpy emulation for the interpreter.

The seed example is `gemm_intrin(8, 8, 8)`: out[i, j] += sum_k a[i, k] * b[k, j] on 8x8 tiles,
with a reset part (zero the output tile) and an update part (accumulate one product).
Operands are passed as (pointer, stride per dimension in elements) in the order: output, inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler import te
from compiler.te.tensor import ComputeOp, Tensor


@dataclass(frozen=True, eq=False)
class TensorIntrin:
    """A declared intrinsic.

    `output` is a te.compute over placeholder `inputs` (its only reduction, if any, a sum);
    `update` and `reset` name C functions defined in `c_source` with the signature
    `void f(T *out, int32_t out_s0, ..., const T *in0, int32_t in0_s0, ...)` (`reset` takes only
    the output); `emulate_update` / `emulate_reset` do the same on numpy views.
    """

    name: str
    output: Tensor
    inputs: tuple[Tensor, ...]
    c_source: str
    update: str
    reset: str | None
    emulate_update: Callable[..., None]
    emulate_reset: Callable[..., None] | None

    @property
    def op(self) -> ComputeOp:
        assert isinstance(self.output.op, ComputeOp)
        return self.output.op


def _gemm_update(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    out += np.matmul(a, b, dtype=out.dtype)


def _gemm_reset(out: np.ndarray) -> None:
    out[...] = 0


def gemm_intrin(m: int = 8, n: int = 8, k: int = 8) -> TensorIntrin:
    """The float32 GEMM tile intrinsic out[m, n] (+)= a[m, k] @ b[k, n] with reset and update."""
    a = te.placeholder((m, k), name="a")
    b = te.placeholder((k, n), name="b")
    r = te.reduce_axis((0, k), name="rk")
    out = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="out")
    name = f"kiln_gemm{m}x{n}x{k}"
    source = f"""
static inline void {name}_reset(float *out, int32_t os0, int32_t os1) {{
  for (int32_t i = 0; i < {m}; ++i)
    for (int32_t j = 0; j < {n}; ++j) out[i * os0 + j * os1] = 0.0f;
}}
static inline void {name}_update(float *out, int32_t os0, int32_t os1,
                                 const float *a, int32_t as0, int32_t as1,
                                 const float *b, int32_t bs0, int32_t bs1) {{
  for (int32_t i = 0; i < {m}; ++i)
    for (int32_t kk = 0; kk < {k}; ++kk) {{
      float av = a[i * as0 + kk * as1];
      #pragma GCC ivdep
      for (int32_t j = 0; j < {n}; ++j) out[i * os0 + j * os1] += av * b[kk * bs0 + j * bs1];
    }}
}}
"""
    return TensorIntrin(
        name, out, (a, b), source, f"{name}_update", f"{name}_reset", _gemm_update, _gemm_reset
    )

"""The VTA-like accelerator's GEMM block as a tensor intrinsic, for `tensorize`.

`compiler.codegen.vta_lower` turns every call of it (and the loops around the call) into a GEMM
instruction over a micro-op loop nest; its C and numpy parts let the same loop IR run on the host
(the interpreter checks a schedule before any instruction exists).
"""

from __future__ import annotations

import numpy as np

from compiler import te
from compiler.schedule.intrin import TensorIntrin
from protos.vta import VtaSpec

GEMM_INTRIN = "vta_gemm"


def gemm_intrin(spec: VtaSpec) -> TensorIntrin:
    """The GEMM core's block as a tensor intrinsic: out[o] (+)= sum_i int32(a[i]) * int32(b[o, i]).

    `tensorize` it onto the output-channel and input-channel loops of a block; the loops around
    it become the GEMM instruction's loop nest. Its C and numpy parts let the loop IR run on the
    host too (the interpreter checks the schedule before any instruction exists).
    """
    bi, bo = spec.block_in, spec.block_out
    a = te.placeholder((bi,), "int8", name="a")
    b = te.placeholder((bo, bi), "int8", name="b")
    k = te.reduce_axis((0, bi), name="k")
    out = te.compute(
        (bo,),
        lambda o: te.sum(te.cast("int32", a[k]) * te.cast("int32", b[o, k]), axis=k),
        name="out",
    )
    name = f"{GEMM_INTRIN}_{bo}x{bi}"
    source = f"""
static inline void {name}_reset(int32_t *out, int32_t os0) {{
  for (int32_t o = 0; o < {bo}; ++o) out[o * os0] = 0;
}}
static inline void {name}_update(int32_t *out, int32_t os0, const int8_t *a, int32_t as0,
                                 const int8_t *b, int32_t bs0, int32_t bs1) {{
  for (int32_t o = 0; o < {bo}; ++o) {{
    uint32_t sum = (uint32_t)out[o * os0];
    for (int32_t i = 0; i < {bi}; ++i) sum += (uint32_t)((int32_t)a[i * as0] * b[o * bs0 + i * bs1]);
    out[o * os0] = (int32_t)sum;
  }}
}}
"""
    return TensorIntrin(
        name, out, (a, b), source, f"{name}_update", f"{name}_reset", _gemm_update, _gemm_reset
    )


def _gemm_update(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    total = out.astype(np.int64) + b.astype(np.int64) @ a.astype(np.int64)
    out[...] = total.astype(np.int32)  # wraps like the int32 accumulators


def _gemm_reset(out: np.ndarray) -> None:
    out[...] = 0

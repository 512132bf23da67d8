"""The CUDA GEMM templates: `cuda_dense` (Y = X . W^T) and `cuda_batch_matmul` (C[b] = A[b] .
B[b]), float32, each a `GemmProblem` for the register-tiled shared-memory GEMM of
`compiler/ops/cuda/gemm.py` (which describes the workloads, the schedule and its knobs)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler import te
from compiler.ops.cuda.gemm import (
    Epilogue,
    GemmOperand,
    GemmProblem,
    GemmTemplateBase,
    epilogue_reference,
    parse_epilogue,
)
from compiler.ops.util import check_workload
from compiler.te.tensor import Tensor

_DENSE_FIELDS = ("M", "N", "K", "epilogue")
_BMM_FIELDS = ("B", "M", "N", "K", "epilogue")


def with_default_epilogue(name: str, shape: tuple[int, ...], fields: Sequence[str]) -> tuple:
    """`shape` checked against `fields`, the trailing epilogue optional (0)."""
    if isinstance(shape, tuple) and len(shape) == len(fields) - 1:
        shape = (*shape, 0)
    out = check_workload(name, shape, fields, may_be_zero=("epilogue",))
    parse_epilogue(name, out[-1])
    return out


class CudaDenseTemplate(GemmTemplateBase):
    """Y = X . W^T (+ epilogue) on a GPU: the register-tiled shared-memory GEMM."""

    name = "cuda_dense"
    fields = _DENSE_FIELDS

    def gemm_inputs(self, shape: tuple[int, ...]) -> list[Tensor]:
        m, n, k, _ = with_default_epilogue(self.name, shape, _DENSE_FIELDS)
        return [te.placeholder((m, k), name="X"), te.placeholder((n, k), name="W")]

    def epilogue_of(self, shape: tuple[int, ...]) -> Epilogue:
        return Epilogue(with_default_epilogue(self.name, shape, _DENSE_FIELDS)[-1])

    def problem(self, shape: tuple[int, ...], args: Sequence[Tensor]) -> GemmProblem:
        m, n, k, epi = with_default_epilogue(self.name, shape, _DENSE_FIELDS)
        x, w = args[0], args[1]
        return GemmProblem(
            None,
            m,
            n,
            k,
            GemmOperand(lambda _b, i, kk: x[i, kk], k_contiguous=True, aligned=k % 4 == 0),
            GemmOperand(lambda _b, j, kk: w[j, kk], k_contiguous=True, aligned=k % 4 == 0),
            Epilogue(epi),
        )

    def vector_ok(self, shape: tuple[int, ...]) -> bool:
        return shape[2] % 4 == 0

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        m, n, k, epi = with_default_epilogue(self.name, shape, _DENSE_FIELDS)
        shapes: list[tuple[int, ...]] = [(m, k), (n, k)]
        if epi:
            shapes.append((n,))
        if epi == Epilogue.BIAS_ADD_RELU:
            shapes.append((m, n))
        return shapes

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        m, n, _, _ = with_default_epilogue(self.name, shape, _DENSE_FIELDS)
        return (m, n)

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        x, w = inputs[0], inputs[1]
        out = x.astype(np.float64) @ w.astype(np.float64).T
        return _reference_tail(out, inputs[2:], None)

    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        x, w = inputs[0], inputs[1]
        out = x.astype(np.float64) @ w.astype(np.float64).T
        return _reference_tail(out, inputs[2:], self.epilogue_of(shape))


class CudaBatchMatmulTemplate(GemmTemplateBase):
    """C[b] = A[b] . B[b] (+ epilogue) on a GPU: the dense schedule with batches on blockIdx.z."""

    name = "cuda_batch_matmul"
    fields = _BMM_FIELDS

    def gemm_inputs(self, shape: tuple[int, ...]) -> list[Tensor]:
        b, m, n, k, _ = with_default_epilogue(self.name, shape, _BMM_FIELDS)
        return [te.placeholder((b, m, k), name="A"), te.placeholder((b, k, n), name="B")]

    def epilogue_of(self, shape: tuple[int, ...]) -> Epilogue:
        return Epilogue(with_default_epilogue(self.name, shape, _BMM_FIELDS)[-1])

    def problem(self, shape: tuple[int, ...], args: Sequence[Tensor]) -> GemmProblem:
        batch, m, n, k, epi = with_default_epilogue(self.name, shape, _BMM_FIELDS)
        a, b = args[0], args[1]
        return GemmProblem(
            batch,
            m,
            n,
            k,
            GemmOperand(lambda bb, i, kk: a[bb, i, kk], k_contiguous=True, aligned=k % 4 == 0),
            GemmOperand(lambda bb, j, kk: b[bb, kk, j], k_contiguous=False, aligned=n % 4 == 0),
            Epilogue(epi),
        )

    def vector_ok(self, shape: tuple[int, ...]) -> bool:
        return shape[2] % 4 == 0 and shape[3] % 4 == 0

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        b, m, n, k, epi = with_default_epilogue(self.name, shape, _BMM_FIELDS)
        shapes: list[tuple[int, ...]] = [(b, m, k), (b, k, n)]
        if epi:
            shapes.append((n,))
        if epi == Epilogue.BIAS_ADD_RELU:
            shapes.append((b, m, n))
        return shapes

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        b, m, n, _, _ = with_default_epilogue(self.name, shape, _BMM_FIELDS)
        return (b, m, n)

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        a, b = inputs[0], inputs[1]
        out = np.matmul(a.astype(np.float64), b.astype(np.float64))
        return _reference_tail(out, inputs[2:], None)

    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        a, b = inputs[0], inputs[1]
        out = np.matmul(a.astype(np.float64), b.astype(np.float64))
        return _reference_tail(out, inputs[2:], self.epilogue_of(shape))


def _epilogue_of_extras(extras: Sequence[np.ndarray]) -> Epilogue:
    """Without the workload, extras say bias (1) or bias + residual (3); 2 needs the workload."""
    return (Epilogue.NONE, Epilogue.BIAS, Epilogue.BIAS_ADD_RELU)[len(extras)]


def _reference_tail(
    out: np.ndarray, extras: Sequence[np.ndarray], epilogue: Epilogue | None
) -> np.ndarray:
    epi = _epilogue_of_extras(extras) if epilogue is None else epilogue
    bias = np.asarray(extras[0], np.float64) if extras else None
    residual = np.asarray(extras[1], np.float64) if len(extras) > 1 else None
    return epilogue_reference(out, bias, residual, epi)

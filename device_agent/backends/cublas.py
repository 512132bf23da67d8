"""cuBLAS through ctypes, for the GPU benchmarks' peer: single- and half-precision GEMMs on
row-major arrays in a `cuda_driver.Gpu`'s context (cuBLAS shares the device's primary context,
so device pointers pass between the two)."""

from __future__ import annotations

import ctypes
import glob
import os
import sys

from device_agent.backends.cuda_driver import CudaError, DeviceBuffer, Gpu, load_library

# cuBLAS's enums (cublas_api.h, library_types.h) for the calls below.
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUDA_R_32F, CUDA_R_16F = 0, 2
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1


def _preload_cublas_lt(cublas: str) -> None:
    """cuBLAS needs cuBLASLt, which wheels ship beside it without an rpath to it: load the
    one in the same folder first (nothing for a bare library name)."""
    folder = os.path.dirname(cublas)
    lts = sorted(glob.glob(os.path.join(folder, "libcublasLt.so*"))) if folder else []
    if lts:
        ctypes.CDLL(lts[0], mode=ctypes.RTLD_GLOBAL)


class Cublas:
    """cuBLAS's single-precision GEMM on row-major arrays, in `gpu`'s context."""

    def __init__(self, gpu: Gpu) -> None:
        self.lib = load_library(_cublas_candidates(), "cuBLAS (libcublas)", _preload_cublas_lt)
        self.handle = ctypes.c_void_p()
        status = self.lib.cublasCreate_v2(ctypes.byref(self.handle))
        if status:
            raise CudaError("cublasCreate", status, "cuBLAS status")
        self.gpu = gpu

    def sgemm(
        self, m: int, n: int, k: int, a: DeviceBuffer, b: DeviceBuffer, c: DeviceBuffer
    ) -> None:
        """C[m, n] = A[m, k] @ B[k, n], row-major: column-major C^T = B^T A^T."""
        self._sgemm(CUBLAS_OP_N, n, m, n, k, a, b, c)

    def sgemm_nt(
        self, m: int, n: int, k: int, a: DeviceBuffer, b: DeviceBuffer, c: DeviceBuffer
    ) -> None:
        """C[m, n] = A[m, k] @ B[n, k]^T, row-major (a dense layer's layout): column-major
        C^T = op_T(B^T) A^T, both operands read with leading dimension k."""
        self._sgemm(CUBLAS_OP_T, k, m, n, k, a, b, c)

    def _sgemm(
        self,
        op_b: int,
        ld_b: int,
        m: int,
        n: int,
        k: int,
        a: DeviceBuffer,
        b: DeviceBuffer,
        c: DeviceBuffer,
    ) -> None:
        """cublasSgemm of row-major A [m][k] and B (op_b, leading dimension ld_b) into C."""
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        status = self.lib.cublasSgemm_v2(
            self.handle, op_b, CUBLAS_OP_N, n, m, k, ctypes.byref(one),
            ctypes.c_uint64(b.ptr), ld_b, ctypes.c_uint64(a.ptr), k,
            ctypes.byref(zero), ctypes.c_uint64(c.ptr), n,
        )  # fmt: skip
        if status:
            raise CudaError("cublasSgemm", status, "cuBLAS status")

    def hgemm_nt(
        self, m: int, n: int, k: int, a: DeviceBuffer, b: DeviceBuffer, c: DeviceBuffer
    ) -> None:
        """C[m, n] = A[m, k] @ B[n, k]^T with float16 A and B and a float32 C, summed in
        float32 (cublasGemmEx, CUBLAS_COMPUTE_32F: cuBLAS runs it on tensor cores)."""
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        status = self.lib.cublasGemmEx(
            self.handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, ctypes.byref(one),
            ctypes.c_uint64(b.ptr), CUDA_R_16F, k, ctypes.c_uint64(a.ptr), CUDA_R_16F, k,
            ctypes.byref(zero), ctypes.c_uint64(c.ptr), CUDA_R_32F, n,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip
        if status:
            raise CudaError("cublasGemmEx", status, "cuBLAS status")

    def close(self) -> None:
        self.lib.cublasDestroy_v2(self.handle)


def _cublas_candidates() -> list[str]:
    names = [
        os.environ.get("KILN_CUBLAS", ""),
        "libcublas.so",
        "libcublas.so.13",
        "libcublas.so.12",
    ]
    roots = [
        "/usr/local/cuda*/lib64",
        "/usr/local/cuda*/targets/*/lib",
        "/usr/lib/x86_64-linux-gnu",
    ]
    roots += [f"{p}/nvidia/cu*/lib" for p in sys.path] + [
        f"{p}/nvidia/cublas/lib" for p in sys.path
    ]
    # a Python whose wheels carry cuBLAS, when this one's do not (the lent GPU machines' image
    # has it under /opt/torch/.venv)
    roots += ["/opt/*/.venv/lib/python3*/site-packages/nvidia/cu*/lib"]
    roots += ["/opt/*/.venv/lib/python3*/site-packages/nvidia/cublas/lib"]
    for root in roots:
        names += sorted(glob.glob(f"{root}/libcublas.so*"))
    return [n for n in names if n]

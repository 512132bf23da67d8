"""A small ctypes binding of the CUDA driver API: load a module, launch a kernel, time it.

This is what the `cuda` backend (ARCHITECTURE.md: cubin from nvcc, loaded through the driver API,
timed with CUDA events) is to be built on; today the GPU tests and `benchmarks/cuda_gemm.py` use
it. It needs `libcuda.so.1` (the driver) and a GPU; `Gpu.open()` raises CudaError naming the
driver call that failed when there is none, so callers can skip cleanly.

cuBLAS, the peer of the benchmark, is reached the same way (`Cublas`); it shares the device's
primary context, so device pointers pass between the two.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CUDA_SUCCESS = 0


class CudaError(RuntimeError):
    """A driver or cuBLAS call failed; the message names the call and the error."""


def _load(
    names: Sequence[str], what: str, before: Callable[[str], None] | None = None
) -> ctypes.CDLL:
    """The first of `names` that loads (after `before(name)`, if given)."""
    errors = []
    for name in names:
        try:
            if before is not None:
                before(name)
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise CudaError(f"cannot load {what}: " + "; ".join(errors or ["no candidate"]))


def _preload_cublas_lt(cublas: str) -> None:
    """cuBLAS needs cuBLASLt, which wheels ship beside it without an rpath to it: load the
    one in the same folder first (nothing for a bare library name)."""
    folder = os.path.dirname(cublas)
    lts = sorted(glob.glob(os.path.join(folder, "libcublasLt.so*"))) if folder else []
    if lts:
        ctypes.CDLL(lts[0], mode=ctypes.RTLD_GLOBAL)


@dataclass
class DeviceBuffer:
    """`nbytes` of device memory at `ptr` (a CUdeviceptr)."""

    ptr: int
    nbytes: int


class Gpu:
    """Device 0 in its primary context. Use `Gpu.open()`; `close()` releases what it made."""

    def __init__(self, lib: ctypes.CDLL, device: int, ctx: ctypes.c_void_p) -> None:
        self.lib = lib
        self.device = device
        self.ctx = ctx
        self._buffers: list[DeviceBuffer] = []
        self._modules: list[ctypes.c_void_p] = []

    @classmethod
    def open(cls) -> Gpu:
        lib = _load(["libcuda.so.1", "libcuda.so"], "the CUDA driver (libcuda)")
        _check(lib, lib.cuInit(0), "cuInit")
        count = ctypes.c_int()
        _check(lib, lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        if count.value < 1:
            raise CudaError("cuDeviceGetCount: no CUDA device")
        dev = ctypes.c_int()
        _check(lib, lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        _check(
            lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain"
        )
        _check(lib, lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return cls(lib, dev.value, ctx)

    def name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        _check(self.lib, self.lib.cuDeviceGetName(buf, 256, self.device), "cuDeviceGetName")
        return buf.value.decode()

    def compute_capability(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        for out, attr in ((major, 75), (minor, 76)):  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
            _check(
                self.lib,
                self.lib.cuDeviceGetAttribute(ctypes.byref(out), attr, self.device),
                "cuDeviceGetAttribute",
            )
        return major.value, minor.value

    # -- memory ------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> DeviceBuffer:
        ptr = ctypes.c_uint64()
        _check(
            self.lib,
            self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)),
            "cuMemAlloc",
        )
        buf = DeviceBuffer(ptr.value, nbytes)
        self._buffers.append(buf)
        return buf

    def free(self, buf: DeviceBuffer) -> None:
        if buf in self._buffers:
            self._buffers.remove(buf)
            _check(self.lib, self.lib.cuMemFree_v2(ctypes.c_uint64(buf.ptr)), "cuMemFree")

    def upload(self, array: np.ndarray) -> DeviceBuffer:
        host = np.ascontiguousarray(array)
        buf = self.alloc(host.nbytes)
        _check(
            self.lib,
            self.lib.cuMemcpyHtoD_v2(
                ctypes.c_uint64(buf.ptr),
                host.ctypes.data_as(ctypes.c_void_p),
                ctypes.c_size_t(host.nbytes),
            ),
            "cuMemcpyHtoD",
        )
        return buf

    def download(
        self, buf: DeviceBuffer, shape: tuple[int, ...], dtype: type = np.float32
    ) -> np.ndarray:
        out: np.ndarray = np.empty(shape, dtype)
        if out.nbytes > buf.nbytes:
            raise CudaError(f"download: {out.nbytes} bytes asked of a {buf.nbytes}-byte buffer")
        _check(
            self.lib,
            self.lib.cuMemcpyDtoH_v2(
                out.ctypes.data_as(ctypes.c_void_p),
                ctypes.c_uint64(buf.ptr),
                ctypes.c_size_t(out.nbytes),
            ),
            "cuMemcpyDtoH",
        )
        return out

    # -- kernels -----------------------------------------------------------------------------

    def load_function(self, image: bytes, symbol: str) -> ctypes.c_void_p:
        """The kernel `symbol` of a cubin or (NUL-terminated) PTX image."""
        if not image.endswith(b"\0") and image.lstrip().startswith(b"//"):
            image += b"\0"  # PTX text
        mod = ctypes.c_void_p()
        _check(
            self.lib,
            self.lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image)),
            "cuModuleLoadData",
        )
        self._modules.append(mod)
        fn = ctypes.c_void_p()
        _check(
            self.lib,
            self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, symbol.encode()),
            f"cuModuleGetFunction({symbol})",
        )
        return fn

    def launch(
        self,
        fn: ctypes.c_void_p,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[DeviceBuffer],
    ) -> None:
        ptrs = [ctypes.c_uint64(a.ptr) for a in args]
        argv = (ctypes.c_void_p * len(ptrs))(
            *[ctypes.cast(ctypes.byref(p), ctypes.c_void_p) for p in ptrs]
        )
        _check(
            self.lib,
            self.lib.cuLaunchKernel(fn, *grid, *block, 0, None, argv, None),
            "cuLaunchKernel",
        )

    def synchronize(self) -> None:
        _check(self.lib, self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def time_ms(self, run: Callable[[], None], repeat: int, warmup: int = 2) -> float:
        """Mean milliseconds of `run()` (which enqueues GPU work) over `repeat` calls, timed
        between two CUDA events on the default stream."""
        for _ in range(warmup):
            run()
        start, stop = ctypes.c_void_p(), ctypes.c_void_p()
        _check(self.lib, self.lib.cuEventCreate(ctypes.byref(start), 0), "cuEventCreate")
        _check(self.lib, self.lib.cuEventCreate(ctypes.byref(stop), 0), "cuEventCreate")
        try:
            _check(self.lib, self.lib.cuEventRecord(start, None), "cuEventRecord")
            for _ in range(repeat):
                run()
            _check(self.lib, self.lib.cuEventRecord(stop, None), "cuEventRecord")
            _check(self.lib, self.lib.cuEventSynchronize(stop), "cuEventSynchronize")
            ms = ctypes.c_float()
            _check(
                self.lib,
                self.lib.cuEventElapsedTime(ctypes.byref(ms), start, stop),
                "cuEventElapsedTime",
            )
            return ms.value / repeat
        finally:
            self.lib.cuEventDestroy_v2(start)
            self.lib.cuEventDestroy_v2(stop)

    def close(self) -> None:
        for buf in self._buffers:
            self.lib.cuMemFree_v2(ctypes.c_uint64(buf.ptr))
        for mod in self._modules:
            self.lib.cuModuleUnload(mod)
        self._buffers.clear()
        self._modules.clear()
        self.lib.cuDevicePrimaryCtxRelease_v2(self.device)


def _check(lib: ctypes.CDLL, status: int, call: str) -> None:
    if status == CUDA_SUCCESS:
        return
    name = ctypes.c_char_p()
    lib.cuGetErrorName(status, ctypes.byref(name))
    label = name.value.decode() if name.value else "unknown error"
    raise CudaError(f"{call} failed: {label} ({status})")


class Cublas:
    """cuBLAS's single-precision GEMM on row-major arrays, in `gpu`'s context."""

    def __init__(self, gpu: Gpu) -> None:
        self.lib = _load(_cublas_candidates(), "cuBLAS (libcublas)", _preload_cublas_lt)
        self.handle = ctypes.c_void_p()
        status = self.lib.cublasCreate_v2(ctypes.byref(self.handle))
        if status:
            raise CudaError(f"cublasCreate failed: status {status}")
        self.gpu = gpu

    def sgemm(
        self, m: int, n: int, k: int, a: DeviceBuffer, b: DeviceBuffer, c: DeviceBuffer
    ) -> None:
        """C[m, n] = A[m, k] @ B[k, n], row-major: column-major C^T = B^T A^T."""
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        status = self.lib.cublasSgemm_v2(
            self.handle, 0, 0, n, m, k, ctypes.byref(one),
            ctypes.c_uint64(b.ptr), n, ctypes.c_uint64(a.ptr), k,
            ctypes.byref(zero), ctypes.c_uint64(c.ptr), n,
        )  # fmt: skip
        if status:
            raise CudaError(f"cublasSgemm failed: status {status}")

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
    for root in roots:
        names += sorted(glob.glob(f"{root}/libcublas.so*"))
    return [n for n in names if n]

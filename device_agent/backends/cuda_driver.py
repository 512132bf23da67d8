"""The CUDA driver API through ctypes, behind the `Driver` interface the `cuda` backend runs on.

`Driver` is what the backend needs of a GPU: device attributes, a context, modules (cubin or PTX),
launches, memory, events, and telemetry. `RealDriver` binds `libcuda.so.1` (and NVML,
`libnvidia-ml.so.1`, for readings that the driver API lacks); `cuda_fake.FakeDriver` implements the
same interface in Python for tests on machines without a GPU. `cuda.open_driver()` picks one: the real
driver unless `$KILN_CUDA_DRIVER` is "fake" (a test seam, never a deployment setting).

Every failed call raises `CudaError` naming the call and the driver's error; `sticky` says whether
the error poisoned the context (CUDA_ERROR_ILLEGAL_ADDRESS and its kin: every later call in the
process fails the same way, so the process must be replaced).

`Gpu` is the small convenience layer that the GPU tests and `benchmarks/cuda.py` use (device 0,
upload/download numpy arrays, time a callable); `cublas.Cublas` runs cuBLAS in its context.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

DRIVER_ENV = "KILN_CUDA_DRIVER"
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_ILLEGAL_ADDRESS = 700
# Errors after which "any further CUDA work will return the same error" (cuda.h): the context is
# lost for the life of the process. 999 (unknown) is counted in because a fresh process costs
# far less than trusting a context in an unknown state.
STICKY_ERRORS = frozenset({700, 702, 709, 710, 714, 715, 716, 717, 718, 719, 721, 999})
# Errors of loading a module or finding its kernels (the artifact's fault, not the device's).
LOAD_ERRORS = frozenset({200, 209, 218, 221, 222, 223, 224, 500})

# CUdevice_attribute values.
ATTR_CLOCK_RATE_KHZ = 13
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_L2_CACHE_BYTES = 38
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_MAX_SHARED_PER_BLOCK_OPTIN = 97
# CUfunction_attribute: dynamic shared memory a launch may ask for (48 KiB unless raised).
FUNC_ATTR_MAX_DYNAMIC_SHARED_BYTES = 8
DEFAULT_SHARED_BYTES = 48 * 1024


class CudaError(RuntimeError):
    """A driver, NVML or cuBLAS call failed; the message names the call and the error."""

    def __init__(self, call: str, code: int = 0, name: str = "", detail: str = "") -> None:
        label = f"{name} ({code})" if code else detail
        super().__init__(f"{call} failed: {label}" if label else f"{call} failed")
        self.call = call
        self.code = code
        self.name = name

    @property
    def sticky(self) -> bool:
        """Whether the context is lost (every later call of this process fails)."""
        return self.code in STICKY_ERRORS


@dataclass(frozen=True)
class GpuInfo:
    """What a GPU is: fixed for its life, so tags are made of it."""

    name: str
    sm: int  # compute capability as a number: 90 for 9.0
    memory_bytes: int
    sm_clock_khz: int
    multiprocessors: int
    l2_bytes: int
    max_shared_per_block_optin: int


@dataclass(frozen=True)
class GpuReadings:
    """A GPU now; None where neither NVML nor the driver says."""

    sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None


class Driver(ABC):
    """The CUDA driver as the `cuda` backend uses it. Handles and device pointers are ints.

    MUST hold: calls before `init` may fail; `open_context(ordinal)` makes that device's primary
    context current for this thread, and everything from `load_module` on acts in it; launches
    and memsets are asynchronous on the default stream (an error of a kernel may surface at the
    next synchronizing call: `synchronize`, `event_synchronize`, `copy_to_host`); events record
    points on that stream, and `event_elapsed_ms` is the GPU time between two recorded ones.
    """

    kind: ClassVar[str]  # "real" or "fake": a device tag, so no one trusts a fake's timings

    @abstractmethod
    def init(self) -> None:
        """cuInit. Raises CudaError when there is no usable driver."""

    @abstractmethod
    def device_count(self) -> int:
        """The GPUs this process sees (after $CUDA_VISIBLE_DEVICES)."""

    @abstractmethod
    def device_info(self, ordinal: int) -> GpuInfo:
        """Name, compute capability, memory, clock and sizes of GPU `ordinal` (no context made)."""

    @abstractmethod
    def readings(self, ordinal: int) -> GpuReadings:
        """SM clock, temperature and power of GPU `ordinal` now (no context made)."""

    @abstractmethod
    def open_context(self, ordinal: int) -> None:
        """Retain GPU `ordinal`'s primary context and make it current."""

    @abstractmethod
    def load_module(self, image: bytes) -> int:
        """A module from a cubin or PTX image (PTX is JIT-compiled for the device)."""

    @abstractmethod
    def unload_module(self, module: int) -> None: ...

    @abstractmethod
    def get_function(self, module: int, name: str) -> int:
        """The kernel `name` of `module` (CUDA_ERROR_NOT_FOUND when it has none)."""

    @abstractmethod
    def set_max_dynamic_shared(self, function: int, nbytes: int) -> None:
        """Let launches of `function` ask for `nbytes` of dynamic shared memory (> 48 KiB)."""

    @abstractmethod
    def launch(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        pointers: Sequence[int],
    ) -> None:
        """Enqueue `function(*pointers)` on the default stream."""

    @abstractmethod
    def alloc(self, nbytes: int) -> int: ...

    @abstractmethod
    def free(self, pointer: int) -> None: ...

    @abstractmethod
    def copy_to_device(self, pointer: int, host: np.ndarray) -> None:
        """Copy the C-contiguous `host` to `pointer` (synchronous)."""

    @abstractmethod
    def copy_to_host(self, host: np.ndarray, pointer: int) -> None:
        """Fill the C-contiguous `host` from `pointer` (synchronous)."""

    @abstractmethod
    def memset_d8(self, pointer: int, value: int, nbytes: int) -> None:
        """Set `nbytes` at `pointer` to `value` (asynchronous on the default stream)."""

    @abstractmethod
    def event_create(self) -> int: ...

    @abstractmethod
    def event_destroy(self, event: int) -> None: ...

    @abstractmethod
    def event_record(self, event: int) -> None: ...

    @abstractmethod
    def event_synchronize(self, event: int) -> None: ...

    @abstractmethod
    def event_elapsed_ms(self, start: int, stop: int) -> float: ...

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for all work of the context (cuCtxSynchronize)."""


def load_library(
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
    raise CudaError(f"loading {what}", detail="; ".join(errors or ["no candidate"]))


_P = ctypes.POINTER
_u64, _int, _uint, _size = ctypes.c_uint64, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
_vp = ctypes.c_void_p
# argtypes of the driver calls made here: without them ctypes passes Python ints as C ints, which
# truncates 64-bit device pointers and sizes.
_SIGNATURES: dict[str, list[type]] = {
    "cuInit": [_uint],
    "cuDeviceGetCount": [_P(_int)],
    "cuDeviceGet": [_P(_int), _int],
    "cuDeviceGetName": [ctypes.c_char_p, _int, _int],
    "cuDeviceGetAttribute": [_P(_int), _int, _int],
    "cuDeviceTotalMem_v2": [_P(_size), _int],
    "cuDeviceGetPCIBusId": [ctypes.c_char_p, _int, _int],
    "cuDevicePrimaryCtxRetain": [_P(_vp), _int],
    "cuDevicePrimaryCtxRelease_v2": [_int],
    "cuCtxSetCurrent": [_vp],
    "cuCtxSynchronize": [],
    "cuModuleLoadData": [_P(_vp), ctypes.c_char_p],
    "cuModuleUnload": [_vp],
    "cuModuleGetFunction": [_P(_vp), _vp, ctypes.c_char_p],
    "cuFuncSetAttribute": [_vp, _int, _int],
    "cuLaunchKernel": [_vp, _uint, _uint, _uint, _uint, _uint, _uint, _uint, _vp, _P(_vp), _P(_vp)],
    "cuMemAlloc_v2": [_P(_u64), _size],
    "cuMemFree_v2": [_u64],
    "cuMemcpyHtoD_v2": [_u64, _vp, _size],
    "cuMemcpyDtoH_v2": [_vp, _u64, _size],
    "cuMemsetD8_v2": [_u64, ctypes.c_ubyte, _size],
    "cuEventCreate": [_P(_vp), _uint],
    "cuEventDestroy_v2": [_vp],
    "cuEventRecord": [_vp, _vp],
    "cuEventSynchronize": [_vp],
    # CUDA 12.8 added a _v2 (the same signature) and 13 made it the default; older drivers lack it.
    "cuEventElapsedTime_v2": [_P(ctypes.c_float), _vp, _vp],
    "cuEventElapsedTime": [_P(ctypes.c_float), _vp, _vp],
    "cuGetErrorName": [_int, _P(ctypes.c_char_p)],
}


class RealDriver(Driver):
    """libcuda through ctypes; NVML (when installed) for telemetry."""

    kind = "real"

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None
        self._nvml: ctypes.CDLL | bool | None = None  # False: tried, absent
        self._context: tuple[int, int] | None = None  # (device, context)
        self._elapsed = "cuEventElapsedTime"

    @property
    def lib(self) -> ctypes.CDLL:
        if self._lib is None:
            raise CudaError("the CUDA driver", detail="not initialised (call init)")
        return self._lib

    def _call(self, name: str, *args: object) -> None:
        status = getattr(self.lib, name)(*args)
        if status != CUDA_SUCCESS:
            raise CudaError(name, status, self.error_name(status))

    def error_name(self, status: int) -> str:
        """The driver's name of `status` ("CUDA_ERROR_ILLEGAL_ADDRESS")."""
        text = ctypes.c_char_p()
        self.lib.cuGetErrorName(status, ctypes.byref(text))
        return text.value.decode() if text.value else "unknown error"

    def init(self) -> None:
        if self._lib is not None:
            return
        lib = load_library(["libcuda.so.1", "libcuda.so"], "the CUDA driver (libcuda)")
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = argtypes
                fn.restype = ctypes.c_int
        self._elapsed = "cuEventElapsedTime_v2"
        if not hasattr(lib, self._elapsed):
            self._elapsed = "cuEventElapsedTime"
        self._lib = lib
        self._call("cuInit", 0)

    def _device(self, ordinal: int) -> int:
        dev = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(dev), ordinal)
        return dev.value

    def _attribute(self, dev: int, attribute: int) -> int:
        out = ctypes.c_int()
        self._call("cuDeviceGetAttribute", ctypes.byref(out), attribute, dev)
        return out.value

    def device_count(self) -> int:
        count = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def device_info(self, ordinal: int) -> GpuInfo:
        dev = self._device(ordinal)
        name = ctypes.create_string_buffer(256)
        self._call("cuDeviceGetName", name, 256, dev)
        memory = ctypes.c_size_t()
        self._call("cuDeviceTotalMem_v2", ctypes.byref(memory), dev)
        major = self._attribute(dev, ATTR_COMPUTE_CAPABILITY_MAJOR)
        minor = self._attribute(dev, ATTR_COMPUTE_CAPABILITY_MINOR)
        return GpuInfo(
            name=name.value.decode(errors="replace"),
            sm=10 * major + minor,
            memory_bytes=memory.value,
            sm_clock_khz=self._attribute(dev, ATTR_CLOCK_RATE_KHZ),
            multiprocessors=self._attribute(dev, ATTR_MULTIPROCESSOR_COUNT),
            l2_bytes=self._attribute(dev, ATTR_L2_CACHE_BYTES),
            max_shared_per_block_optin=self._attribute(dev, ATTR_MAX_SHARED_PER_BLOCK_OPTIN),
        )

    def readings(self, ordinal: int) -> GpuReadings:
        """NVML's readings of the GPU (found by PCI bus id, since NVML ignores
        $CUDA_VISIBLE_DEVICES and may count GPUs in another order); all None without NVML."""
        nvml = self._nvml_lib()
        if nvml is None:
            return GpuReadings()
        bus = ctypes.create_string_buffer(64)
        try:
            self._call("cuDeviceGetPCIBusId", bus, 64, self._device(ordinal))
        except CudaError:
            return GpuReadings()
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(handle)) != 0:
            return GpuReadings()
        value = ctypes.c_uint()
        clock = temp = power = None
        if nvml.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(value)) == 0:  # NVML_CLOCK_SM
            clock = float(value.value)
        if nvml.nvmlDeviceGetTemperature(handle, 0, ctypes.byref(value)) == 0:  # TEMPERATURE_GPU
            temp = float(value.value)
        if nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(value)) == 0:  # milliwatts
            power = value.value / 1000.0
        return GpuReadings(clock, temp, power)

    def _nvml_lib(self) -> ctypes.CDLL | None:
        if self._nvml is None:
            try:
                nvml = ctypes.CDLL("libnvidia-ml.so.1")
                nvml.nvmlDeviceGetHandleByPciBusId_v2.argtypes = [ctypes.c_char_p, _P(_vp)]
                for name in ("nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature"):
                    getattr(nvml, name).argtypes = [_vp, _int, _P(_uint)]
                nvml.nvmlDeviceGetPowerUsage.argtypes = [_vp, _P(_uint)]
                self._nvml = nvml if nvml.nvmlInit_v2() == 0 else False
            except (OSError, AttributeError):
                self._nvml = False
        return self._nvml if isinstance(self._nvml, ctypes.CDLL) else None

    def open_context(self, ordinal: int) -> None:
        dev = self._device(ordinal)
        ctx = ctypes.c_void_p()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self._call("cuCtxSetCurrent", ctx)
        self._context = (dev, ctx.value or 0)

    def close_context(self) -> None:
        """Release the primary context `open_context` retained."""
        if self._context is not None:
            self.lib.cuDevicePrimaryCtxRelease_v2(self._context[0])
            self._context = None

    def load_module(self, image: bytes) -> int:
        if image.lstrip()[:1] in (b"/", b".") and not image.endswith(b"\0"):
            image += b"\0"  # PTX text must be NUL-terminated
        module = ctypes.c_void_p()
        self._call("cuModuleLoadData", ctypes.byref(module), image)
        return module.value or 0

    def unload_module(self, module: int) -> None:
        self._call("cuModuleUnload", module)

    def get_function(self, module: int, name: str) -> int:
        fn = ctypes.c_void_p()
        try:
            self._call("cuModuleGetFunction", ctypes.byref(fn), module, name.encode())
        except CudaError as e:
            raise CudaError(f"cuModuleGetFunction({name})", e.code, e.name) from None
        return fn.value or 0

    def set_max_dynamic_shared(self, function: int, nbytes: int) -> None:
        self._call("cuFuncSetAttribute", function, FUNC_ATTR_MAX_DYNAMIC_SHARED_BYTES, nbytes)

    def launch(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        pointers: Sequence[int],
    ) -> None:
        values = (ctypes.c_uint64 * len(pointers))(*pointers)
        # kernelParams: one void* per parameter, pointing at its value.
        params = (ctypes.c_void_p * len(pointers))(
            *(ctypes.addressof(values) + 8 * i for i in range(len(pointers)))
        )
        self._call("cuLaunchKernel", function, *grid, *block, shared_bytes, None, params, None)

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), nbytes)
        return ptr.value

    def free(self, pointer: int) -> None:
        self._call("cuMemFree_v2", pointer)

    def copy_to_device(self, pointer: int, host: np.ndarray) -> None:
        self._call("cuMemcpyHtoD_v2", pointer, host.ctypes.data, host.nbytes)

    def copy_to_host(self, host: np.ndarray, pointer: int) -> None:
        self._call("cuMemcpyDtoH_v2", host.ctypes.data, pointer, host.nbytes)

    def memset_d8(self, pointer: int, value: int, nbytes: int) -> None:
        self._call("cuMemsetD8_v2", pointer, value, nbytes)

    def event_create(self) -> int:
        event = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(event), 0)
        return event.value or 0

    def event_destroy(self, event: int) -> None:
        self._call("cuEventDestroy_v2", event)

    def event_record(self, event: int) -> None:
        self._call("cuEventRecord", event, None)

    def event_synchronize(self, event: int) -> None:
        self._call("cuEventSynchronize", event)

    def event_elapsed_ms(self, start: int, stop: int) -> float:
        ms = ctypes.c_float()
        self._call(self._elapsed, ctypes.byref(ms), start, stop)
        return float(ms.value)

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")


@dataclass
class DeviceBuffer:
    """`nbytes` of device memory at `ptr` (a CUdeviceptr)."""

    ptr: int
    nbytes: int


class Gpu:
    """Device 0 in its primary context, over `RealDriver`. Use `Gpu.open()`; `close()` releases
    what it made."""

    def __init__(self, driver: RealDriver) -> None:
        self.driver = driver
        self._buffers: list[DeviceBuffer] = []
        self._modules: list[int] = []

    @classmethod
    def open(cls) -> Gpu:
        """Device 0. Raises CudaError naming the call that failed (no driver, no GPU)."""
        driver = RealDriver()
        driver.init()
        if driver.device_count() < 1:
            raise CudaError("cuDeviceGetCount", detail="no CUDA device")
        driver.open_context(0)
        return cls(driver)

    def name(self) -> str:
        return self.driver.device_info(0).name

    def compute_capability(self) -> tuple[int, int]:
        return divmod(self.driver.device_info(0).sm, 10)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        buf = DeviceBuffer(self.driver.alloc(nbytes), nbytes)
        self._buffers.append(buf)
        return buf

    def free(self, buf: DeviceBuffer) -> None:
        if buf in self._buffers:
            self._buffers.remove(buf)
            self.driver.free(buf.ptr)

    def upload(self, array: np.ndarray) -> DeviceBuffer:
        host = np.ascontiguousarray(array)
        buf = self.alloc(host.nbytes)
        self.driver.copy_to_device(buf.ptr, host)
        return buf

    def download(
        self, buf: DeviceBuffer, shape: tuple[int, ...], dtype: type = np.float32
    ) -> np.ndarray:
        out: np.ndarray = np.empty(shape, dtype)
        if out.nbytes > buf.nbytes:
            raise CudaError(
                "download", detail=f"{out.nbytes} bytes asked of a {buf.nbytes}-byte buffer"
            )
        self.driver.copy_to_host(out, buf.ptr)
        return out

    def load_function(self, image: bytes, symbol: str) -> int:
        """The kernel `symbol` of a cubin or PTX image."""
        module = self.driver.load_module(image)
        self._modules.append(module)
        return self.driver.get_function(module, symbol)

    def launch(
        self,
        fn: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[DeviceBuffer],
    ) -> None:
        self.driver.launch(fn, grid, block, 0, [a.ptr for a in args])

    def synchronize(self) -> None:
        self.driver.synchronize()

    def time_ms(self, run: Callable[[], None], repeat: int, warmup: int = 2) -> float:
        """Mean milliseconds of `run()` (which enqueues GPU work) over `repeat` calls, timed
        between two CUDA events on the default stream."""
        for _ in range(warmup):
            run()
        start, stop = self.driver.event_create(), self.driver.event_create()
        try:
            self.driver.event_record(start)
            for _ in range(repeat):
                run()
            self.driver.event_record(stop)
            self.driver.event_synchronize(stop)
            return self.driver.event_elapsed_ms(start, stop) / repeat
        finally:
            self.driver.event_destroy(start)
            self.driver.event_destroy(stop)

    def close(self) -> None:
        for buf in self._buffers:
            self.driver.free(buf.ptr)
        for module in self._modules:
            self.driver.unload_module(module)
        self._buffers.clear()
        self._modules.clear()
        self.driver.close_context()

"""A fake CUDA driver in Python: says it is a GPU, records what it is asked, emulates a few kernels.

A test seam, never a device: it lets the `cuda` backend's control flow (load, launch, timing,
sticky-error recovery) and the agent's one-child-per-GPU set-up run on machines without a GPU.
It is chosen only by `KILN_CUDA_DRIVER=fake` (see `cuda.open_driver`); its devices are
tagged `driver=fake` and their results labelled emulated, so no one trusts its timings.

Environment (read by `FakeDriver.from_env`):
    KILN_CUDA_FAKE_GPUS       how many GPUs it reports (default 1); $CUDA_VISIBLE_DEVICES then
                              narrows them as the real driver's does (indices only)
    KILN_CUDA_FAKE_LAUNCH_US  GPU microseconds each launch takes on its event clock (default 10)

Every GPU is a "Kiln Fake GPU <index>", sm 90, 80 GiB, 1980 MHz, 132 SMs, 50 MiB of L2.

Images are cubin (starting b"\\x7fELF") or PTX text. An image's kernels are the function symbols
of a real cubin's ELF symbol table (what nvcc writes), else the names after `.entry` in it, so a
test writes `.entry fake_add_one` into its bytes. Device memory is numpy
bytes; pointers are ints, and a pointer inside an allocation (a workspace slice) works. Kernels
are emulated by name, over float32 elements, one per thread (grid x block):

    fake_copy(src, dst)       dst[i] = src[i]
    fake_add_one(x, y)        y[i] = x[i] + 1
    fake_add(a, b, c)         c[i] = a[i] + b[i]
    *fault*                   an illegal address: the launch returns, and the next synchronizing
                              call (and every call after it) raises CUDA_ERROR_ILLEGAL_ADDRESS
    *bad_launch*              the launch raises CUDA_ERROR_INVALID_VALUE (not sticky)
    anything else             touches no memory

A launch with more than 48 KiB of dynamic shared memory fails unless `set_max_dynamic_shared`
allowed it first, as on a real GPU. `calls` records every call as a tuple, e.g.
("launch", kernel, grid, block, shared_bytes, pointers), ("memset", pointer, value, nbytes),
("record", event), ("load", image_kind).
"""

from __future__ import annotations

import bisect
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from device_agent.backends.cuda_driver import (
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_NOT_FOUND,
    DEFAULT_SHARED_BYTES,
    CudaError,
    Driver,
    GpuInfo,
    GpuReadings,
)

GPUS_ENV = "KILN_CUDA_FAKE_GPUS"
LAUNCH_US_ENV = "KILN_CUDA_FAKE_LAUNCH_US"
FAKE_SM = 90
FAKE_SM_CLOCK_MHZ = 1980
FAKE_TEMPERATURE_C = 41.0
FAKE_POWER_W = 123.0
_MAX_SHARED_OPTIN = 227 * 1024
_BASE_POINTER = 0x7F00_0000_0000
_ALIGN = 256
_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_][A-Za-z0-9_]*)")
_ERROR_NAMES = {
    CUDA_ERROR_INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    CUDA_ERROR_NO_DEVICE: "CUDA_ERROR_NO_DEVICE",
    CUDA_ERROR_INVALID_IMAGE: "CUDA_ERROR_INVALID_IMAGE",
    CUDA_ERROR_NOT_FOUND: "CUDA_ERROR_NOT_FOUND",
    CUDA_ERROR_ILLEGAL_ADDRESS: "CUDA_ERROR_ILLEGAL_ADDRESS",
}


def fake_image(kernels: Sequence[str], kind: str = "ptx") -> bytes:
    """A module image the fake loads, holding `kernels` (for tests' containers)."""
    text = b".version 8.0\n.target sm_90\n" + b"".join(
        b".visible .entry " + k.encode() + b"(\n" for k in kernels
    )
    return b"\x7fELF" + text if kind == "cubin" else text


def _elf_functions(image: bytes) -> frozenset[str]:
    """The function symbols of a 64-bit little-endian ELF image (a cubin); empty when `image`
    is not one or has no symbol table."""
    try:
        if image[4:6] != b"\x02\x01":  # ELFCLASS64, little endian
            return frozenset()
        (shoff,) = struct.unpack_from("<Q", image, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)
        ]
        names: set[str] = set()
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind != 2 or entsize < 24:  # SHT_SYMTAB
                continue
            str_offset = sections[link][4]
            for at in range(offset, offset + size, entsize):
                name_at, info = struct.unpack_from("<IB", image, at)
                if info & 0xF == 2:  # STT_FUNC
                    end = image.index(b"\0", str_offset + name_at)
                    names.add(image[str_offset + name_at : end].decode())
        return frozenset(names)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return frozenset()


def _error(call: str, code: int) -> CudaError:
    return CudaError(call, code, _ERROR_NAMES[code])


@dataclass
class _Module:
    kernels: frozenset[str]


@dataclass
class _Function:
    name: str
    max_dynamic_shared: int = DEFAULT_SHARED_BYTES


@dataclass
class FakeDriver(Driver):
    """The fake; see the module docstring. `launch_s` is what one launch takes on the event
    clock, `kernel_s` overrides it per kernel name."""

    gpus: int = 1
    launch_s: float = 10e-6
    kernel_s: dict[str, float] = field(default_factory=dict)
    visible: tuple[int, ...] | None = None
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    kind = "fake"

    def __post_init__(self) -> None:
        self.clock_s = 0.0  # GPU time, advanced by launches
        self.memory: dict[int, np.ndarray] = {}  # allocation base -> its bytes
        self.context: int | None = None
        self._starts: list[int] = []  # sorted allocation bases
        self._next_pointer = _BASE_POINTER
        self._handles: dict[int, _Module | _Function] = {}
        self._next_handle = 0x1000  # never reused, as a driver's handles are not while live
        self._events: dict[int, float | None] = {}
        self._pending: CudaError | None = None  # a fault not yet seen by a synchronizing call
        self._poisoned: CudaError | None = None

    @classmethod
    def from_env(cls) -> FakeDriver:
        """A fake configured by $KILN_CUDA_FAKE_GPUS, $KILN_CUDA_FAKE_LAUNCH_US and
        $CUDA_VISIBLE_DEVICES."""
        visible_text = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = None
        if visible_text is not None:
            visible = tuple(int(v) for v in visible_text.split(",") if v.strip())
        return cls(
            gpus=int(os.environ.get(GPUS_ENV, "1")),
            launch_s=float(os.environ.get(LAUNCH_US_ENV, "10")) * 1e-6,
            visible=visible,
        )

    # -- devices -------------------------------------------------------------------------------

    def init(self) -> None:
        self.calls.append(("init",))

    def _indices(self) -> list[int]:
        """The fake GPUs this process sees, in ordinal order."""
        if self.visible is None:
            return list(range(self.gpus))
        return [i for i in self.visible if 0 <= i < self.gpus]

    def _physical(self, ordinal: int) -> int:
        indices = self._indices()
        if not 0 <= ordinal < len(indices):
            raise _error("cuDeviceGet", CUDA_ERROR_INVALID_VALUE)
        return indices[ordinal]

    def device_count(self) -> int:
        return len(self._indices())

    def device_info(self, ordinal: int) -> GpuInfo:
        return GpuInfo(
            name=f"Kiln Fake GPU {self._physical(ordinal)}",
            sm=FAKE_SM,
            memory_bytes=80 << 30,
            sm_clock_khz=FAKE_SM_CLOCK_MHZ * 1000,
            multiprocessors=132,
            l2_bytes=50 << 20,
            max_shared_per_block_optin=_MAX_SHARED_OPTIN,
        )

    def readings(self, ordinal: int) -> GpuReadings:
        self._physical(ordinal)
        return GpuReadings(float(FAKE_SM_CLOCK_MHZ), FAKE_TEMPERATURE_C, FAKE_POWER_W)

    def open_context(self, ordinal: int) -> None:
        self.context = self._physical(ordinal)
        self.calls.append(("context", self.context))

    # -- modules and launches ------------------------------------------------------------------

    def _usable(self, call: str) -> None:
        if self._poisoned is not None:
            raise CudaError(call, self._poisoned.code, self._poisoned.name)
        if self.context is None:
            raise CudaError(call, 201, "CUDA_ERROR_INVALID_CONTEXT")

    def _synchronizing(self, call: str) -> None:
        """A call that waits for the GPU: a pending fault surfaces here, and sticks."""
        self._usable(call)
        if self._pending is not None:
            self._poisoned, self._pending = self._pending, None
            raise CudaError(call, self._poisoned.code, self._poisoned.name)

    def _handle(self, obj: _Module | _Function) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = obj
        return handle

    def load_module(self, image: bytes) -> int:
        self._usable("cuModuleLoadData")
        kind = "cubin" if image[:4] == b"\x7fELF" else "ptx"
        if kind == "ptx" and b".version" not in image[:4096]:
            raise _error("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE)
        self.calls.append(("load", kind))
        kernels = _elf_functions(image) if kind == "cubin" else frozenset()
        kernels = kernels or frozenset(m.decode() for m in _ENTRY.findall(image))
        return self._handle(_Module(kernels))

    def unload_module(self, module: int) -> None:
        self.calls.append(("unload", module))
        self._handles.pop(module, None)

    def get_function(self, module: int, name: str) -> int:
        self._usable("cuModuleGetFunction")
        mod = self._handles.get(module)
        if not isinstance(mod, _Module) or name not in mod.kernels:
            raise CudaError(
                f"cuModuleGetFunction({name})", CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"
            )
        return self._handle(_Function(name))

    def set_max_dynamic_shared(self, function: int, nbytes: int) -> None:
        self._usable("cuFuncSetAttribute")
        fn = self._handles[function]
        if not isinstance(fn, _Function) or not 0 <= nbytes <= _MAX_SHARED_OPTIN:
            raise _error("cuFuncSetAttribute", CUDA_ERROR_INVALID_VALUE)
        self.calls.append(("shared", fn.name, nbytes))
        fn.max_dynamic_shared = nbytes

    def launch(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        pointers: Sequence[int],
    ) -> None:
        self._usable("cuLaunchKernel")
        fn = self._handles[function]
        assert isinstance(fn, _Function)
        self.calls.append(("launch", fn.name, tuple(grid), tuple(block), shared_bytes,
                           tuple(pointers)))  # fmt: skip
        if "bad_launch" in fn.name or shared_bytes > fn.max_dynamic_shared:
            raise _error("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE)
        self.clock_s += self.kernel_s.get(fn.name, self.launch_s)
        if "fault" in fn.name:
            self._pending = self._pending or _error("cuLaunchKernel", CUDA_ERROR_ILLEGAL_ADDRESS)
            return
        arity = {"fake_copy": 2, "fake_add_one": 2, "fake_add": 3}.get(fn.name)
        if arity != len(pointers):
            return  # not emulated: it only takes time
        threads = int(np.prod(grid)) * int(np.prod(block))
        views = [self._floats(p, threads) for p in pointers]
        if fn.name == "fake_copy":
            views[1][:] = views[0]
        elif fn.name == "fake_add_one":
            views[1][:] = views[0] + np.float32(1)
        else:
            views[2][:] = views[0] + views[1]

    def _floats(self, pointer: int, count: int) -> np.ndarray:
        """`count` float32s at `pointer` (fewer where the allocation ends first)."""
        base, offset = self._locate(pointer)
        data = self.memory[base]
        count = min(count, (data.nbytes - offset) // 4)
        return data[offset : offset + 4 * count].view(np.float32)

    # -- memory --------------------------------------------------------------------------------

    def _locate(self, pointer: int) -> tuple[int, int]:
        i = bisect.bisect_right(self._starts, pointer) - 1
        if i >= 0:
            base = self._starts[i]
            if pointer - base < self.memory[base].nbytes:
                return base, pointer - base
        raise _error("fake pointer lookup", CUDA_ERROR_INVALID_VALUE)

    def alloc(self, nbytes: int) -> int:
        self._usable("cuMemAlloc")
        if nbytes <= 0:
            raise _error("cuMemAlloc", CUDA_ERROR_INVALID_VALUE)
        pointer = self._next_pointer
        self._next_pointer += -(-nbytes // _ALIGN) * _ALIGN
        # Fresh device memory holds garbage: make it visible rather than zero.
        self.memory[pointer] = np.full(nbytes, 0xA5, np.uint8)
        bisect.insort(self._starts, pointer)
        self.calls.append(("alloc", pointer, nbytes))
        return pointer

    def free(self, pointer: int) -> None:
        if pointer not in self.memory:
            raise _error("cuMemFree", CUDA_ERROR_INVALID_VALUE)
        del self.memory[pointer]
        self._starts.remove(pointer)
        self.calls.append(("free", pointer))

    def copy_to_device(self, pointer: int, host: np.ndarray) -> None:
        self._synchronizing("cuMemcpyHtoD")
        base, offset = self._locate(pointer)
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        self.memory[base][offset : offset + raw.nbytes] = raw
        self.calls.append(("htod", pointer, raw.nbytes))

    def copy_to_host(self, host: np.ndarray, pointer: int) -> None:
        self._synchronizing("cuMemcpyDtoH")
        base, offset = self._locate(pointer)
        raw = host.reshape(-1).view(np.uint8)
        raw[:] = self.memory[base][offset : offset + raw.nbytes]
        self.calls.append(("dtoh", pointer, raw.nbytes))

    def memset_d8(self, pointer: int, value: int, nbytes: int) -> None:
        self._usable("cuMemsetD8")
        base, offset = self._locate(pointer)
        self.memory[base][offset : offset + nbytes] = value
        self.calls.append(("memset", pointer, value, nbytes))

    # -- events --------------------------------------------------------------------------------

    def event_create(self) -> int:
        self._usable("cuEventCreate")
        handle = 0x9000 + len(self._events)
        self._events[handle] = None
        return handle

    def event_destroy(self, event: int) -> None:
        self._events.pop(event, None)

    def event_record(self, event: int) -> None:
        self._usable("cuEventRecord")
        self._events[event] = self.clock_s
        self.calls.append(("record", event))

    def event_synchronize(self, event: int) -> None:
        self._synchronizing("cuEventSynchronize")

    def event_elapsed_ms(self, start: int, stop: int) -> float:
        self._usable("cuEventElapsedTime")
        begin, end = self._events.get(start), self._events.get(stop)
        if begin is None or end is None:
            raise CudaError("cuEventElapsedTime", 600, "CUDA_ERROR_NOT_READY")
        return (end - begin) * 1e3

    def synchronize(self) -> None:
        self._synchronizing("cuCtxSynchronize")
        self.calls.append(("sync",))

    def launches(self) -> list[tuple[Any, ...]]:
        """The recorded launches: (kernel, grid, block, shared_bytes, pointers) each."""
        return [c[1:] for c in self.calls if c[0] == "launch"]

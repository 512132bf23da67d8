"""NVIDIA GPUs via the CUDA driver API: CUBIN / PTX containers loaded, launched, event-timed.

Artifacts are CUBIN or PTX containers (`protos.cuda_program`): one module image for an arch
("sm_90") and, per entry symbol, a program of kernel launches over the entry's args and a
workspace. A cubin runs only on a GPU of its own compute capability and PTX on one of the same or
a newer one (the driver JIT-compiles it); any other is a LOAD_ERROR naming both. Loading a
container loads its module once per executor child, finds every kernel its programs launch
(a missing one is a LOAD_ERROR) and raises a kernel's dynamic shared memory limit where a launch
asks for more than 48 KiB; a program's workspace is allocated, and its constants written into
it, on the program's first run in the child, and kept while the module is.

Running an entry makes its args from the seed on the host (`device_agent.arrays`: the same
inputs a host reference sees), copies them to the GPU, enqueues the launches in order, waits,
and copies every arg back, so RUN returns the outputs and a check compares them with the
reference's (`NativeBackend`'s machinery; the reference may be a SHARED_OBJECT for the host, run
as the cpu backend runs it, or another entry of a container).

Timing (`time`) is CUDA events on the default stream around `number` runs of the whole launch
sequence, as the native timing loop of a CPU artifact does it: `warmup` runs, then `number`
grown (at most 100x a step) until one repeat lasts `min_repeat_ms`, then `repeat` samples of
elapsed / number. With `flush_cache_bytes` > 0, a memset of a buffer of at least twice the GPU's
L2 (Triton's do_bench sweeps 256 MB the same way) precedes each repeat, outside the timed
region; `cooldown_ms` sleeps there too. Launches are enqueued from Python, about 5 us apart: a
kernel shorter than that is timed at the launch rate, not its own.

A kernel that faults (an illegal address, a misaligned access, a trap) leaves a sticky error:
the context is lost and every later call of the process fails. Such a job is a RUNTIME_ERROR
naming the error, and `poisoned` is set, which makes the executor child exit after its result
so that the agent starts a fresh child for the next job (`executor_child`). Any other CUDA error
(a launch the GPU refuses, out of memory) is a RUNTIME_ERROR that keeps the child.

One agent serves each GPU as its own device (`count_devices`, `tags_of`, `child_env`,
`telemetry_of`: `device_agent.agent.PerDeviceBackend`); each device's child sees only its GPU
through $CUDA_VISIBLE_DEVICES, so in the child the GPU is ordinal 0, and the agent process itself
never makes a context (which would hold GPU memory for its life). With $KILN_CUDA_DRIVER=fake the
backend runs on `cuda_fake.FakeDriver` (a test seam): devices tag `driver=fake` and results are
labelled emulated.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from device_agent.backends.base import ELF_MAGIC, JobFailed, NativeBackend, read_artifact
from device_agent.backends.cpu import CpuBackend
from device_agent.backends.cuda_driver import (
    DEFAULT_SHARED_BYTES,
    DRIVER_ENV,
    LOAD_ERRORS,
    CudaError,
    Driver,
    GpuInfo,
    RealDriver,
)
from device_agent.backends.cuda_fake import FakeDriver
from device_agent.domain import EntryPoint, EvaluatorConfig, Status, Telemetry
from device_agent.jobs import Job, JobResult
from protos.cuda_program import CudaModule, CudaProgram, ProgramError, decode_module, is_cuda_module

# Modules kept loaded per child (each holds its workspaces on the GPU): a tuning run measures
# each candidate a few times in a row, so a few suffice.
_KEEP_MODULES = 16
# The growth of `number` as the native timing loop (compiler.codegen.timing) does it.
_MAX_GROWTH = 100.0
_MAX_NUMBER = 1 << 30
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass
class _Loaded:
    """A container loaded in this child's context: its module, kernels and workspaces."""

    path: str
    module: CudaModule
    handle: int
    functions: dict[str, int]
    workspaces: dict[str, int] = field(default_factory=dict)  # symbol -> device pointer


@dataclass(frozen=True)
class _Host:
    """A loaded host shared object (a reference)."""

    lib: Any


class CudaBackend(NativeBackend):
    """Runs CUBIN and PTX containers on one GPU per executor child; see the module docstring."""

    name = "cuda"
    formats = frozenset({"CUBIN", "PTX", "SHARED_OBJECT"})
    # The driver reserves virtual address space for unified memory far past any RLIMIT_AS a
    # board's agent sets (cuInit fails under one), and a GPU's memory is bounded by the GPU: the
    # executor child runs without the cap (see executor_child).
    limits_address_space: ClassVar[bool] = False

    def __init__(self, driver: Driver | None = None) -> None:
        self._driver = driver
        self._initialised = False
        self._host = CpuBackend()
        self._loaded: OrderedDict[str, _Loaded] = OrderedDict()
        self._gpu_info: GpuInfo | None = None  # the context's GPU, once opened
        self._flush: tuple[int, int] | None = None  # (pointer, nbytes) of the L2 flush buffer
        # The sticky error that lost this process's context; the child exits once it is set.
        self.poisoned = ""

    # -- the agent's view: one device per GPU --------------------------------------------------

    @property
    def driver(self) -> Driver:
        """The driver, initialised on first use.

        Raises:
            RuntimeError: no usable driver (the message says why).
        """
        if self._driver is None:
            try:
                self._driver = open_driver()
            except (CudaError, ValueError) as e:
                raise RuntimeError(f"the cuda backend cannot open the CUDA driver: {e}") from e
        if not self._initialised:
            try:
                self._driver.init()
            except CudaError as e:
                raise RuntimeError(f"the cuda backend cannot start the CUDA driver: {e}") from e
            self._initialised = True
        return self._driver

    def prepare(self, state_dir: str) -> None:
        """Start the driver and see at least one GPU (no context is made here).

        Raises:
            RuntimeError: no driver or no GPU.
        """
        del state_dir
        if self.count_devices() < 1:
            raise RuntimeError("the cuda backend found no CUDA GPU")

    def count_devices(self) -> int:
        """The GPUs this process sees."""
        try:
            return self.driver.device_count()
        except CudaError as e:
            raise RuntimeError(f"the cuda backend cannot count GPUs: {e}") from e

    def tags_of(self, index: int) -> dict[str, str]:
        """GPU `index`'s tags: arch "cuda" (overriding the host's), its name, compute capability
        ("sm": "90"), memory, SM clock and count, the host's arch (a check reference is built
        for it) and which driver runs it ("real", or "fake" for the test seam)."""
        info = self.driver.device_info(index)
        tags = {
            "arch": "cuda",
            "host_arch": platform.machine(),
            "gpu": info.name,
            "gpu_index": str(index),
            "sm": str(info.sm),
            "memory_mib": str(info.memory_bytes >> 20),
            "sm_clock_mhz": str(info.sm_clock_khz // 1000),
            "multiprocessors": str(info.multiprocessors),
            "driver": self.driver.kind,
        }
        if self.driver.kind != "real":
            tags["emulated"] = f"cuda-{self.driver.kind}"
        return tags

    def child_env(self, index: int) -> dict[str, str]:
        """The environment of GPU `index`'s executor child: $CUDA_VISIBLE_DEVICES naming only
        that GPU (the agent's own list's entry `index` when the agent has one)."""
        visible = os.environ.get(VISIBLE_ENV)
        if visible is None:
            return {VISIBLE_ENV: str(index)}
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        return {VISIBLE_ENV: entries[index]}

    def telemetry_of(self, index: int, host: Telemetry) -> Telemetry:
        """GPU `index` now: its SM clock as `cpu_mhz`, its temperature and power; the host's
        load."""
        try:
            readings = self.driver.readings(index)
        except (CudaError, RuntimeError):
            return Telemetry(load_1m=host.load_1m)
        return Telemetry(
            load_1m=host.load_1m,
            cpu_mhz=readings.sm_clock_mhz,
            temperature_c=readings.temperature_c,
            power_w=readings.power_w,
        )

    def device_tags(self) -> dict[str, str]:
        """The first GPU's tags (see `tags_of`)."""
        return self.tags_of(0)

    def telemetry(self, host: Telemetry) -> Telemetry:
        """The first GPU's readings (see `telemetry_of`)."""
        return self.telemetry_of(0, host)

    # -- the child's work ----------------------------------------------------------------------

    def execute(self, job: Job) -> JobResult:
        """As a native backend does; refused once the context is lost (the child is on its way
        out then, so this is only seen in-process)."""
        if self.poisoned:
            return JobResult(
                Status.RUNTIME_ERROR, error=f"the GPU context is lost: {self.poisoned}"
            )
        return super().execute(job)

    @contextlib.contextmanager
    def _cuda(self, what: str) -> Iterator[None]:
        """Turn a CudaError into the job's result: sticky ones also poison this child."""
        try:
            yield
        except CudaError as e:
            if e.sticky:
                self.poisoned = str(e)
                raise JobFailed(
                    Status.RUNTIME_ERROR,
                    f"{what}: {e}; the GPU context is lost, the executor is replaced",
                ) from e
            status = Status.LOAD_ERROR if e.code in LOAD_ERRORS else Status.RUNTIME_ERROR
            raise JobFailed(status, f"{what}: {e}") from e

    @property
    def gpu(self) -> GpuInfo:
        """This child's GPU (ordinal 0: the child sees only its own), its context made current
        on first use."""
        if self._gpu_info is None:
            try:
                driver = self.driver
            except RuntimeError as e:
                raise JobFailed(Status.RUNTIME_ERROR, str(e)) from e
            with self._cuda("opening the GPU"):
                driver.open_context(0)
                self._gpu_info = driver.device_info(0)
        return self._gpu_info

    def load(self, path: str) -> _Loaded | _Host:
        """The container at `path`, loaded once per child; or a host shared object."""
        loaded = self._loaded.get(path)
        if loaded is not None:
            self._loaded.move_to_end(path)
            return loaded
        data = read_artifact(path)
        if data[:4] == ELF_MAGIC:
            return _Host(self._host.load(path))
        if not is_cuda_module(data):
            raise JobFailed(Status.LOAD_ERROR, "cannot load artifact: not a CUDA container")
        try:
            module = decode_module(data)
        except ProgramError as e:
            raise JobFailed(Status.LOAD_ERROR, f"cannot load CUDA container: {e}") from e
        self._check_arch(module)
        loaded = self._loaded[path] = self._load_module(path, module)
        if len(self._loaded) > _KEEP_MODULES:
            _, evicted = self._loaded.popitem(last=False)
            self._unload(evicted)
        return loaded

    def _check_arch(self, module: CudaModule) -> None:
        sm = self.gpu.sm
        if module.image_kind == "cubin" and module.sm != sm:
            raise JobFailed(
                Status.LOAD_ERROR,
                f"the cubin is built for {module.arch}; this GPU is sm_{sm} ({self.gpu.name})",
            )
        if module.image_kind == "ptx" and module.sm > sm:
            raise JobFailed(
                Status.LOAD_ERROR,
                f"the PTX targets {module.arch}, newer than this GPU's sm_{sm} ({self.gpu.name})",
            )

    def _load_module(self, path: str, module: CudaModule) -> _Loaded:
        driver = self.driver
        with self._cuda(f"loading the {module.image_kind} module"):
            handle = driver.load_module(module.image)
        loaded = _Loaded(path, module, handle, {})
        try:
            with self._cuda("finding the kernels"):
                shared: dict[str, int] = {}
                for program in module.programs.values():
                    for launch in program.launches:
                        if launch.kernel not in loaded.functions:
                            loaded.functions[launch.kernel] = driver.get_function(
                                handle, launch.kernel
                            )
                        shared[launch.kernel] = max(
                            shared.get(launch.kernel, 0), launch.shared_bytes
                        )
                for kernel, nbytes in shared.items():
                    if nbytes > DEFAULT_SHARED_BYTES:
                        driver.set_max_dynamic_shared(loaded.functions[kernel], nbytes)
        except JobFailed:
            self._unload(loaded)
            raise
        return loaded

    def _unload(self, loaded: _Loaded) -> None:
        """Free a module's workspaces and unload it; a lost context frees all at exit anyway."""
        with contextlib.suppress(CudaError):
            for pointer in loaded.workspaces.values():
                self.driver.free(pointer)
            self.driver.unload_module(loaded.handle)

    def _program(self, loaded: _Loaded, symbol: str, n_args: int) -> CudaProgram:
        program = loaded.module.programs.get(symbol)
        if program is None:
            raise JobFailed(Status.LOAD_ERROR, f"no program {symbol} in the container")
        try:
            program.check(n_args)
        except ProgramError as e:
            raise JobFailed(Status.LOAD_ERROR, f"program {symbol}: {e}") from e
        return program

    def _workspace(self, loaded: _Loaded, symbol: str, program: CudaProgram) -> int:
        """The program's workspace on the GPU, made and filled with its constants once."""
        pointer = loaded.workspaces.get(symbol)
        if pointer is None and program.workspace_bytes > 0:
            pointer = self.driver.alloc(program.workspace_bytes)
            loaded.workspaces[symbol] = pointer
            for offset, data in program.constants:
                if data:
                    self.driver.copy_to_device(pointer + offset, np.frombuffer(data, np.uint8))
        return pointer or 0

    @contextlib.contextmanager
    def _device_args(self, buffers: list[np.ndarray]) -> Iterator[list[int]]:
        """The buffers copied to the GPU, freed afterwards."""
        pointers: list[int] = []
        try:
            for buffer in buffers:
                # cuMemAlloc refuses 0 bytes; a kernel never reads an empty arg.
                pointers.append(self.driver.alloc(max(buffer.nbytes, 1)))
                if buffer.nbytes:
                    self.driver.copy_to_device(pointers[-1], buffer)
            yield pointers
        finally:
            if not self.poisoned:
                with contextlib.suppress(CudaError):
                    for pointer in pointers:
                        self.driver.free(pointer)

    def _runner(
        self, loaded: _Loaded, program: CudaProgram, args: list[int], workspace: int
    ) -> Callable[[], None]:
        """A function that enqueues the program's launches in order."""
        launch = self.driver.launch
        steps = [
            (
                loaded.functions[x.kernel],
                x.grid,
                x.block,
                x.shared_bytes,
                [args[a.index] if a.kind == "arg" else workspace + a.offset for a in x.args],
            )
            for x in program.launches
        ]

        def run() -> None:
            for fn, grid, block, shared, pointers in steps:
                launch(fn, grid, block, shared, pointers)

        return run

    def call(self, module: Any, symbol: str, buffers: list[np.ndarray]) -> int:
        """Run `symbol` once and copy every buffer back; 0 or JobFailed."""
        if isinstance(module, _Host):
            return self._host.call(module.lib, symbol, buffers)
        program = self._program(module, symbol, len(buffers))
        with self._cuda(f"running {symbol}"):
            workspace = self._workspace(module, symbol, program)
            with self._device_args(buffers) as pointers:
                self._runner(module, program, pointers, workspace)()
                self.driver.synchronize()
                for buffer, pointer in zip(buffers, pointers, strict=True):
                    if buffer.nbytes:
                        self.driver.copy_to_host(buffer, pointer)
        return 0

    def time(
        self, module: Any, entry: EntryPoint, buffers: list[np.ndarray], config: EvaluatorConfig
    ) -> tuple[list[float], int]:
        """Samples of the entry's whole launch sequence, timed with CUDA events."""
        if isinstance(module, _Host):
            raise JobFailed(
                Status.LOAD_ERROR,
                "a cuda device times CUBIN and PTX containers; a shared object serves only as a "
                "check reference or for Run",
            )
        program = self._program(module, entry.symbol, len(buffers))
        with self._cuda(f"timing {entry.symbol}"):
            workspace = self._workspace(module, entry.symbol, program)
            with self._device_args(buffers) as pointers:
                run = self._runner(module, program, pointers, workspace)
                return self._time(run, config)

    def _time(self, run: Callable[[], None], config: EvaluatorConfig) -> tuple[list[float], int]:
        """(samples_s, number) of `run`, each sample one event-timed repeat / number."""
        driver = self.driver
        start, stop = driver.event_create(), driver.event_create()

        def repeat_s(number: int) -> float:
            driver.event_record(start)
            for _ in range(number):
                run()
            driver.event_record(stop)
            driver.event_synchronize(stop)
            return driver.event_elapsed_ms(start, stop) * 1e-3

        try:
            for _ in range(config.warmup):
                run()
            if config.warmup:
                driver.synchronize()
            number = max(config.number, 1)
            if config.min_repeat_ms > 0:
                min_s = config.min_repeat_ms * 1e-3
                while True:
                    elapsed_s = repeat_s(number)
                    if elapsed_s >= min_s or number >= _MAX_NUMBER:
                        break
                    # Aim a little past the target so that one more repeat usually suffices.
                    growth = 1.2 * min_s / elapsed_s if elapsed_s > 0 else _MAX_GROWTH
                    grown = int(number * min(growth, _MAX_GROWTH))
                    number = min(max(grown, number + 1), _MAX_NUMBER)
            flush = self._flush_buffer(config.flush_cache_bytes)
            samples = []
            for _ in range(max(config.repeat, 1)):
                if flush is not None:
                    driver.memset_d8(flush[0], 0, flush[1])
                if config.cooldown_ms > 0:
                    driver.synchronize()
                    time.sleep(config.cooldown_ms * 1e-3)
                samples.append(repeat_s(number) / number)
            return samples, number
        finally:
            if not self.poisoned:
                with contextlib.suppress(CudaError):
                    driver.event_destroy(start)
                    driver.event_destroy(stop)

    def _flush_buffer(self, flush_cache_bytes: int) -> tuple[int, int] | None:
        """The L2 flush buffer (None when not asked for): at least twice the L2 and the bytes
        asked, kept for the child's life."""
        if flush_cache_bytes <= 0:
            return None
        nbytes = max(flush_cache_bytes, 2 * self.gpu.l2_bytes)
        if self._flush is None or self._flush[1] < nbytes:
            if self._flush is not None:
                self.driver.free(self._flush[0])
                self._flush = None
            self._flush = (self.driver.alloc(nbytes), nbytes)
        return self._flush


class EmulatedCudaBackend(CudaBackend):
    """The cuda backend on the fake driver: results are labelled emulated."""

    emulated = True


def create() -> CudaBackend:
    """A new cuda backend on the driver $KILN_CUDA_DRIVER names (started at `prepare`)."""
    if os.environ.get(DRIVER_ENV) == "fake":
        return EmulatedCudaBackend()
    return CudaBackend()


def open_driver() -> Driver:
    """The driver `$KILN_CUDA_DRIVER` names: unset or "real" is libcuda, "fake" the test fake.

    Raises:
        ValueError: the variable names neither.
    """
    kind = os.environ.get(DRIVER_ENV, "") or "real"
    if kind == "real":
        return RealDriver()
    if kind == "fake":
        return FakeDriver.from_env()
    raise ValueError(f"${DRIVER_ENV} must be 'real' or 'fake', got {kind!r}")

"""Build candidates into artifacts, in a pool of worker processes so compiles overlap measurements.

A config that fails to build is a BUILD_ERROR result with the compiler's message, never an exception.

Several candidates per translation unit: with `per_unit=k`, a batch's candidates go to gcc `k` at a
time (`compiler.build.build_many`): one compile, one shared object with `k` entries. Each candidate
still gets its own `Artifact`: a view of the unit's bytes (same data, same sha256) whose entries
start with that candidate's own, which is the entry runners measure. So an agent receives and
caches the unit's .so once and times each entry by name. A unit that fails to build (one config
that does not lower or compile) is built again one candidate at a time, so the bad config fails
alone.

A GPU's target ("cuda/sm=90", `device_target`) builds the same way with nvcc: one unit is one
CUDA container (`compiler.build_cuda`) with a program per candidate, a unit that fails is built
again one candidate at a time, and each candidate's reference is its layout's naive kernel in C
for the GPU's host (`reference_target`), so the agent checks the GPU's answer on the CPU.

Compile cache: `compiler.toolchain.compile_shared` already caches shared objects by the hash of
source, compiler identity and flags ($KILN_CACHE_DIR, else ~/.cache/kiln/build); `cache_dir`
points the builder's compiles at another directory. A unit is a cache hit when the same configs
are built together again (a resumed run asks for the same batches).

Streaming: `submit(workload, indices)` starts a batch's units and returns a `BuildStream` at once
(`tuner.measure.build_stream`): its results come back as units finish, each unit with a
per-build timeout (`timeout_s`), so a tuning loop measures the first candidates of a batch while
the rest compile, and builds the next batch meanwhile. A builder with `submit` is a
`StreamingBuilder`; `LocalBuilder` and `tuner.measure.dask_builder.DaskBuilder` are. The
timeout cannot stop a unit running in a worker process: it runs on, its result dropped.

`build_async(workload, indices)` returns a Future of the list `build` returns (whole batches).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from compiler import build as compiler_build
from compiler.artifact import Artifact
from compiler.build_cuda import build_cuda
from compiler.ops.base import threaded_space
from compiler.ops.reference import reference_kernel, reference_symbol
from compiler.ops.vta_conv2d import VtaConv2dTemplate
from compiler.ops.vta_dense import VTA_TARGET, VtaDenseTemplate, build_vta
from compiler.toolchain import CACHE_ENV, TARGETS, host_target_name
from tuner.measure.build_stream import BuildResult, BuildStream, FuturesEngine
from tuner.measure.device_target import is_cuda_target, is_vta_target, vta_target_spec
from tuner.measure.runner import Reference
from tuner.records import Workload
from tuner.task import Task

# The check's tolerance: |got - ref| <= atol + rtol * |ref| per output element, with atol grown
# with the square root of the terms each output sums (R = flop / 2 per output), as float32
# rounding does. Measured on the agent's standard-normal inputs: dense and Winograd F(2)
# candidates match their references bit for bit; Winograd F(4), whose transforms reorder the
# sums, differs by up to 1.3e-7 of the output's scale, 19-28x inside this bound at R = 2,304-
# 4,608; a missing tail or a wrong element is off by about the output's RMS and always caught.
CHECK_RTOL = 1e-5
CHECK_ATOL_PER_SQRT_TERM = 1e-3

# Reference artifacts built in this process, by (target, symbol): configs of one layout share
# one (the symbol names the layout), so a worker compiles each layout's reference once.
_REFERENCES: dict[tuple[str, str], Reference] = {}
_REFERENCES_MAX = 256


def reference_for(task: Task, index: int, target: str) -> Reference:
    """The reference kernel of config `index`'s layout, built for `target` (cached).

    Raises:
        CompilerError: the reference does not lower or compile.
    """
    config = task.space.get(index)
    symbol = reference_symbol(task.template, task.workload.shape, config)
    key = (target, symbol)
    found = _REFERENCES.get(key)
    if found is not None:
        return found
    kernel = reference_kernel(task.template, task.workload.shape, config)
    art = compiler_build.build_many([kernel], reference_target(target))
    outputs = sum(math.prod(a.shape) for a in art.entries[0].args if a.role == "output")
    terms = max(1.0, task.flop / (2 * max(outputs, 1)))
    ref = Reference(art, kernel.symbol, CHECK_RTOL, CHECK_ATOL_PER_SQRT_TERM * math.sqrt(terms))
    if len(_REFERENCES) >= _REFERENCES_MAX:
        _REFERENCES.pop(next(iter(_REFERENCES)))
    _REFERENCES[key] = ref
    return ref


def reference_target(target: str) -> str:
    """The C target a candidate of `target` is checked against: `target` itself for C; the
    device's host for an accelerator program ("host", the simulator runs beside the builder);
    for a GPU kernel the base ISA of this machine's arch ("x86_64"), which the GPU's host runs
    whatever its CPU's extensions (a host of another arch than the builder's is not handled)."""
    if is_vta_target(target):
        return "host"
    if is_cuda_target(target):
        arch = TARGETS[host_target_name()].arch
        return min(
            (t for t in TARGETS.values() if t.arch == arch), key=lambda t: t.vector_bytes
        ).name
    return target


def _with_reference(result: BuildResult, task: Task, target: str) -> BuildResult:
    """`result` with its reference; a reference that fails to build fails the candidate, since
    its answer could not be checked."""
    if result.artifact is None:
        return result
    try:
        ref = reference_for(task, result.config_index, target)
    except Exception as exc:
        return BuildResult(result.config_index, None, f"reference kernel: {_error(exc)}")
    return dataclasses.replace(result, reference=ref)


def _symbol(workload: Workload, index: int, threads: int = 1) -> str:
    # the index names a config of the space for `threads` (one thread: no mark, as ever); the
    # index stays last, where `fake_runner.config_index_of` reads it
    mark = "" if threads == 1 else f"_t{threads}"
    return f"kiln_{workload.op}_{'x'.join(map(str, workload.shape))}{mark}_c{index}"


def _kernel(task: Task, index: int) -> compiler_build.Kernel:
    sch, args = task.template.instantiate(task.workload.shape, task.space.get(index))
    symbol = _symbol(task.workload, index, task.threads)
    return compiler_build.Kernel(sch, args, symbol, task.flop)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def build_one(workload: Workload, index: int, target: str, threads: int = 1) -> BuildResult:
    """Instantiate the template with config `index` (of the space for `threads` threads),
    lower, generate C and compile it."""
    try:
        task = Task(workload, threads)
        art = _compile_kernels([_kernel(task, index)], target)
    except Exception as exc:  # any failure of one candidate is that candidate's result
        return BuildResult(index, None, _error(exc))
    return BuildResult(index, art)


def entry_first(art: Artifact, symbol: str) -> Artifact:
    """A view of `art` (same bytes and sha256) whose first entry is `symbol`.

    Raises:
        KeyError: `art` has no entry `symbol`.
    """
    own = art.entry(symbol)
    rest = tuple(e for e in art.entries if e.symbol != symbol)
    return dataclasses.replace(art, entries=(own, *rest))


def build_unit(
    workload: Workload,
    indices: Sequence[int],
    target: str,
    check: bool = False,
    threads: int = 1,
) -> list[BuildResult]:
    """Build `indices` (of the config space for `threads` threads, `Task.threads`) as one
    translation unit; one BuildResult per index, in order.

    A config that does not instantiate fails alone; if the unit does not build, each remaining
    config is built by itself so that only the bad one fails. With `check`, each result carries
    the reference of its layout (`reference_for`).
    """
    out = _build_unit(workload, indices, target, threads)
    if not check:
        return out
    task = Task(workload, threads)
    return [_with_reference(r, task, target) for r in out]


def _build_unit(
    workload: Workload, indices: Sequence[int], target: str, threads: int = 1
) -> list[BuildResult]:
    try:
        task = Task(workload, threads)
    except Exception as exc:
        return [BuildResult(i, None, _error(exc)) for i in indices]
    if is_vta_target(target):
        return [_build_vta(task, i, target) for i in indices]
    kernels: dict[int, compiler_build.Kernel] = {}
    failed: dict[int, str] = {}
    for i in indices:
        try:
            kernels[i] = _kernel(task, i)
        except Exception as exc:
            failed[i] = _error(exc)
    unit: Artifact | None = None
    if len(kernels) > 1:
        try:
            unit = _compile_kernels(list(kernels.values()), target)
        except Exception:
            unit = None  # find which config broke it: build them one by one below
    out = []
    for i in indices:
        if i in failed:
            out.append(BuildResult(i, None, failed[i]))
        elif unit is not None:
            out.append(BuildResult(i, entry_first(unit, kernels[i].symbol)))
        else:
            try:
                out.append(BuildResult(i, _compile_kernels([kernels[i]], target)))
            except Exception as exc:
                out.append(BuildResult(i, None, _error(exc)))
    return out


def _compile_kernels(kernels: list[compiler_build.Kernel], target: str) -> Artifact:
    """One artifact of `kernels` for `target`: a CUDA container (one nvcc unit) for a GPU's
    target, else one shared object."""
    if is_cuda_target(target):
        return build_cuda(kernels, target)
    return compiler_build.build_many(kernels, target)


def _build_vta(task: Task, index: int, target: str = VTA_TARGET) -> BuildResult:
    """One candidate's accelerator program (a vta target: instructions, not C), for the spec
    the target names (`device_target.vta_target_spec`)."""
    try:
        template = task.template
        if not isinstance(template, VtaDenseTemplate | VtaConv2dTemplate):
            raise ValueError(f"target {target} builds vta_* templates, not {template.name}")
        spec = vta_target_spec(target)
        space = task.space
        if spec != template.spec:
            template = type(template)(spec)
            space = threaded_space(template, task.workload.shape, task.threads)
            if space.knobs != task.space.knobs:
                raise ValueError(
                    f"{template.name}'s configs for spec {spec.key()} are not those of the "
                    f"default spec (its GEMM block differs): not tunable as one task"
                )
        symbol = _symbol(task.workload, index, task.threads)
        art = build_vta(template, task.workload.shape, {symbol: space.get(index)})
    except Exception as exc:
        return BuildResult(index, None, _error(exc))
    return BuildResult(index, art)


class Builder(Protocol):
    target: str

    def build(
        self, workload: Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        """One BuildResult per index, in order; with `check`, each carries its reference."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class StreamingBuilder(Builder, Protocol):
    """A builder that starts a batch and hands its results back as they finish."""

    timeout_s: float | None

    def submit(
        self, workload: Workload, indices: Sequence[int], check: bool = False
    ) -> BuildStream:
        """Start building `indices` (units of `per_unit`); each unit fails after `timeout_s`."""
        ...


# A unit of four Winograd candidates took about a minute to lower and compile: five times that
# is a build that went wrong, not a slow one.
BUILD_TIMEOUT_S = 300.0


def _init_worker(
    cache_dir: str | None,
    cpus: tuple[int, ...],
    idle_cpus: tuple[int, ...] = (),
    normal: int = 0,
    started: Any = None,
) -> None:
    """Runs first in every build worker: its cache directory and the cores it (and gcc) may use.

    With `idle_cpus`, the workers after the first `normal` (counted in the shared `started`)
    run on those cores at idle priority (`idle_priority`), and so do their compilers."""
    if cache_dir is not None:
        os.environ[CACHE_ENV] = cache_dir
    if idle_cpus and started is not None:
        with started.get_lock():
            slot = started.value
            started.value += 1
        if slot >= normal:
            os.sched_setaffinity(0, idle_cpus)
            idle_priority()
            return
    if cpus:
        os.sched_setaffinity(0, cpus)


def idle_priority() -> bool:
    """Put this process (and the children it starts: gcc) in Linux's SCHED_IDLE class, where it
    runs only on what a core's other processes leave: a device's measurement on that core
    preempts it at once and is not slowed (dense 256 timed beside an idle-class busy loop on its
    core: median 131.6-132.2 us against 132.7-132.9 alone, spread 0.84% against 0.63-0.76%; a
    normal one doubled it). False where the OS has no such class."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


def _end_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate `pool`'s worker processes and reap them (Python 3.14 has a method for this;
    before it, the executor's process table is the only handle on its workers)."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    workers = list((getattr(pool, "_processes", None) or {}).values())
    for proc in workers:
        proc.terminate()
    for proc in workers:
        proc.join(timeout=10)


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _cache_env(cache_dir: str | None) -> Iterator[None]:
    """$KILN_CACHE_DIR set to `cache_dir` for an in-process build (nothing when None)."""
    if cache_dir is None:
        yield
        return
    with _ENV_LOCK:
        old = os.environ.get(CACHE_ENV)
        os.environ[CACHE_ENV] = cache_dir
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = old


class LocalBuilder:
    """Builds on this machine.

    Args:
        target: "host" or a name in compiler.toolchain.TARGETS.
        workers: build processes, kept alive between batches; 1 builds in this process unless
            `cpus` asks for pinning.
        per_unit: candidates compiled together in one translation unit (1: each alone).
        cache_dir: the compile cache directory (None: $KILN_CACHE_DIR, else ~/.cache/kiln/build).
        cpus: cores the build workers and their compilers may run on (empty: any), e.g. to keep
            builds off the core a local agent is pinned to.
        idle_cpus: cores of local devices, where one more worker per core builds at idle
            priority (`idle_priority`): it takes only the time the device's measurements leave,
            so builds use the device cores too without disturbing what they time. With it,
            `workers` may be 0 (every core is a device's).
        timeout_s: a unit not built this long after a worker took it is a BUILD_ERROR (None:
            no limit). A batch built in this process (`build` with one worker) has none.
        threads: the thread count the kernels are built for: config indices are of
            `Task(workload, threads)`'s space (its `parallel` knob when above 1).

    Raises:
        ValueError: workers or per_unit below 1 (workers 0 with idle_cpus is allowed), or a
            core this process may not use.
    """

    def __init__(
        self,
        target: str = "host",
        workers: int = 1,
        per_unit: int = 1,
        cache_dir: str | os.PathLike[str] | None = None,
        cpus: Sequence[int] = (),
        timeout_s: float | None = BUILD_TIMEOUT_S,
        threads: int = 1,
        idle_cpus: Sequence[int] = (),
    ) -> None:
        if workers < (0 if idle_cpus else 1) or per_unit < 1:
            raise ValueError(f"workers and per_unit must be >= 1, got {workers} and {per_unit}")
        allowed = os.sched_getaffinity(0)
        bad = sorted({*cpus, *idle_cpus} - allowed)
        if bad:
            raise ValueError(
                f"cannot build on core(s) {bad}: this process may use {sorted(allowed)}"
            )
        self.target = target
        self.threads = threads
        self.per_unit = per_unit
        self.timeout_s = timeout_s
        self._cache_dir = None if cache_dir is None else str(Path(cache_dir))
        self._pool: ProcessPoolExecutor | None = None
        self._async: ThreadPoolExecutor | None = None
        self.idle_workers = len(set(idle_cpus))
        if workers > 1 or cpus or idle_cpus:
            # spawn, not fork: the parent holds gRPC channels, which do not survive a fork.
            context = multiprocessing.get_context("spawn")
            started = context.Value("i", 0) if idle_cpus else None
            self._pool = ProcessPoolExecutor(
                workers + self.idle_workers,
                mp_context=context,
                initializer=_init_worker,
                initargs=(self._cache_dir, tuple(cpus), tuple(idle_cpus), workers, started),
            )

    def units(self, indices: Sequence[int]) -> list[list[int]]:
        """How `indices` are grouped into translation units, in order."""
        return [list(indices[i : i + self.per_unit]) for i in range(0, len(indices), self.per_unit)]

    def build(
        self, workload: Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        """One BuildResult per index, in order; never raises for a bad config. With `check`,
        each result carries its reference kernel (`BuildResult.reference`), for the device to
        check the candidate's outputs against."""
        if self._pool is None:
            with _cache_env(self._cache_dir):
                units = self.units(indices)
                return [
                    r
                    for u in units
                    for r in build_unit(workload, u, self.target, check, self.threads)
                ]
        built = self.submit(workload, indices, check).results()
        if self._pool is None:  # closed meanwhile: the failures that came back are the close's
            raise RuntimeError("the builder was closed while it built")
        return built

    def submit(
        self, workload: Workload, indices: Sequence[int], check: bool = False
    ) -> BuildStream:
        """Start building `indices`, one task per unit, and return at once; the stream hands
        results back as units finish. Units run in the worker processes (with one worker and no
        pinning: one at a time in a thread of this process), in the order submitted."""
        units = self.units(indices)
        if self._pool is not None:
            pool = self._pool
            tasks = [
                pool.submit(build_unit, workload, u, self.target, check, self.threads)
                for u in units
            ]
        else:
            thread = self._thread()
            tasks = [thread.submit(self._build_here, workload, u, check) for u in units]
        return BuildStream(zip(units, tasks, strict=True), FuturesEngine(), self.timeout_s)

    def _build_here(self, workload: Workload, unit: list[int], check: bool) -> list[BuildResult]:
        with _cache_env(self._cache_dir):
            return build_unit(workload, unit, self.target, check, self.threads)

    def _thread(self) -> ThreadPoolExecutor:
        if self._async is None:
            self._async = ThreadPoolExecutor(1, thread_name_prefix="kiln-build")
        return self._async

    def build_async(
        self, workload: Workload, indices: Sequence[int], check: bool = False
    ) -> Future[list[BuildResult]]:
        """Start building; the Future gives what `build` would. Builds run one batch at a time."""
        return self._thread().submit(self.build, workload, list(indices), check)

    def close(self) -> None:
        """Stop the build workers now: a build still running is abandoned, its worker ended.

        A run stopped by Ctrl-C or SIGTERM used to wait here for the build in flight (a minute
        for a batch of Winograd kernels), and a second signal during that wait left the process
        pool half shut, hanging the interpreter's exit for good.
        """
        pool, self._pool = self._pool, None
        if pool is not None:
            _end_workers(pool)  # the pool sees them die and fails their futures
            pool.shutdown(wait=True, cancel_futures=True)  # quick: it only joins its own thread
        if self._async is not None:
            self._async.shutdown(cancel_futures=True)  # its build, if any, failed with the pool
            self._async = None

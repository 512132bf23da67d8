"""The sections of `benchmarks/cuda.py`: sampled-config search, measured in-process on the GPU.

One section runs in one process (`run_section`): it forks its build pool before it opens the
GPU, then for each workload samples configs, builds them with nvcc (several kernels a unit,
units in parallel), launches each once against NaN-filled output, checks it against the peer,
times it with CUDA events, refines around the best few, and alternates the best with the peer.
With `dry_run` it builds the sampled candidates for the given arch and measures nothing.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from compiler.build import Kernel
from compiler.build_cuda import build_cuda, cuda_target
from compiler.errors import CompilerError
from compiler.ops import get_template
from compiler.ops.base import OpTemplate
from compiler.ops.space import Config, ConfigSpace
from protos.cuda_program import decode_module

Dims = tuple[int, int, int]
# Kernels per nvcc translation unit at most: fewer nvcc starts, but one bad kernel costs a
# rebuild of its unit's others one by one.
UNIT_KERNELS = 6
SEARCH_SHARE = 0.75  # of a workload's time: sampling, building, the single measurements
REFINE_SHARE = 0.25  # extra configs, as a share of --trials, mutated from the best few
REFINE_PARENTS = 3
TOP_SHOWN = 3
FP32_TOL = 1e-4  # max |ours - peer| / max |peer|: different summation orders
FP16_TOL = 2e-3  # fp16 products are exact; fp32 sums in the tensor cores' order and truncation


@dataclass(frozen=True)
class SearchOptions:
    """What `benchmarks/cuda.py` passes to a section (its flags, see its docstring)."""

    arch: str | None
    trials: int = 64
    rounds: int = 7
    repeat_ms: float = 3.0
    seed: int = 0
    gemm_sizes: tuple[int, ...] = (1024, 2048, 4096)
    fp16_sizes: tuple[int, ...] = (2048, 4096)
    layers: int = 11
    dry_run: bool = False
    best_file: Path | None = None  # JSON lines of the best configs found, for the models
    conv_peer: str = "im2col"  # or "cudnn", once its check (the cudnn section) passed
    exclude: frozenset[str] = frozenset()  # "template#index" candidates that lost the context
    state_file: Path | None = None  # JSON lines of finished workloads' rows, kept over restarts

    def allowed(self, template: str, indices: Sequence[int]) -> list[int]:
        """`indices` less the excluded candidates of `template`."""
        return [i for i in indices if f"{template}#{i}" not in self.exclude]


class CandidateFault(RuntimeError):
    """A candidate's launch lost the GPU context (a sticky CUDA error): the section's process
    can run nothing more; `benchmarks/cuda.py` runs the section again without `candidate`."""

    def __init__(self, candidate: str, error: Exception) -> None:
        super().__init__(f"{candidate} lost the GPU context: {error}")
        self.candidate = candidate


def load_rows(path: Path | None, section: str) -> dict[str, list[Any]]:
    """The rows of `section`'s workloads finished by an earlier run of it, by workload label."""
    rows: dict[str, list[Any]] = {}
    if path is not None and path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["section"] == section:
                rows[rec["label"]] = rec["row"]
    return rows


def save_row(path: Path | None, section: str, label: str, row: Sequence[Any]) -> None:
    """Keep a finished workload's row for a restarted run of the section."""
    if path is not None:
        with path.open("a") as f:
            f.write(json.dumps({"section": section, "label": label, "row": list(row)}) + "\n")


class Budget:
    """A section's wall-clock allowance, from its creation."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def slice_for(self, remaining_workloads: int) -> float:
        """The deadline of the next workload: an equal share of what is left."""
        return time.monotonic() + self.left() / max(1, remaining_workloads)


def conv_layers() -> list[tuple[str, tuple[int, ...]]]:
    """ResNet-18's 11 distinct convolutions at batch 1, 224x224: (label, workload), the
    workload (N, C, H, W, O, KH, KW, stride, pad, epilogue 0)."""
    return [
        ("stem 7x7/2 3->64", (1, 3, 224, 224, 64, 7, 7, 2, 3, 0)),
        ("l1 3x3 64", (1, 64, 56, 56, 64, 3, 3, 1, 1, 0)),
        ("l2 3x3/2 64->128", (1, 64, 56, 56, 128, 3, 3, 2, 1, 0)),
        ("l2 3x3 128", (1, 128, 28, 28, 128, 3, 3, 1, 1, 0)),
        ("l2 1x1/2 64->128", (1, 64, 56, 56, 128, 1, 1, 2, 0, 0)),
        ("l3 3x3/2 128->256", (1, 128, 28, 28, 256, 3, 3, 2, 1, 0)),
        ("l3 3x3 256", (1, 256, 14, 14, 256, 3, 3, 1, 1, 0)),
        ("l3 1x1/2 128->256", (1, 128, 28, 28, 256, 1, 1, 2, 0, 0)),
        ("l4 3x3/2 256->512", (1, 256, 14, 14, 512, 3, 3, 2, 1, 0)),
        ("l4 3x3 512", (1, 512, 7, 7, 512, 3, 3, 1, 1, 0)),
        ("l4 1x1/2 256->512", (1, 256, 14, 14, 512, 1, 1, 2, 0, 0)),
    ]


# -- building ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """One config's kernel: its image (shared with its unit's other kernels) and launch, or
    why it has none."""

    template: str
    index: int
    symbol: str
    image: bytes | None
    grid: Dims = (1, 1, 1)
    block: Dims = (1, 1, 1)
    error: str = ""


def _symbol(template: str, index: int) -> str:
    return f"{template}_{index}"


def _unit(template: str, shape: tuple[int, ...], indices: Sequence[int], arch: str) -> list[Built]:
    """Build `indices` of `template` at `shape` as one nvcc unit (then one by one if it fails).
    Runs in a worker process."""
    tpl = get_template(template)
    space = tpl.config_space(shape)
    kernels: list[Kernel] = []
    out: list[Built] = []
    for index in indices:
        try:
            sch, args = tpl.instantiate(shape, space.get(index))
            kernels.append(Kernel(sch, args, _symbol(template, index)))
        except (CompilerError, ValueError) as e:
            out.append(Built(template, index, _symbol(template, index), None, error=_line(e)))
    if not kernels:
        return out
    target = cuda_target(arch)
    try:
        module = decode_module(build_cuda(kernels, target).data)
    except CompilerError as e:
        if len(kernels) == 1:
            k = kernels[0]
            return [*out, Built(template, _index(k.symbol), k.symbol, None, error=_line(e))]
        for k in kernels:
            out.extend(_unit(template, shape, [_index(k.symbol)], arch))
        return out
    for k in kernels:
        launch = module.programs[k.symbol].launches[0]
        out.append(
            Built(template, _index(k.symbol), k.symbol, module.image, launch.grid, launch.block)
        )
    return out


def _index(symbol: str) -> int:
    return int(symbol.rsplit("_", 1)[1])


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:160]


class Builder:
    """A process pool that builds candidates; made before the GPU is opened (a forked child
    inherits no CUDA context)."""

    def __init__(self, arch: str, workers: int | None = None) -> None:
        self.arch = arch
        cores = os.cpu_count() or 1
        # two cores left to the process that launches and times kernels, where there are many
        self.workers = workers or (cores - 2 if cores > 4 else cores)
        self.pool = ProcessPoolExecutor(self.workers, mp_context=get_context("fork"))

    def submit(
        self, template: str, shape: tuple[int, ...], indices: Sequence[int]
    ) -> list[Future[list[Built]]]:
        """Start building `indices` (units of up to UNIT_KERNELS kernels, in order)."""
        per_unit = max(1, min(UNIT_KERNELS, math.ceil(len(indices) / self.workers)))
        return [
            self.pool.submit(_unit, template, shape, list(indices[i : i + per_unit]), self.arch)
            for i in range(0, len(indices), per_unit)
        ]

    def completed(
        self, futures: Sequence[Future[list[Built]]], deadline: float
    ) -> Iterator[list[Built]]:
        """Each unit's kernels as the unit finishes, until `deadline`; the units not started
        by then are cancelled."""
        pending = set(futures)
        while pending and time.monotonic() < deadline:
            done, pending = wait(pending, deadline - time.monotonic(), FIRST_COMPLETED)
            for f in done:
                try:
                    yield f.result()
                except Exception as e:  # a worker died: its unit is lost, not the section
                    yield [Built("?", -1, "?", None, error=_line(e))]
        for f in pending:
            f.cancel()

    def build(
        self, template: str, shape: tuple[int, ...], indices: Sequence[int], deadline: float
    ) -> list[Built]:
        """Every config of `indices` that was built (or failed) before `deadline`."""
        futures = self.submit(template, shape, indices)
        return [b for unit in self.completed(futures, deadline) for b in unit]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


# -- sampling ---------------------------------------------------------------------------------


def sample_indices(
    tpl: OpTemplate,
    shape: tuple[int, ...],
    n: int,
    rng: np.random.Generator,
    arch: str,
    first: Sequence[int] = (),
    prefer: Callable[[Config], bool] | None = None,
) -> list[int]:
    """`first`, the default config (0), then seeded draws of configs worth measuring (those
    `prefer` accepts first, while the draws find them), `n` in all."""
    space = tpl.config_space(shape)
    target = cuda_target(arch)
    out: list[int] = []
    for i in (*first, 0):
        if i not in out and len(out) < n:
            out.append(i)
    for want_preferred in (True, False):
        tries = 0
        while len(out) < n and tries < 200 * n and len(out) < len(space):
            tries += 1
            index = int(rng.integers(0, len(space)))
            if index in out:
                continue
            config = space.get(index)
            if not tpl.worth_measuring(shape, config, target):
                continue
            if want_preferred and prefer is not None and not prefer(config):
                continue
            out.append(index)
        if prefer is None:
            break
    return out


def mutations(
    space: ConfigSpace,
    tpl: OpTemplate,
    shape: tuple[int, ...],
    parents: Sequence[int],
    n: int,
    seen: set[int],
    rng: np.random.Generator,
    arch: str,
) -> list[int]:
    """Up to `n` unseen configs worth measuring, each a parent with one knob changed."""
    out: list[int] = []
    target = cuda_target(arch)
    knobs = [k for k in space.knobs if len(k.choices) > 1]
    for _ in range(50 * n):
        if len(out) >= n or not parents or not knobs:
            break
        parent = dict(space.get(parents[int(rng.integers(0, len(parents)))]))
        knob = knobs[int(rng.integers(0, len(knobs)))]
        parent[knob.name] = knob.choices[int(rng.integers(0, len(knob.choices)))]
        index = space.index_of(parent)
        if index in seen or index in out:
            continue
        if tpl.worth_measuring(shape, space.get(index), target):
            out.append(index)
    return out


# -- measuring --------------------------------------------------------------------------------


@dataclass
class Workload:
    """One problem on the GPU: our templates' candidates against `peer` on shared buffers."""

    label: str
    flop: float
    inputs: list[Any]  # DeviceBuffers, in the kernels' argument order
    out: Any  # the DeviceBuffer our kernels write
    want: np.ndarray  # the peer's output, flat float32
    peer: Callable[[], None]
    tol: float
    scratch: list[Any] = field(default_factory=list)  # the peer's own buffers
    others: dict[str, Callable[[], None]] = field(default_factory=dict)  # more peers, timed too


@dataclass
class Measured:
    built: Built
    ms: float
    function: int = 0


@dataclass
class SearchResult:
    best: Measured | None
    tried: int = 0
    built: int = 0
    measured: int = 0
    top: list[Measured] = field(default_factory=list)  # the fastest few, fastest first
    best_by_template: dict[str, Measured] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class Bench:
    """The GPU, cuBLAS and loaded modules of one section."""

    def __init__(self, repeat_ms: float) -> None:
        from device_agent.backends.cublas import Cublas
        from device_agent.backends.cuda_driver import Gpu

        self.gpu = Gpu.open()
        self.blas = Cublas(self.gpu)
        self.repeat_ms = repeat_ms
        # id of an image -> (the image, kept so that its id is never reused; its module)
        self._modules: dict[int, tuple[bytes, int]] = {}

    def function(self, b: Built) -> int:
        assert b.image is not None
        key = id(b.image)
        if key not in self._modules:
            self._modules[key] = (b.image, self.gpu.driver.load_module(b.image))
        return self.gpu.driver.get_function(self._modules[key][1], b.symbol)

    def launcher(self, fn: int, b: Built, args: Sequence[Any]) -> Callable[[], None]:
        def run() -> None:
            self.gpu.launch(fn, b.grid, b.block, args)

        return run

    def time_ms(self, run: Callable[[], None], cutoff_ms: float = math.inf) -> float:
        """Mean ms of `run` over about `repeat_ms` of GPU time (at least one call); a first
        call slower than `cutoff_ms` is the answer (a slow candidate is not worth more)."""
        first = self.gpu.time_ms(run, 1, warmup=1)
        if first > cutoff_ms:
            return first
        repeat = max(1, min(200, int(self.repeat_ms / max(first, 1e-3))))
        return self.gpu.time_ms(run, repeat, warmup=0)

    def output_of(self, wl: Workload) -> np.ndarray:
        self.gpu.synchronize()
        return self.gpu.download(wl.out, (wl.want.size,)).reshape(-1)

    def close(self) -> None:
        """Release what was made; after a sticky error the calls fail, and the process's exit
        frees it all anyway."""
        from device_agent.backends.cuda_driver import CudaError

        try:
            for _, module in self._modules.values():
                self.gpu.driver.unload_module(module)
            self._modules.clear()
            self.blas.close()
            self.gpu.close()
        except CudaError as e:
            print(f"  (closing the GPU: {e})", flush=True)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.abs(want).max()) or 1.0
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return float(np.nanmax(diff)) / scale if not np.isnan(diff).any() else math.inf


SLOW_CUTOFF = 3.0  # a candidate whose first timed call is this many times the best so far


def measure(
    bench: Bench, wl: Workload, b: Built, result: SearchResult, best_ms: float = math.inf
) -> Measured | None:
    """Launch `b` once on NaN-filled output, check it, time it (briefly, if it is far slower
    than `best_ms`); None (noted) if it fails."""
    from device_agent.backends.cuda_driver import CudaError

    name = f"{b.template}#{b.index}"
    try:
        fn = bench.function(b)
        run = bench.launcher(fn, b, [*wl.inputs, wl.out])
        bench.gpu.driver.memset_d8(wl.out.ptr, 0xFF, wl.out.nbytes)  # NaN everywhere
        run()
        err = relative_error(bench.output_of(wl), wl.want)
        if err > wl.tol:
            result.wrong.append(f"{name} (error {err:.1e})")
            return None
        return Measured(b, bench.time_ms(run, SLOW_CUTOFF * best_ms), fn)
    except CudaError as e:
        if e.sticky:  # the context is gone: the section ends here, and is run again without it
            raise CandidateFault(name, e) from e
        result.failed.append(f"{name}: {e}")
        return None


@dataclass
class Group:
    """One template's sampled configs of a workload, their builds perhaps started early."""

    tpl: OpTemplate
    shape: tuple[int, ...]
    indices: list[int]
    futures: list[Future[list[Built]]] = field(default_factory=list)

    def start(self, builder: Builder) -> Group:
        """Submit the builds now (so they run while earlier workloads are measured)."""
        if not self.futures:
            self.futures = builder.submit(self.tpl.name, self.shape, self.indices)
        return self


def search(
    bench: Bench | None,
    builder: Builder,
    wl: Workload | None,
    groups: Sequence[Group],
    opts: SearchOptions,
    deadline: float,
    rng: np.random.Generator,
) -> SearchResult:
    """Measure every group's sampled configs as their builds finish (on a GPU; in a dry run,
    build only), then mutations of the best few, until SEARCH_SHARE of the time to
    `deadline` is spent."""
    result = SearchResult(None)
    measured: list[Measured] = []
    search_end = time.monotonic() + SEARCH_SHARE * max(0.0, deadline - time.monotonic())
    seen: dict[str, set[int]] = {g.tpl.name: set(g.indices) for g in groups}
    for key in opts.exclude:  # never mutate back into a candidate that lost the context
        template, _, index = key.partition("#")
        if template in seen:
            seen[template].add(int(index))
    batch = [g.start(builder) for g in groups]
    for stage in range(2):
        futures = [f for g in batch for f in g.futures]
        result.tried += sum(len(g.indices) for g in batch)
        for unit in builder.completed(futures, search_end):
            for b in unit:
                if b.image is None:
                    result.failed.append(f"{b.template}#{b.index}: {b.error}")
                    continue
                result.built += 1
                if bench is None or wl is None or time.monotonic() > search_end:
                    continue
                best_ms = min((m.ms for m in measured), default=math.inf)
                m = measure(bench, wl, b, result, best_ms)
                if m is not None:
                    measured.append(m)
        if stage == 1 or time.monotonic() > search_end:
            break
        extra = max(1, int(REFINE_SHARE * opts.trials))
        batch = []
        for g in groups:
            parents = [m.built.index for m in sorted(measured, key=lambda m: m.ms)]
            parents = [i for i in parents if i in seen[g.tpl.name]][:REFINE_PARENTS]
            if bench is None:  # a dry run refines around the first configs instead
                parents = g.indices[:REFINE_PARENTS]
            space = g.tpl.config_space(g.shape)
            share = extra // len(groups) or 1
            new = mutations(
                space, g.tpl, g.shape, parents, share, seen[g.tpl.name], rng, builder.arch
            )
            seen[g.tpl.name].update(new)
            batch.append(Group(g.tpl, g.shape, new).start(builder))
    result.measured = len(measured)
    result.top = sorted(measured, key=lambda m: m.ms)[:TOP_SHOWN]
    for m in sorted(measured, key=lambda m: m.ms, reverse=True):
        result.best_by_template[m.built.template] = m
    if measured:
        result.best = min(measured, key=lambda m: m.ms)
    return result


def interleave(
    bench: Bench, wl: Workload, best: Measured, rounds: int
) -> tuple[float, float, dict[str, float]]:
    """Median ms of ours, of the peer and of each other peer over `rounds` alternating
    timings."""
    ours_run = bench.launcher(best.function, best.built, [*wl.inputs, wl.out])
    ours, peer = [], []
    others: dict[str, list[float]] = {name: [] for name in wl.others}
    for _ in range(max(1, rounds)):
        ours.append(bench.time_ms(ours_run))
        peer.append(bench.time_ms(wl.peer))
        for name, run in wl.others.items():
            others[name].append(bench.time_ms(run))
    medians = {name: statistics.median(times) for name, times in others.items()}
    return statistics.median(ours), statistics.median(peer), medians


def report(label: str, res: SearchResult, dry_run: bool = False) -> str:
    """What a workload's search did: built, measured, late, wrong, failed, the fastest few."""
    late = res.tried - res.built - len(res.failed)
    lines = [f"  {label}: {res.built}/{res.tried} built"]
    if not dry_run:
        lines[0] += f", {res.measured} measured and right"
    if late > 0:
        lines[0] += f", {late} not built in time"
    if res.wrong:
        lines.append(f"    wrong ({len(res.wrong)}): {'; '.join(res.wrong[:3])}")
    if res.failed:
        lines.append(f"    failed ({len(res.failed)}), e.g. {res.failed[0]}")
    for m in res.top:
        lines.append(f"    {m.ms:9.4f} ms  {m.built.template}#{m.built.index}")
    return "\n".join(lines)


def run_section(name: str, opts: SearchOptions, budget: Budget) -> dict[str, object]:
    """One section's table on stdout and its figures as a dict ("error" if it failed)."""
    from benchmarks import cuda_sections

    arch = opts.arch or "sm_90"
    builder = Builder(arch) if name not in ("models", "cudnn") else None
    try:
        runner = cuda_sections.SECTIONS[name]
        return runner(opts, budget, builder)
    except Exception as e:
        traceback.print_exc()
        return {"error": _line(e)}
    finally:
        if builder is not None:
            builder.close()

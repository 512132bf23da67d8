"""Build, check and time op-template kernels natively: the machinery behind `kernels.py`.

A candidate is (template, workload, config index). `build_candidate` runs in a worker process
(lower, render C with the timing entry, gcc through the content-hash cache) and returns the shared
object's path; `NativeKernel` loads it and times it through its generated timing loop, as the
agent's cpu backend does, so no Python overhead enters a sample. `search` builds a bounded random
sample of a config space in a process pool and keeps the fastest config that is also correct.
"""

from __future__ import annotations

import ctypes
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from compiler import ops
from compiler.build import build_source
from compiler.ops.base import OpTemplate, output_arrays
from compiler.ops.space import Config, ConfigSpace
from compiler.toolchain import compile_shared
from device_agent import abi


def template(name: str) -> OpTemplate:
    """The op-library template `name` (one with layout conversion)."""
    t = ops.get_template(name)
    if not isinstance(t, OpTemplate):
        raise TypeError(f"{name} is not an op-library template")
    return t


def build_candidate(
    name: str, shape: tuple[int, ...], index: int, target: str = "host"
) -> tuple[int, str, str]:
    """(index, path of the shared object, error text) of the candidate built for `target`; runs
    in a worker process."""
    try:
        t = template(name)
        sch, args = t.instantiate(shape, t.config_space(shape).get(index))
        so = compile_shared(build_source(sch, args, "kernel", target), target)
    except Exception as exc:  # a candidate that fails to build is a result, not the end
        return index, "", f"{type(exc).__name__}: {exc}"
    return index, str(so.path), ""


class NativeKernel:
    """One built candidate with its argument arrays, packed from logical inputs."""

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        config: Config,
        path: str,
        logical: Sequence[np.ndarray],
    ) -> None:
        self.template = template(name)
        self.shape, self.config = shape, config
        _, args = self.template.instantiate(shape, config)
        self.out_shape = args[-1].shape
        self.arrays = [*self.template.pack_inputs(shape, config, logical), *output_arrays(args)]
        self._lib = ctypes.CDLL(path)  # kept alive with the functions bound from it
        self._run = abi.bind_entry(self._lib, "kernel")
        self._time = abi.bind_timing(self._lib, "kernel__time")
        self._args = abi.pack_args(self.arrays)

    def call(self) -> None:
        """Run once through ctypes (what a timed Python loop calls, as it calls a peer)."""
        if self._run(self._args) != 0:
            raise RuntimeError("kernel returned an error code")

    def output(self) -> np.ndarray:
        """Run once; the output in the op's natural layout."""
        if self._run(self._args) != 0:
            raise RuntimeError("kernel returned an error code")
        return self.template.unpack_output(
            self.shape, self.config, self.arrays[-1].reshape(self.out_shape)
        )

    def seconds(self, min_repeat_ms: float, repeat: int = 1, number: int = 1) -> list[float]:
        """Mean seconds per call of `repeat` native repeats of at least `min_repeat_ms` each."""
        cfg = abi.TimingConfigC(
            warmup=1,
            number=number,
            repeat=repeat,
            min_repeat_ms=min_repeat_ms,
            cooldown_ms=0.0,
            flush_buf=None,
            flush_bytes=0,
        )
        samples = (ctypes.c_double * repeat)()
        used = ctypes.c_int32(0)
        if self._time(self._args, ctypes.byref(cfg), samples, ctypes.byref(used)) != 0:
            raise RuntimeError("timing entry returned an error code")
        return list(samples)


@dataclass
class SearchResult:
    index: int
    seconds: float
    tried: int
    failed: int


def search(
    name: str,
    shape: tuple[int, ...],
    trials: int,
    logical: Sequence[np.ndarray],
    expected: np.ndarray,
    pool: ProcessPoolExecutor,
    seed: int = 0,
    warm: Sequence[int] = (),
) -> SearchResult:
    """The fastest correct config found by a bounded search of about 1.5 x `trials` builds.

    The `warm` configs (the best known ones, as the tuner starts from its records) and random
    plausible configs first (the template's `worth_measuring`: a register tile that fits),
    then the neighbours (one knob one step away) of the two fastest; the four fastest
    are then re-timed in interleaved rounds. Candidates are compared by their fastest sample:
    on a shared machine other processes only ever add time.
    """
    t = template(name)
    space = t.config_space(shape)
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(len(space))]
    plausible = [i for i in order if t.worth_measuring(shape, space.get(i))] or order
    result = SearchResult(-1, float("inf"), 0, 0)
    timed: dict[int, float] = {}
    kernels: dict[int, NativeKernel] = {}
    tol = 1e-3 * max(1.0, float(np.abs(expected).max()))

    def measure(indices: Sequence[int]) -> None:
        futures = [pool.submit(build_candidate, name, shape, i) for i in indices]
        built = [f.result() for f in futures]  # no compiler runs beside the timings
        for index, path, error in built:
            result.tried += 1
            if error:
                result.failed += 1
                continue
            kernel = NativeKernel(name, shape, space.get(index), path, logical)
            if np.abs(kernel.output() - expected).max() > tol:
                result.failed += 1
                continue
            # The minimum: on a shared machine other work only ever adds time to a sample.
            timed[index] = min(kernel.seconds(min_repeat_ms=5.0, repeat=3))
            kernels[index] = kernel

    first = list(dict.fromkeys([*warm, *plausible]))
    measure(first[: trials + len(warm)])
    leaders = sorted(timed, key=timed.__getitem__)[:2]
    near = [i for lead in leaders for i in neighbours(space, lead) if i not in timed]
    near = [i for i in dict.fromkeys(near) if t.worth_measuring(shape, space.get(i))]
    measure(near[: max(1, trials // 2)])
    finalists = sorted(timed, key=timed.__getitem__)[:4]
    rounds: dict[int, list[float]] = {i: [] for i in finalists}
    for _ in range(3):
        for i in finalists:
            rounds[i].append(kernels[i].seconds(min_repeat_ms=10.0)[0])
    for i in finalists:
        seconds = min(rounds[i])
        if seconds < result.seconds:
            result.index, result.seconds = i, seconds
    return result


def neighbours(space: ConfigSpace, index: int) -> list[int]:
    """Configs that differ from config `index` in one knob, by one step in its choices."""
    config = space.get(index)
    found = []
    for knob in space.knobs:
        pos = knob.choices.index(config[knob.name])
        for step in (-1, 1):
            if 0 <= pos + step < len(knob.choices):
                values = dict(config)
                values[knob.name] = knob.choices[pos + step]
                found.append(space.index_of(values))
    return found


def process_pool(workers: int) -> ProcessPoolExecutor:
    """Builder processes (spawned: nothing of the parent's state leaks into them)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))

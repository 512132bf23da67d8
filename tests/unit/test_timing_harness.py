"""The precompiled timing harness (codegen.timing): compiled once per target into the build cache,
linked into each shared object whose timing entries call it, timing kernels as the agent asks;
and the GCC flags that skip loop passes leave a candidate's code as it was."""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from compiler import te, toolchain
from compiler.build import Kernel, build_many, build_source_many
from compiler.codegen.timing import HARNESS_SOURCE, HARNESS_SYMBOL, render_timing
from compiler.schedule.schedule import create_schedule
from device_agent import abi
from device_agent.backends.cpu import CpuBackend
from device_agent.domain import EntryPoint, EvaluatorConfig
from tuner.records import Workload
from tuner.task import Task

pytestmark = pytest.mark.usefixtures("build_cache")


class Sources:
    """The C sources compiled through toolchain's seam."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.compiled: list[str] = []
        self._real = toolchain._run
        monkeypatch.setattr(toolchain, "_run", self)

    def __call__(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        self.compiled.append(Path(cmd[-1]).read_text())
        return self._real(cmd)


def scale_kernel(symbol: str, factor: float, n: int = 64) -> Kernel:
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i] * factor, name="b")
    return Kernel(create_schedule(b), [a, b], symbol)


def time_entry(path: Path, symbol: str, config: EvaluatorConfig) -> tuple[list[float], int]:
    """`symbol` timed by the agent's own CPU backend, on 64 floats in and out."""
    backend = CpuBackend()
    x, y = np.ones(64, np.float32), np.zeros(64, np.float32)
    entry = EntryPoint(symbol, symbol + "__time", ())
    return backend.time(backend.load(str(path)), entry, [x, y], config)


def test_the_harness_is_compiled_once_and_linked_into_every_shared_object(
    monkeypatch: pytest.MonkeyPatch, build_cache: Path
) -> None:
    sources = Sources(monkeypatch)
    twice = build_many([scale_kernel("twice", 2.0)])
    thrice = build_many([scale_kernel("thrice", 3.0), scale_kernel("half", 0.5)])
    assert sources.compiled.count(HARNESS_SOURCE) == 1 and len(sources.compiled) == 3
    units = [s for s in sources.compiled if s != HARNESS_SOURCE]
    # the units call the harness; the loop, its clock and its headers are not compiled again
    assert all(f"{HARNESS_SYMBOL}(twice," in s or f"{HARNESS_SYMBOL}(thrice," in s for s in units)
    assert not any("clock_gettime(" in s or "<time.h>" in s for s in units)
    for i, art in enumerate((twice, thrice)):
        path = build_cache / f"loaded{i}.so"
        path.write_bytes(art.data)
        lib = ctypes.CDLL(str(path))
        assert not hasattr(lib, HARNESS_SYMBOL)  # hidden: each object calls its own copy
        samples, number = time_entry(
            path, art.entries[-1].symbol, EvaluatorConfig(repeat=2, min_repeat_ms=0.0)
        )
        assert len(samples) == 2 and all(s > 0 for s in samples) and number == 1


def test_a_kernel_timed_through_the_harness_grows_number_and_flushes(build_cache: Path) -> None:
    art = build_many([scale_kernel("twice", 2.0)])
    path = build_cache / "loaded.so"
    path.write_bytes(art.data)
    config = EvaluatorConfig(
        warmup=1, number=1, repeat=3, min_repeat_ms=2.0, cooldown_ms=0.1, flush_cache_bytes=4096
    )
    samples, number = time_entry(path, "twice", config)
    # 64 multiplies take tens of nanoseconds: 2 ms of them are many thousands of calls
    assert len(samples) == 3 and all(0 < s < 1e-3 for s in samples) and number > 100


def test_a_changed_harness_rebuilds_the_shared_objects_that_link_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = build_source_many([scale_kernel("twice", 2.0)])
    first = toolchain.compile_shared(source)
    assert toolchain.compile_shared(source).cache_hit
    monkeypatch.setattr(toolchain, "HARNESS_SOURCE", HARNESS_SOURCE + "/* another harness */\n")
    again = toolchain.compile_shared(source)
    assert not again.cache_hit and again.path != first.path


def test_clang_gets_none_of_gccs_own_flags() -> None:
    gcc_only = set(toolchain._GCC_ONLY_FLAGS)
    assert gcc_only <= set(toolchain.get_target("x86_64-avx512").flags)
    assert not gcc_only & set(toolchain.get_target("host", compiler="clang").flags)


def _kernel_assembly(source: str, flags: list[str]) -> dict[str, str]:
    """Each kernel's assembly (timing entries aside), local labels renamed alike."""
    cmd = ["gcc", *(f for f in flags if f != "-shared"), "-x", "c", "-S", "-o", "-", "-"]
    asm = subprocess.run(cmd, input=source, capture_output=True, text=True, check=True).stdout
    bodies = re.finditer(r"\n(kiln_\w+):\n(.*?)\.size\t\1", asm, re.S)
    return {m[1]: re.sub(r"\.L\w+", ".L", m[2]) for m in bodies if not m[1].endswith("__time")}


def test_gccs_skipped_loop_passes_leave_dense_candidates_code_unchanged() -> None:
    # What the flags are allowed to cost: nothing. A GCC whose skipped passes start to find
    # something in generated C fails here (the benchmark's dense at a size that compiles fast).
    task = Task(Workload("dense", (64, 64, 64)))
    target = "x86_64-avx512"
    configs = [i for i in range(0, len(task.space), 97) if task.worth_measuring(i, target)][:3]
    kernels = []
    for i in configs:
        sch, args = task.template.instantiate((64, 64, 64), task.space.get(i))
        kernels.append(Kernel(sch, args, f"kiln_dense_c{i}"))
    source = build_source_many(kernels, target)
    flags = list(toolchain.get_target(target).flags)
    plain = [f for f in flags if f not in toolchain._GCC_ONLY_FLAGS]
    assert len(kernels) == 3
    assert _kernel_assembly(source, flags) == _kernel_assembly(source, plain)


COUNTING = """#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <time.h>
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
/* args[0]: an int64 counter; each call counts itself and spins for 1 ms */
int32_t counting(void **args) {
  ++*(int64_t *)args[0];
  double end = now_s() + 1e-3;
  while (now_s() < end) {
  }
  return 0;
}
""" + render_timing(["counting"])


@pytest.mark.parametrize(
    ("cooldown_ms", "flush", "calls"),
    [(0.0, False, 2 + 1 + 3), (0.1, False, 2 + 1 + 4), (0.0, True, 2 + 1 + 4)],
)
def test_the_growths_last_run_is_the_first_sample_unless_a_repeat_has_a_flush_or_cooldown(
    cooldown_ms: float, flush: bool, calls: int
) -> None:
    """1 ms calls and min_repeat_ms 0.5: one call already lasts long enough, so the growth stops
    at its first run of one call; that run is the first of 4 samples when nothing precedes a
    repeat, and is measured again otherwise (2 warm-up calls first either way)."""
    lib = ctypes.CDLL(str(toolchain.compile_shared(COUNTING).path))
    entry = lib["counting__time"]
    entry.restype = ctypes.c_int32
    count = ctypes.c_int64(0)
    args = (ctypes.c_void_p * 1)(ctypes.addressof(count))
    buf = ctypes.create_string_buffer(4096)
    cfg = abi.TimingConfigC(
        warmup=2,
        number=1,
        repeat=4,
        min_repeat_ms=0.5,
        cooldown_ms=cooldown_ms,
        flush_buf=ctypes.addressof(buf) if flush else None,
        flush_bytes=4096 if flush else 0,
    )
    samples = (ctypes.c_double * 4)()
    used = ctypes.c_int32(0)
    assert entry(args, ctypes.byref(cfg), samples, ctypes.byref(used)) == 0
    assert used.value == 1 and count.value == calls
    assert all(0.9e-3 < s < 50e-3 for s in samples)

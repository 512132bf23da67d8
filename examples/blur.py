"""Halide's two-stage 3x3 box blur in Kiln's tensor-expression language: one algorithm, two schedules.

The algorithm is the Halide paper's first example (Ragan-Kelley et al., PLDI 2013), over the valid
region: an (H + 2) x (W + 2) image gives an H x W output, so no stage needs a boundary condition.

    blur_x[y, x] = (image[y, x] + image[y, x + 1] + image[y, x + 2]) / 3       (H + 2) x W
    blur_y[y, x] = (blur_x[y, x] + blur_x[y + 1, x] + blur_x[y + 2, x]) / 3    H x W

float32, where the paper used uint16: Kiln's expressions have no true division, and integer
arithmetic in the generated C is promoted to int (where numpy's uint16 wraps), so a uint16 blur
would need casts that neither the paper's version nor a plain C loop has. In float32 the division
is a multiply by 1/3 rounded to float32, the same in the Kiln kernels, the plain C loop and numpy,
in the same order of additions; they agree to within an ulp or two (`RTOL`), where gcc fuses a
multiply of blur_x into an add of blur_y (Kiln builds allow FMA contraction) after seeing both
in one small tile.

Two schedules of that one algorithm:
- clean: the defaults. blur_x is computed whole (a 16 MiB intermediate at 2048 x 2048, allocated
  per call) and both stages run as plain row-major loops, as a straightforward C++ version would.
- tuned (`TunedConfig`): groups of `rows` rows run in parallel (OpenMP); in each, blur_y is
  computed one vector column (`lanes` wide, `rows` rows unrolled) at a time, and blur_x is
  computed at that column: `rows + 2` vectors, held in registers (scope "local", constant
  indices), never stored. Where the image and the output exceed the last-level cache, blur_y's
  stores stream past the caches (pragma NONTEMPORAL: no read of each output line before it is
  written, and the output does not evict the input); see `config_for`.

Why: the blur does ~6 flops a pixel, so memory bounds it more than arithmetic. The clean schedule
moves ~6 bytes through the memory system per output byte (image in, blur_x out and back, blur_y
read for ownership and written); the tuned one 2, the least any schedule can (image read once,
blur_y written once). The paper's schedule (tiles of blur_y, blur_x computed per tile into a buffer
in L2), tuned here before, still wrote and re-read blur_x through the caches and read each output
line before writing it. In the same runs (AMD EPYC, 2 shared cores, other jobs running; clean
0.44-0.49 ms/MP) it took 0.34-0.38 ms/MP on one thread where this one takes 0.14-0.19, and
0.18-0.20 on two (2.0-2.3x over clean) where this one takes 0.10-0.13 (3.7-4.4x) and, on quieter
runs, 0.065-0.075 (6-8x). On two threads it runs within 5-20% of a copy of the same bytes
(`benchmarks/cores.py`, blur_vs_copy 0.85-0.98), which itself gets only 4.0-4.5x over clean while
other jobs load the machine: what is left is the memory system's.

`nontemporal` matters, both ways, and `config_for` picks it by size. Where the input and output
together exceed the last-level cache (2048 x 2048: 33.6 MB against this machine's 32 MB L3), an
ordinary store costs a read of each output line from memory first and evicts the input, so the
output streams: 0.059-0.099 ms/MP streamed against 0.066-0.107 stored normally (2 threads,
2026-11-27). Where they fit (1920 x 1080: 16.6 MB), both stay in the cache from call to call, while
streamed stores go to memory every time: 0.050-0.056 stored normally against 0.056-0.099 streamed.
The spread within each range is the host's: on this VM the memory bandwidth a process gets
alternates between two levels for seconds at a time (a copy of the same bytes reads 0.059 or 0.099
alike), so only the cache-resident case escapes it. The streaming store needs the vector's
alignment, so the benchmark's buffers are 64-byte aligned (`aligned_zeros`; numpy aligns to 16) for
every variant; a kernel given other addresses stores normally, with the same results.

`PLAIN_C` is the same two loops written by hand (the intermediate allocated per call, as the
paper's clean C++), built with gcc -O3 -march=native and called through ctypes.

    python examples/blur.py [--height 2048] [--width 2048] [--rounds 5] [--threads N]

prints milliseconds per megapixel of clean, tuned (1 thread and N, by default every core this
process may use) and plain C, timed in interleaved rounds (the median call of each round), after
checking all of them against numpy.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from compiler import te
from compiler.build import build_source
from compiler.codegen.vector import NONTEMPORAL
from compiler.schedule import Schedule, create_schedule
from compiler.toolchain import Target, compile_shared

THIRD = 1.0 / 3.0  # rendered as a float32 constant: np.float32(1 / 3) in the reference
RTOL = 1e-6  # relative: a couple of float32 ulps (values in [0, 1); atol the same)
ALIGN_BYTES = 64  # of the benchmark's buffers: one AVX-512 vector, one cache line


@dataclass(frozen=True)
class Blur:
    """The algorithm's tensors: the padded input image and both stages."""

    image: te.Tensor
    blur_x: te.Tensor
    blur_y: te.Tensor


def blur_algorithm(height: int, width: int) -> Blur:
    """The two stages for an `height` x `width` output (the input has two more of each)."""
    image = te.placeholder((height + 2, width + 2), name="image")
    blur_x = te.compute(
        (height + 2, width),
        lambda y, x: (image[y, x] + image[y, x + 1] + image[y, x + 2]) * THIRD,
        name="blur_x",
    )
    blur_y = te.compute(
        (height, width),
        lambda y, x: (blur_x[y, x] + blur_x[y + 1, x] + blur_x[y + 2, x]) * THIRD,
        name="blur_y",
    )
    return Blur(image, blur_x, blur_y)


def clean_schedule(height: int, width: int) -> tuple[Schedule, list[te.Tensor]]:
    """The default schedule: every stage computed whole, in row-major loops."""
    b = blur_algorithm(height, width)
    return create_schedule(b.blur_y), [b.image, b.blur_y]


@dataclass(frozen=True)
class TunedConfig:
    """The tuned schedule's knobs: rows of blur_y per vector column (`rows`: blur_x's `rows + 2`
    vectors of the column live in registers), the vector width in lanes, and whether blur_y's
    stores stream past the caches (`nontemporal`)."""

    rows: int = 8
    lanes: int = 16
    nontemporal: bool = True


@functools.cache
def last_level_cache_bytes() -> int | None:
    """The largest data or unified cache of CPU 0 in bytes (Linux sysfs, read once), or None if
    unknown."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=None)


def config_for(height: int, width: int, cache_bytes: int | None = None) -> TunedConfig:
    """The tuned config for an `height` x `width` output: blur_y's stores stream past the caches
    only when the input and the output together exceed the last-level cache (`cache_bytes`,
    default this machine's; unknown: streamed)."""
    cache = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    footprint = 4 * ((height + 2) * (width + 2) + height * width)
    return TunedConfig(nontemporal=cache is None or footprint > cache)


def tuned_schedule(
    height: int, width: int, cfg: TunedConfig | None = None
) -> tuple[Schedule, list[te.Tensor]]:
    """Groups of `rows` rows in parallel; in each, blur_y one vector column at a time, the
    column's blur_x computed right there into registers.

    blur_x is computed at blur_y's vector column (`compute_at` the column loop): bound inference
    gives `rows + 2` rows of `lanes`, which "local" scope and constant indices (blur_x's loops
    unrolled and vectorized) turn into vector registers (lower/promote.py); blur_y's `rows` rows
    are unrolled beside them. Two rows of blur_x in `rows + 2` are computed twice (also by the
    group below). The parallel loop runs over the groups themselves, so OpenMP's static schedule
    splits them evenly whatever the height (256 groups at 2048 rows, 135 at 1080); rows and
    columns that `rows` or `lanes` do not divide get their own loops (loop partition).
    """
    cfg = config_for(height, width) if cfg is None else cfg
    b = blur_algorithm(height, width)
    s = create_schedule(b.blur_y)
    y, x = b.blur_y.op.axis
    yo, yi = s[b.blur_y].split(y, cfg.rows)
    xo, xi = s[b.blur_y].split(x, cfg.lanes)
    s[b.blur_y].reorder(yo, xo, yi, xi)
    s[b.blur_y].unroll(yi)
    s[b.blur_y].vectorize(xi)
    if cfg.nontemporal:
        s[b.blur_y].pragma(xi, NONTEMPORAL)
    s[b.blur_y].parallel(yo)
    s[b.blur_x].compute_at(s[b.blur_y], xo)  # bound inference: rows + 2 rows of one column
    s[b.blur_x].set_scope("local")
    by, bx = b.blur_x.op.axis
    s[b.blur_x].unroll(by)
    s[b.blur_x].vectorize(bx)
    return s, [b.image, b.blur_y]


PLAIN_C = r"""
#include <stdint.h>
#include <stdlib.h>

int32_t blur_plain(const float *image, float *out, int64_t height, int64_t width) {
  const int64_t stride = width + 2;
  float *blur_x = malloc(sizeof(float) * (size_t)((height + 2) * width));
  if (blur_x == NULL) return -2;
  for (int64_t y = 0; y < height + 2; ++y)
    for (int64_t x = 0; x < width; ++x)
      blur_x[y * width + x] =
          (image[y * stride + x] + image[y * stride + x + 1] + image[y * stride + x + 2]) *
          (1.0f / 3.0f);
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      out[y * width + x] =
          (blur_x[y * width + x] + blur_x[(y + 1) * width + x] + blur_x[(y + 2) * width + x]) *
          (1.0f / 3.0f);
  free(blur_x);
  return 0;
}
"""


def reference(image: np.ndarray) -> np.ndarray:
    """numpy's blur of a float32 (H + 2) x (W + 2) image, in the same order of operations."""
    third = np.float32(THIRD)
    blur_x = (image[:, :-2] + image[:, 1:-1] + image[:, 2:]) * third
    return (blur_x[:-2] + blur_x[1:-1] + blur_x[2:]) * third


Call = Callable[[], None]


def kiln_call(
    sch: Schedule,
    args: Sequence[te.Tensor],
    image: np.ndarray,
    out: np.ndarray,
    symbol: str,
    target: Target | str = "host",
) -> Call:
    """Build the schedule (gcc, build cache) and bind it to `image` and `out`."""
    source = build_source(sch, args, symbol, target)
    lib = ctypes.CDLL(str(compile_shared(source, target).path))
    fn = lib[symbol]
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int32
    packed = (ctypes.c_void_p * 2)(image.ctypes.data, out.ctypes.data)

    def call() -> None:
        _ = lib, image, out  # the closure keeps the library and the arrays alive
        if fn(packed) != 0:
            raise RuntimeError(f"{symbol} returned an error code")

    return call


def plain_call(image: np.ndarray, out: np.ndarray) -> Call:
    """`PLAIN_C` built with gcc -O3 -march=native and bound to `image` and `out`."""
    lib = ctypes.CDLL(str(compile_shared(PLAIN_C).path))
    fn = lib.blur_plain
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int32
    src, dst = image.ctypes.data, out.ctypes.data
    height, width = out.shape

    def call() -> None:
        _ = lib, image, out
        if fn(src, dst, height, width) != 0:
            raise RuntimeError("blur_plain returned an error code")

    return call


@functools.cache
def _libgomp() -> ctypes.CDLL:
    # The same soname the kernels link: dlopen hands back the runtime they already loaded.
    lib = ctypes.CDLL("libgomp.so.1")
    lib.omp_set_num_threads.argtypes = [ctypes.c_int]
    lib.omp_set_num_threads.restype = None
    lib.omp_get_max_threads.argtypes = []
    lib.omp_get_max_threads.restype = ctypes.c_int
    return lib


def pin_openmp_threads() -> None:
    """Bind OpenMP's threads one to a core, unless the environment says otherwise; call it
    before the first kernel loads libgomp, which reads these once.

    Unbound, Linux here (2 vCPUs, 2026-11-27) at times left the worker thread on the main
    thread's core for a second or more: every call then waited for a scheduler tick, and the
    2-thread blur took 1.9 ms/MP instead of 0.17.
    """
    os.environ.setdefault("OMP_PROC_BIND", "true")
    os.environ.setdefault("OMP_PLACES", "cores")


def with_threads(call: Call, threads: int) -> Call:
    """`call` with `threads` OpenMP threads in the parallel regions it starts from this thread;
    the runtime's setting is put back after each call (others in the process share it)."""

    def run() -> None:
        gomp = _libgomp()
        before = gomp.omp_get_max_threads()
        gomp.omp_set_num_threads(threads)
        try:
            call()
        finally:
            gomp.omp_set_num_threads(before)

    return run


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def aligned_zeros(shape: tuple[int, ...], align_bytes: int = ALIGN_BYTES) -> np.ndarray:
    """float32 zeros whose data starts on an `align_bytes` boundary.

    numpy aligns large arrays to 16 bytes only; the tuned kernel's streaming stores need their
    vector's alignment (its rows of 2048 floats then all start aligned) and take ordinary
    stores elsewhere. Every variant gets such buffers, so all see the same alignment.
    """
    size = int(np.prod(shape))
    raw = np.zeros(size + align_bytes // 4, np.float32)
    skip = (-raw.ctypes.data % align_bytes) // 4
    return raw[skip : skip + size].reshape(shape)


def random_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A padded float32 test image, values in [0, 1), in an aligned buffer (`aligned_zeros`)."""
    image = aligned_zeros((height + 2, width + 2))
    image[...] = np.random.default_rng(seed).random((height + 2, width + 2), dtype=np.float32)
    return image


def ms_per_megapixel(seconds: float, height: int, width: int) -> float:
    return seconds * 1e3 / (height * width / 1e6)


def median_call_s(call: Call, min_round_s: float) -> float:
    """Median seconds of one call over a round of at least `min_round_s`, after a warm-up call.

    A median, not a mean: on a shared machine another process now and then takes one of the
    cores for a scheduler quantum (4-8 ms), and a parallel call then waits for its preempted
    thread; a mean over the round would carry those waits, the median is the typical call.
    """
    call()
    samples: list[float] = []
    end = time.perf_counter() + min_round_s
    while not samples or time.perf_counter() < end:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def interleaved_medians(
    calls: Sequence[tuple[str, Call]], rounds: int, min_round_s: float
) -> dict[str, list[float]]:
    """`median_call_s` of each labelled call per round, the order reversed every other round."""
    times: dict[str, list[float]] = {label: [] for label, _ in calls}
    for round_ in range(rounds):
        for label, call in calls if round_ % 2 == 0 else calls[::-1]:
            times[label].append(median_call_s(call, min_round_s))
    return times


def blur_calls(height: int, width: int, threads: int, image: np.ndarray) -> dict[str, Call]:
    """The four timed variants by label, each run once and checked against numpy.

    Raises:
        AssertionError: a variant's output differs from numpy's.
    """
    want = reference(image)
    out = {name: aligned_zeros((height, width)) for name in ("clean", "tuned", "c")}
    clean = kiln_call(*clean_schedule(height, width), image, out["clean"], "blur_clean")
    tuned = kiln_call(*tuned_schedule(height, width), image, out["tuned"], "blur_tuned")
    variants = {
        "clean": (clean, out["clean"]),
        "tuned, 1 thread": (with_threads(tuned, 1), out["tuned"]),
        f"tuned, {threads} threads": (with_threads(tuned, threads), out["tuned"]),
        "plain C -O3": (plain_call(image, out["c"]), out["c"]),
    }
    for label, (call, got) in variants.items():
        got.fill(np.nan)
        call()
        if not np.allclose(got, want, rtol=RTOL, atol=RTOL):
            err = float(np.nanmax(np.abs(got - want)))
            raise AssertionError(f"{label}: differs from numpy (up to {err:g}, or NaN left)")
    return {label: call for label, (call, _) in variants.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--height", type=int, default=2048)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=available_cores())
    opts = parser.parse_args(argv)
    pin_openmp_threads()
    h, w = opts.height, opts.width
    calls = blur_calls(h, w, opts.threads, random_image(h, w))
    print(f"blur {w} x {h} float32 ({h * w / 1e6:.2f} MP): all match numpy")
    times = interleaved_medians(list(calls.items()), opts.rounds, min_round_s=0.2)
    clean = statistics.median(times["clean"])
    print(f"{'variant':<22} {'ms/MP':>8} {'vs clean':>9}")
    for label, samples in times.items():
        t = statistics.median(samples)
        print(f"{label:<22} {ms_per_megapixel(t, h, w):>8.3f} {clean / t:>8.2f}x")


if __name__ == "__main__":
    main()

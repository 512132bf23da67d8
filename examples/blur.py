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
- tuned: the paper's schedule, with this machine's tile (`TunedConfig`). blur_y is tiled
  `tile_y` x `tile_x`, its inner x axis is vectorized and its row of tiles (the outer y axis) runs
  in parallel (OpenMP); blur_x is computed at each tile of blur_y (`tile_y + 2` rows of
  `tile_x`: it stays in L2), vectorized too.

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
from compiler.schedule import Schedule, create_schedule
from compiler.toolchain import Target, compile_shared

THIRD = 1.0 / 3.0  # rendered as a float32 constant: np.float32(1 / 3) in the reference
RTOL = 1e-6  # relative: a couple of float32 ulps (values in [0, 1); atol the same)


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
    """The tuned schedule's knobs: blur_y's tile (rows, columns), the vector width in lanes, and
    how many rows of a tile one pass of its vector loop computes (1: no unrolling).

    The paper's tiles were 32 x 256. Here (AMD EPYC, 2 cores, 2026-11-27) tiles as wide as the
    2048-pixel image were 1.3-1.5x faster on one thread: blur_x then reads whole input rows,
    which the hardware prefetcher streams, where a 256-wide tile reads 34 pieces of 1 KiB.
    """

    tile_y: int = 32
    tile_x: int = 2048
    lanes: int = 8
    unroll_y: int = 4


def tuned_schedule(
    height: int, width: int, cfg: TunedConfig = TunedConfig()
) -> tuple[Schedule, list[te.Tensor]]:
    """Halide's schedule: tiles, vectorized x, parallel rows of tiles, blur_x per tile.

    Beyond the paper, `unroll_y` rows of blur_y are computed per vector column: they read
    `unroll_y + 2` rows of blur_x instead of `3 * unroll_y` (gcc reuses the loaded vectors).
    Sizes that the tile or the vector width do not divide are fine: loop partition gives the
    tails their own loops (and a partial row of tiles runs after the parallel loop).
    """
    b = blur_algorithm(height, width)
    s = create_schedule(b.blur_y)
    y, x = b.blur_y.op.axis
    yo, xo, yi, xi = s[b.blur_y].tile(y, x, cfg.tile_y, cfg.tile_x)
    xio, xii = s[b.blur_y].split(xi, cfg.lanes)
    if cfg.unroll_y > 1:
        yio, yii = s[b.blur_y].split(yi, cfg.unroll_y)
        s[b.blur_y].reorder(yo, xo, yio, xio, yii, xii)
        s[b.blur_y].unroll(yii)
    s[b.blur_y].vectorize(xii)
    s[b.blur_y].parallel(yo)
    s[b.blur_x].compute_at(s[b.blur_y], xo)  # bound inference: tile_y + 2 rows of tile_x
    _, bx = b.blur_x.op.axis
    _bxo, bxi = s[b.blur_x].split(bx, cfg.lanes)
    s[b.blur_x].vectorize(bxi)
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


def random_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A padded float32 test image, values in [0, 1)."""
    return np.random.default_rng(seed).random((height + 2, width + 2), dtype=np.float32)


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
    out = {name: np.zeros((height, width), np.float32) for name in ("clean", "tuned", "c")}
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

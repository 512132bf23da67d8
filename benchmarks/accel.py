"""The VTA-like accelerator: how fast its native simulator runs (first part of issue 21's benchmark).

Big hand-written GEMM programs (`device_agent.vta.testing.gemm_program`: tiles of rows loaded,
multiplied over a micro-op loop nest, biased, rectified, shifted, clipped and stored, double
buffered or not) run on the simulator built by the agent's own set-up (`device_agent.vta.sim`),
each GEMM kernel this host has, once untimed and then `--rounds` times; a figure is the fastest
round (the run is deterministic and CPU-bound: on this shared 2-core machine other processes only
ever slow a round down). Speed is simulated
cycles (the program's total, all three modules overlapped, as the device reports them) per second
of host time spent in the simulator call (laying out the DRAM image is not counted). Every run's
output is checked against numpy first.

    python benchmarks/accel.py [--rounds 7] [--rows 16384]

Ends with one line:

    accel: sim_mcycles_per_s=<x>

the speed of the kernel the device picks (AUTO) on the double-buffered program. Utilisation with
and without latency hiding, and the quantised ResNet-18's time, come with the compiler target.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

# One BLAS thread: numpy's reference must not leave spinning threads on this 2-core machine
# while the simulator is timed.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from device_agent.vta import image
from device_agent.vta.sim import Kernel, Simulator, build, encode_code
from device_agent.vta.testing import gemm_program, gemm_reference
from protos.vta import Module
from protos.vta_program import Program

N = K = 256
TILE_ROWS = 32
SHIFT = 6


def gemm_args(rows: int) -> list[np.ndarray]:
    """Seeded int8 inputs, int32 bias and a zeroed output of the benchmark's GEMM."""
    rng = np.random.default_rng(0)
    return [
        rng.integers(-128, 128, (rows, K), dtype=np.int8),
        rng.integers(-128, 128, (N, K), dtype=np.int8),
        rng.integers(-(1 << 16), 1 << 16, (N,), dtype=np.int32),
        np.zeros((rows, N), np.int8),
    ]


def measure(
    sim: Simulator, program: Program, expected: np.ndarray, kernel: Kernel, rounds: int
) -> tuple[int, float, float]:
    """(simulated cycles, GEMM utilisation, fastest round's host seconds) of one program and kernel."""
    args = gemm_args(expected.shape[0])
    pristine = image.make_image(program, args)
    code = encode_code(program)
    seconds = []
    report = None
    sim.run(program.spec, code, pristine.copy(), kernel)  # warm-up: first touches of the pages
    for _ in range(rounds):
        dram = pristine.copy()
        start = time.perf_counter()
        report = sim.run(program.spec, code, dram, kernel)
        seconds.append(time.perf_counter() - start)
        image.read_back(program, dram, args)
        if not np.array_equal(args[3], expected):
            raise SystemExit(f"kernel {kernel.name}: the simulator's output differs from numpy")
    assert report is not None
    return report.total_cycles, report.gemm_utilisation, min(seconds)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=16384, help="rows of the GEMM (M)")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kiln-accel-") as state:
        sim = Simulator(build(state))
        programs = {db: gemm_program(opts.rows, N, K, TILE_ROWS, db, SHIFT) for db in (True, False)}
        program = programs[True]
        kernels = [Kernel.AUTO, *sim.kernels(program.spec)]
        x, w, bias, _ = gemm_args(opts.rows)
        expected = gemm_reference(x, w, bias, SHIFT)
        print(f"GEMM {opts.rows} x {N} x {K} int8, tiles of {TILE_ROWS} rows, "
              f"{len(program.insns)} instructions; fastest of {opts.rounds} rounds")  # fmt: skip
        print(
            f"{'buffering':<10} {'kernel':<8} {'sim cycles':>12} {'GEMM util':>10} "
            f"{'host ms':>9} {'Mcycles/s':>10}"
        )
        speed = {}
        for double_buffer in (True, False):
            for kernel in kernels:
                cycles, util, host_s = measure(
                    sim, programs[double_buffer], expected, kernel, opts.rounds
                )
                speed[(double_buffer, kernel)] = cycles / host_s / 1e6
                print(
                    f"{'double' if double_buffer else 'single':<10} {kernel.name:<8} "
                    f"{cycles:>12,} {util:>10.3f} {host_s * 1e3:>9.1f} "
                    f"{speed[(double_buffer, kernel)]:>10.1f}"
                )
        modules = ", ".join(m.name.lower() for m in Module)
        print(f"(cycles are the makespan of the {modules} modules running concurrently)")
    print(f"\naccel: sim_mcycles_per_s={speed[(True, Kernel.AUTO)]:.1f}")


if __name__ == "__main__":
    main()

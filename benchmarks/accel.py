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

Then the compiler target's utilisation: ResNet-18's 3x3 convolutions (batch 1, 224x224) as
im2col GEMMs (M = output pixels, N = output channels, K = 9 x input channels) through the
`vta_dense` template's generated programs (`compiler.codegen.vta`), tuned by exhaustive search
of the template's pruned space on simulated cycles, once with one virtual thread (no latency
hiding: each load waits for the previous GEMM) and once over all of them (the best has 2 or 4).
Utilisation = useful GEMM cycles / total cycles; each best program is checked against numpy.

Last, the quantised ResNet-18 (`compiler.quantized.resnet`: int8 weights and activations, int32
accumulation, shift-and-clip requantisation, seeded weights, 224x224) through a real pool: a
`kiln-tracker` and a `kiln-agent --backend vta_sim` started here (`LocalPool`). Each distinct conv
workload (and the dense head) is tuned on the pool on simulated cycles (`--trials` each, or read
from `--records`), the network runs with every conv on the agent (im2col on this machine; with
`--lowering direct` each conv is a `vta_conv2d` program lowered from its TE schedule, and this
machine only transposes) and its logits are checked bit for bit against the numpy int8 reference.
Its time is the accelerator's (the layers' simulated cycles at the spec's clock) plus the CPU
part's (im2col, pooling, residual adds: host time, fastest round); the CPU-only time is the whole
int8 network in numpy (`reference`: the GEMMs as exact float64 BLAS, one thread), timed interleaved
with the CPU part, `--rounds` rounds each.

    python benchmarks/accel.py [--rounds 7] [--rows 16384] [--trials 32] [--records R.jsonl]
                               [--lowering im2col|direct]

Ends with one line:

    accel: util_geomean=<x> util_no_hiding_geomean=<x> sim_mcycles_per_s=<x> resnet18_int8_ms=<ms>

the utilisation geomeans with and without latency hiding, the simulator speed of the kernel the
device picks (AUTO) on the double-buffered hand-written program, and the quantised ResNet-18's
time on the accelerator (CPU part included).
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

import kiln
from compiler.ops.vta_dense import VtaDenseTemplate
from compiler.quantized.accel import ConvLowering, DirectConv, Im2colDense
from compiler.quantized.resnet import calibration_image, int8_resnet18, reference
from device_agent.vta import image
from device_agent.vta.sim import Kernel, Simulator, build, encode_code
from device_agent.vta.testing import gemm_program, gemm_reference
from kiln.accel_model import cpu_seconds, run_network, tune_layers
from protos.vta import Module
from protos.vta_program import Program
from tuner.measure.local_pool import LocalPool
from tuner.options import TuneOptions

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


# ResNet-18's 3x3 convolutions as im2col GEMMs (M, N, K); the first of each stage has stride 2.
RESNET18_GEMMS = {
    "conv2_x 56x56 64->64": (3136, 64, 576),
    "conv3_1 28x28 64->128 s2": (784, 128, 576),
    "conv3_x 28x28 128->128": (784, 128, 1152),
    "conv4_x 14x14 256->256": (196, 256, 2304),
    "conv5_x 7x7 512->512": (49, 512, 4608),
}


def tune_gemm(
    sim: Simulator, template: VtaDenseTemplate, shape: tuple[int, int, int], vthreads: set[int]
) -> tuple[float, int, dict[str, int]]:
    """(utilisation, cycles, config) of the fastest program among the template's configs with
    `vthreads`; timing never looks at data, so the search runs on zeros, and the winner is
    checked against numpy on random inputs."""
    space = template.config_space(shape)
    m, n, k = shape
    zeros: list[np.ndarray] = [
        np.zeros((m, k), np.int8),
        np.zeros((n, k), np.int8),
        np.zeros(n, np.int32),
    ]
    best: tuple[int, float, dict[str, int]] | None = None
    for index in range(len(space)):
        config = space.get(index)
        if config["vthreads"] not in vthreads or not template.worth_measuring(shape, config):
            continue
        program = template.program(shape, config)
        dram = image.make_image(program, [*zeros, np.zeros((m, n), np.int8)])
        report = sim.run(program.spec, encode_code(program), dram)
        if best is None or report.total_cycles < best[0]:
            best = (report.total_cycles, report.gemm_utilisation, dict(config))
    assert best is not None
    inputs = template.random_inputs(shape, np.random.default_rng(1))
    args = [*inputs, np.zeros((m, n), np.int8)]
    program = template.program(shape, best[2])
    dram = image.make_image(program, args)
    sim.run(program.spec, encode_code(program), dram)
    image.read_back(program, dram, args)
    if not np.array_equal(args[-1], template.reference(*inputs)):
        raise SystemExit(f"vta_dense {shape} {best[2]}: the simulator's output differs from numpy")
    return best[1], best[0], best[2]


def utilisation_table(sim: Simulator) -> tuple[float, float]:
    """Print the tuned utilisation per layer; (geomean with hiding, geomean without)."""
    template = VtaDenseTemplate()
    print(
        "\nResNet-18 3x3 convolutions as int8 GEMMs on the accelerator, tuned on simulated cycles"
    )
    print(
        f"{'layer':<26} {'M x N x K':>16} {'util vt=1':>10} {'util best':>10} "
        f"{'cycles vt=1':>12} {'cycles best':>12}  best config"
    )
    hidden, plain = [], []
    for name, shape in RESNET18_GEMMS.items():
        u1, c1, _ = tune_gemm(sim, template, shape, {1})
        ub, cb, cfg = tune_gemm(sim, template, shape, {1, 2, 4})
        plain.append(u1)
        hidden.append(ub)
        tiles = f"m{cfg['tile_m']} n{cfg['tile_n']} k{cfg['tile_k']} vt{cfg['vthreads']}"
        print(
            f"{name:<26} {'x'.join(map(str, shape)):>16} {u1:>10.3f} {ub:>10.3f} "
            f"{c1:>12,} {cb:>12,}  {tiles}"
        )
    return float(np.exp(np.mean(np.log(hidden)))), float(np.exp(np.mean(np.log(plain))))


LOWERINGS: dict[str, ConvLowering] = {"im2col": Im2colDense(), "direct": DirectConv()}
_KNOB_LABELS = {"tile_m": "m", "tile_n": "n", "tile_k": "k", "tile_h": "h", "tile_w": "w",
                "tile_oc": "oc", "tile_ic": "ic", "vthreads": "vt"}  # fmt: skip


def resnet18_int8(
    trials: int, records: str | None, rounds: int, lowering: ConvLowering = LOWERINGS["im2col"]
) -> float:
    """Tune and run the quantised ResNet-18 on a local vta_sim pool, print its layers and the
    accelerator-vs-CPU table; the network's milliseconds on the accelerator, CPU part included."""
    net = int8_resnet18(image=224, seed=0)
    picture = calibration_image(224, seed=1)  # not the calibration image
    expected = reference(net, picture)
    with tempfile.TemporaryDirectory(prefix="kiln-accel-records-") as scratch:
        records_path = records or str(Path(scratch) / "resnet18_int8.jsonl")
        with (
            LocalPool(key="vta-sim", backend="vta_sim") as local,
            kiln.Pool(local.tracker_address, key="vta-sim", token_file=local.secrets_path) as pool,
        ):
            start = time.perf_counter()
            options = TuneOptions(trials=trials)
            configs = tune_layers(pool, net, trials, records_path, options, lowering)
            tune_s = time.perf_counter() - start
            run = run_network(pool, net, picture, configs, lowering)
    if not np.array_equal(run.logits, expected):
        raise SystemExit("quantised ResNet-18: the pool's logits differ from the numpy reference")
    print(f"\nQuantised ResNet-18 (int8, 224x224) on a vta_sim agent through a tracker: "
          f"{len({layer.workload for layer in run.layers})} workloads tuned in {tune_s:.0f} s "
          f"({trials} trials per workload, convs as {lowering.template} programs); logits "
          f"bit-exact with numpy")  # fmt: skip
    print(f"{'layer':<20} {'workload':>16} {'config':<24} {'cycles':>9} {'GEMM':>6} "
          f"{'load':>6} {'comp':>6} {'store':>6} {'ms':>7}")  # fmt: skip
    for layer in run.layers:
        c, cfg = layer.cycles, layer.config
        tiles = " ".join(f"{_KNOB_LABELS.get(k, k)}{v}" for k, v in cfg.items())
        print(
            f"{layer.name:<20} {'x'.join(map(str, layer.workload)):>16} {tiles:<24} "
            f"{c.total_cycles:>9,} {c.gemm_utilisation:>6.3f} {c.utilisation('load'):>6.3f} "
            f"{c.utilisation('compute'):>6.3f} {c.utilisation('store'):>6.3f} "
            f"{layer.seconds * 1e3:>7.3f}"
        )
    total = sum(layer.cycles.total_cycles for layer in run.layers)
    gemm = sum(layer.cycles.gemm_cycles for layer in run.layers)
    # interleaved: the CPU part and the CPU-only network, one round each in turn
    cpu_part, cpu_only = [], []
    for _ in range(rounds):
        cpu_part.append(cpu_seconds(net, picture, run, lowering, repeat=1))
        start = time.perf_counter()
        reference(net, picture)
        cpu_only.append(time.perf_counter() - start)
    accel_ms = run.accel_s * 1e3
    part_ms, only_ms = min(cpu_part) * 1e3, min(cpu_only) * 1e3
    network_ms = accel_ms + part_ms
    print(f"accelerator: {total:,} cycles, GEMM utilisation {gemm / total:.3f}, {accel_ms:.2f} ms")
    print(f"{'':<28} {'fastest ms':>10} {'range ms':>16}")
    for name, samples in ((f"CPU part ({'im2col' if lowering.template == 'vta_dense' else 'layout'}, pool, add)", cpu_part),
                          ("CPU-only int8 (numpy)", cpu_only)):  # fmt: skip
        lo, hi = min(samples) * 1e3, max(samples) * 1e3
        print(f"{name:<28} {lo:>10.2f} {f'{lo:.2f}-{hi:.2f}':>16}")
    ratios = sorted(o / (accel_ms + p * 1e3) * 1e3 for o, p in zip(cpu_only, cpu_part, strict=True))
    print(f"network on the accelerator {network_ms:.2f} ms = {accel_ms:.2f} accelerator + "
          f"{part_ms:.2f} CPU; CPU-only {only_ms:.2f} ms; speed-up {only_ms / network_ms:.2f}x "
          f"(per round {ratios[0]:.2f}-{ratios[-1]:.2f}x)")  # fmt: skip
    return network_ms


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=16384, help="rows of the GEMM (M)")
    parser.add_argument(
        "--trials", type=int, default=32, help="tuning trials per ResNet-18 workload"
    )
    parser.add_argument("--records", help="records of earlier ResNet-18 tuning to reuse (JSONL)")
    parser.add_argument(
        "--lowering", choices=sorted(LOWERINGS), default="im2col",
        help="the network's convs: im2col + vta_dense, or vta_conv2d lowered from TE",
    )  # fmt: skip
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
        util, util_no_hiding = utilisation_table(sim)
    network_ms = resnet18_int8(opts.trials, opts.records, opts.rounds, LOWERINGS[opts.lowering])
    print(
        f"\naccel: util_geomean={util:.3f} util_no_hiding_geomean={util_no_hiding:.3f} "
        f"sim_mcycles_per_s={speed[(True, Kernel.AUTO)]:.1f} resnet18_int8_ms={network_ms:.2f}"
    )


if __name__ == "__main__":
    main()

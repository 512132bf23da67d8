"""Where a model's time goes on several threads: each kernel of the one-thread build on one
thread beside the same step of the N-thread build on N threads.

Each kernel runs alone through its native timing entry, over the model's own buffers: `number`
calls a repeat, the fastest repeat of several, kernels of both builds alternating. The fastest
repeat, not the median: on this shared 2-vCPU machine another process often holds a core, and a
parallel kernel then waits a scheduler quantum at its barrier; the fastest repeat is what the
kernel costs when both cores are its own. The whole models are timed the same way, alternating,
so the table also shows the gap between a model and the sum of its kernels (OpenMP regions
opened and closed, outputs that the next kernel reads from the other core's cache). With
`--flush-mb N` every repeat is one call after N MB are swept through the caches, as a kernel
of a model meets its weights when they do not all fit the last-level cache (ResNet-18's 46 MB):
the sums then come near the whole model's time.

    python benchmarks/cores_kernels.py [--model mobilenet_v2] [--threads 2] [--top 25]
        [--flush-mb 64]

Prints the kernels with the most time lost to the ideal (1-thread time / N), then one line:

    cores_kernels: model=<m> threads=<n> kernels_1t_ms=<x> kernels_nt_ms=<x> model_1t_ms=<x>
        model_nt_ms=<x> kernel_scaling=<x> model_scaling=<x>
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # libgomp reads these once, when the first kernel loads it
    os.environ.setdefault("OMP_PROC_BIND", "true")
    os.environ.setdefault("OMP_PLACES", "cores")
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # device_agent/executor.py's OPENMP_SPIN_COUNT

import argparse
import ctypes
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from compiler import zoo
from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model import ModelPlan, build_model, plan_model
from device_agent import abi
from examples.blur import with_threads
from tuner.network.timing import NativeModel, seeded_feeds

REPEATS = 15


def _gomp() -> ctypes.CDLL:
    gomp = ctypes.CDLL("libgomp.so.1")
    gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
    return gomp


def step_timer(
    native: NativeModel, plan: ModelPlan, index: int, flush: np.ndarray | None = None
) -> Callable[[int], float]:
    """The fastest of REPEATS repeats of `number` calls of step `index`, in seconds a call;
    `flush` (bytes) swept through the caches before each repeat."""
    step = plan.steps[index]
    args = native.step_args(plan, step)
    timer = abi.bind_timing(native.lib, native.model.artifact.entries[index].timing_symbol)

    def run(number: int) -> float:
        cfg = abi.TimingConfigC(
            warmup=2,
            number=number,
            repeat=REPEATS,
            min_repeat_ms=0.0,
            cooldown_ms=0.0,
            flush_buf=None if flush is None else flush.ctypes.data,
            flush_bytes=0 if flush is None else flush.nbytes,
        )
        samples = (ctypes.c_double * REPEATS)()
        if timer(args, ctypes.byref(cfg), samples, None) != 0:
            raise RuntimeError(f"timing entry of {step.kernel.symbol} returned an error")
        return min(samples)

    return run


def fastest_call_s(call: Callable[[], object], calls: int) -> float:
    call()
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; fastest kept")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--flush-mb", type=int, default=0, help="sweep this many MB before each kernel call"
    )
    opts = parser.parse_args(argv)
    proto = zoo.build(opts.model)
    feeds = seeded_feeds(proto, 0, zoo.BERT_VOCAB)
    graph = from_onnx(proto)
    counts = (1, opts.threads)
    plans = {n: plan_model(graph, None, "host", n) for n in counts}
    natives = {n: NativeModel(build_model(graph, None, "host", n), feeds) for n in counts}
    if [s.kernel.symbol for s in plans[1].steps] != [
        s.kernel.symbol for s in plans[counts[1]].steps
    ]:
        raise SystemExit("the builds have different steps: compare them by hand")
    gomp = _gomp()
    flush = np.ones(opts.flush_mb << 20, np.uint8) if opts.flush_mb > 0 else None
    number = 1 if flush is not None else 5  # a flush before each repeat: one cold call each
    timers = {
        n: [step_timer(natives[n], plans[n], i, flush) for i in range(len(plans[n].steps))]
        for n in counts
    }
    best = {n: [float("inf")] * len(plans[n].steps) for n in counts}
    whole = {n: float("inf") for n in counts}
    for r in range(opts.rounds):
        for n in counts if r % 2 == 0 else counts[::-1]:
            gomp.omp_set_num_threads(n)
            for i, run in enumerate(timers[n]):
                best[n][i] = min(best[n][i], run(number))
            whole[n] = min(whole[n], fastest_call_s(with_threads(natives[n].call, n), 50))
    one, many = best[1], best[counts[1]]
    cold = f", after a {opts.flush_mb} MB flush" if flush is not None else ""
    print(f"{opts.model}: each kernel's fastest repeat{cold}, 1 thread vs {opts.threads} (us)")
    print(
        f"  {'kernel':<18} {'role':<7} {'1t':>8} {f'{opts.threads}t':>8} {'scaling':>8} {'lost':>8}  parallel"
    )
    lost = [(many[i] - one[i] / opts.threads, i) for i in range(len(one))]
    for waste, i in sorted(lost, reverse=True)[: opts.top]:
        step = plans[counts[1]].steps[i]
        choice = step.config.get("parallel", "") if step.config is not None else ""
        print(
            f"  {step.kernel.symbol:<18} {step.role:<7} {one[i] * 1e6:8.1f} {many[i] * 1e6:8.1f} "
            f"{one[i] / many[i]:8.2f} {waste * 1e6:8.1f}  {choice}"
        )
    fields = {
        "model": opts.model,
        "threads": str(opts.threads),
        "kernels_1t_ms": f"{sum(one) * 1e3:.3f}",
        "kernels_nt_ms": f"{sum(many) * 1e3:.3f}",
        "model_1t_ms": f"{whole[1] * 1e3:.3f}",
        "model_nt_ms": f"{whole[counts[1]] * 1e3:.3f}",
        "kernel_scaling": f"{sum(one) / sum(many):.2f}",
        "model_scaling": f"{whole[1] / whole[counts[1]]:.2f}",
    }
    print("\ncores_kernels: " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()

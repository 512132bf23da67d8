"""All the cores: generated kernels at one thread and at every core of this machine.

Blur (examples/blur.py, Halide's two-stage 3x3 box blur, float32): milliseconds per megapixel of
the clean schedule (defaults: blur_x computed whole, row-major loops), the tuned schedule
(parallel rows, vector columns of blur_y with their blur_x in registers, streamed stores) on 1
thread and on all cores, and a plain C loop built with gcc -O3 -march=native; all checked against
numpy first, all reading and writing 64-byte aligned buffers. For context, the clean schedule is
also built without gcc's auto-vectorizer (`-fno-tree-vectorize`): the Halide paper's clean C++
(9.94 ms/MP against 0.90 for its schedule, 11x) was scalar code, while gcc -O3 vectorizes the
clean schedule's plain loops by itself. And a copy of the blur's bytes (`copy_schedule`: the
input read once, the output written once, nothing computed) on all cores is the floor the
memory system sets: on all cores the tuned blur runs about as fast as it.

OpenMP's threads are bound one to a core (OMP_PROC_BIND=true, OMP_PLACES=cores, unless set):
unbound, the worker thread at times shared the main thread's core. Every variant is called from
Python through ctypes (about a microsecond a call, against milliseconds of work), each call
timed, in interleaved rounds (the order reversed every other round); a round's figure is its
median call (`examples.blur.median_call_s`: on this shared machine another process now and then
preempts one thread of a parallel call for a scheduler quantum, which a mean would carry). A
speed-up is the median over rounds of the ratio within a round (clean / tuned), so a slow round
slows both sides of its ratio alike.

sgemm (template `dense`, 1024 and 2048 cube) against numpy's matmul and whole models (ResNet-18,
MobileNetV2, BERT-tiny from `compiler/zoo.py`) against onnxruntime, each at 1 thread and at all
cores, the peer given the same thread count (OpenBLAS threads, onnxruntime's intra-op threads):
each thread count of sgemm and the model section run in a child process
(`benchmarks/cores_child.py`, which says how configs are picked), since OpenBLAS and libgomp
read their thread settings once. Models use the tuned configs of `--records` where it has them
for a thread count (`configs_from_records`; the line says how many tasks were tuned), else
the defaults, which on several threads run their outermost output loops in parallel; sgemm
adds the best dense config of `--records` tuned on the same thread count to its candidates.

    python benchmarks/cores.py [--sizes 2048x2048,1920x1080] [--rounds 7] [--threads N]
        [--sgemm 1024,2048] [--models resnet18,mobilenet_v2,bert_tiny] [--records R.jsonl]

Ends with one line (wrapped here):

    cores: threads=<n> sgemm_ratio=<x> resnet18_ratio=<x> mobilenetv2_ratio=<x>
        bert_tiny_ratio=<x> scaling_resnet18=<x> blur_speedup=<x> blur_scaling=<x>
        blur_vs_plain_c=<x> blur_vs_scalar_clean=<x> blur_vs_copy=<x> blur_copy_scaling=<x>
        blur_speedup_full_cores=<x> blur_full_core_rounds=<k>/<rounds> blur_speedup_1920x1080=<x>

where the blur_ fields are of the first size and blur_speedup_WxH of each other one.
blur_speedup: clean / tuned on all cores; blur_scaling: tuned on 1 thread / tuned on all cores;
blur_vs_plain_c: plain C / tuned on all cores; blur_vs_scalar_clean: the clean schedule without
auto-vectorization / tuned on all cores (the paper's kind of comparison); blur_vs_copy: the copy
/ tuned on all cores (1 would be the floor); blur_copy_scaling: the copy on one thread / on
all cores, and blur_speedup_full_cores the speed-up over only the rounds whose copy scaled by at
least 0.75 x the core count (blur_full_core_rounds of them; nan if none): this VM's two vCPUs at
times move no more bytes together than one does alone. sgemm_ratio: numpy
time / ours on all cores, the worst over the sizes (sgemm_ratio_1t on one thread); <model>_ratio:
onnxruntime time / ours on all cores (<model>_ratio_1t on one); scaling_resnet18: ResNet-18 on
one thread / on all cores (ort_scaling_resnet18 the same for onnxruntime). Each ratio is the
median over rounds of the ratio within a round.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from math import nan
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from compiler import te
from compiler.codegen.vector import NONTEMPORAL
from compiler.schedule import Schedule, create_schedule
from compiler.toolchain import host_target
from examples.blur import (
    THIRD,
    aligned_zeros,
    available_cores,
    blur_calls,
    clean_schedule,
    config_for,
    interleaved_medians,
    kiln_call,
    ms_per_megapixel,
    pin_openmp_threads,
    random_image,
    with_threads,
)

MIN_ROUND_S = 0.25
# A round "had all its cores" when the copy on N threads moved at least FULL x N times the bytes
# per second of the copy on one: on this VM the two vCPUs at times give one core's worth of
# memory throughput between them for seconds (copy scaling 1.1 instead of 2.0), which halves
# every all-core memory-bound figure while the one-thread clean schedule is untouched.
FULL = 0.75


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of num / den within each round."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def copy_schedule(h: int, w: int) -> tuple[Schedule, list[te.Tensor]]:
    """The blur's bytes without its arithmetic, out = image[1:-1, 1:-1] / 3, with the tuned
    blur's parallel rows, vectors and kind of store (`config_for`): a floor no schedule of the
    blur beats."""
    image = te.placeholder((h + 2, w + 2), name="image")
    out = te.compute((h, w), lambda y, x: image[y + 1, x + 1] * THIRD, name="out")
    s = create_schedule(out)
    cfg = config_for(h, w)
    yo, _yi = s[out].split(out.op.axis[0], cfg.rows)
    _xo, xi = s[out].split(out.op.axis[1], cfg.lanes)
    s[out].vectorize(xi)
    if cfg.nontemporal:
        s[out].pragma(xi, NONTEMPORAL)
    s[out].parallel(yo)
    return s, [image, out]


def blur_section(h: int, w: int, rounds: int, threads: int) -> dict[str, float]:
    """Time the blur variants on an `h` x `w` image and print their table; the ratios."""
    image = random_image(h, w)
    calls = blur_calls(h, w, threads, image)
    scalar = dataclasses.replace(host_target(), flags=(*host_target().flags, "-fno-tree-vectorize"))
    out = aligned_zeros((h, w))
    calls["clean, not vectorized"] = kiln_call(
        *clean_schedule(h, w), image, out, "blur_clean_scalar", scalar
    )
    copy = kiln_call(*copy_schedule(h, w), image, aligned_zeros((h, w)), "blur_copy")
    calls["copy, 1 thread"] = with_threads(copy, 1)
    calls[f"copy, {threads} threads"] = with_threads(copy, threads)
    times = interleaved_medians(list(calls.items()), rounds, MIN_ROUND_S)
    clean = times["clean"]
    tuned_1, tuned_n = times["tuned, 1 thread"], times[f"tuned, {threads} threads"]
    print(f"\nblur {w} x {h} float32 ({h * w / 1e6:.2f} MP), {rounds} interleaved rounds")
    print(f"tuned: {config_for(h, w)}")
    print(f"{'variant':<24} {'ms/MP':>8} {'best round':>11} {'clean / it':>11}")
    for label, samples in times.items():
        med, best = statistics.median(samples), min(samples)
        print(
            f"{label:<24} {ms_per_megapixel(med, h, w):>8.3f} "
            f"{ms_per_megapixel(best, h, w):>11.3f} {_ratio(clean, samples):>10.2f}x"
        )
    copy_1, copy_n = times["copy, 1 thread"], times[f"copy, {threads} threads"]
    full = [
        i for i, (a, b) in enumerate(zip(copy_1, copy_n, strict=True)) if a / b >= FULL * threads
    ]
    full_speedup = _ratio([clean[i] for i in full], [tuned_n[i] for i in full]) if full else nan
    print(
        f"copy scaling {_ratio(copy_1, copy_n):.2f} (1 thread / {threads}); rounds where the "
        f"cores moved at least {FULL:.0%} of {threads}x one core's bytes: {len(full)} of "
        f"{rounds}, clean / tuned over them {full_speedup:.2f}x"
    )
    return {
        "speedup": _ratio(clean, tuned_n),
        "scaling": _ratio(tuned_1, tuned_n),
        "vs_plain_c": _ratio(times["plain C -O3"], tuned_n),
        "vs_scalar_clean": _ratio(times["clean, not vectorized"], tuned_n),
        "vs_copy": _ratio(copy_n, tuned_n),
        "copy_scaling": _ratio(copy_1, copy_n),
        "speedup_full_cores": full_speedup,
        "full_core_rounds": float(len(full)),
    }


CHILD = Path(__file__).resolve().parent / "cores_child.py"
FIELD_NAMES = {"resnet18": "resnet18", "mobilenet_v2": "mobilenetv2", "bert_tiny": "bert_tiny"}


def _child(*argv: object) -> dict:
    """Run `cores_child.py` with `argv`; its last line, as JSON."""
    done = subprocess.run(
        [sys.executable, str(CHILD), *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cores_child {argv} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def sgemm_section(
    sizes: Sequence[int], threads: int, rounds: int, records: str | None = None
) -> dict[str, float]:
    """sgemm at 1 thread and `threads` against numpy on as many; the worst ratio of each."""
    print(f"\nsgemm vs numpy (OpenBLAS on as many threads), {rounds} interleaved rounds")
    print(
        f"{'size':>6} {'threads':>7} {'ours ms':>8} {'numpy ms':>9} {'GFLOP/s':>8} {'ratio':>6}  config"
    )
    worst: dict[int, float] = {}
    counts = tuple(dict.fromkeys((1, threads)))
    for n in sizes:
        for count in counts:
            r = _child("sgemm", n, count, rounds, MIN_ROUND_S, *([records] if records else []))
            gflops = 2 * n**3 / r["ours_s"] / 1e9
            print(
                f"{n:>6} {count:>7} {r['ours_s'] * 1e3:>8.2f} {r['numpy_s'] * 1e3:>9.2f} "
                f"{gflops:>8.1f} {r['ratio']:>5.2f}x  {r['config']} ({r['source']})",
                flush=True,
            )
            worst[count] = min(worst.get(count, float("inf")), r["ratio"])
    return {"sgemm_ratio": worst[threads], "sgemm_ratio_1t": worst[1]}


def models_section(
    names: Sequence[str], threads: int, rounds: int, records: str | None
) -> dict[str, float]:
    """The models at 1 thread and `threads` against onnxruntime on as many."""
    print(f"\nmodels vs onnxruntime (same intra-op threads), {rounds} interleaved rounds")
    argv: list[object] = ["models", threads, ",".join(names), rounds, MIN_ROUND_S]
    result = _child(*argv, *([records] if records else []))
    print(f"{'model':<13} {'threads':>7} {'ours ms':>8} {'ort ms':>8} {'ratio':>6}  tuned tasks")
    fields: dict[str, float] = {}
    for name in names:
        r = result[name]
        for count in dict.fromkeys((1, threads)):
            ours, ort = r["median_s"][f"ours{count}"], r["median_s"][f"ort{count}"]
            ratio = r["ratio"][str(count)]
            print(
                f"{name:<13} {count:>7} {ours * 1e3:>8.2f} {ort * 1e3:>8.2f} {ratio:>5.2f}x  "
                f"{r['tuned_tasks'][str(count)]}"
            )
        field = FIELD_NAMES.get(name, name)
        fields[f"{field}_ratio"] = r["ratio"][str(threads)]
        fields[f"{field}_ratio_1t"] = r["ratio"]["1"]
        fields[f"scaling_{field}"] = r["scaling"]
        fields[f"ort_scaling_{field}"] = r["ort_scaling"]
        print(f"{name}: scaling ours {r['scaling']:.2f}, onnxruntime {r['ort_scaling']:.2f}")
    return fields


def _size(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    return int(height), int(width)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes",
        default="2048x2048,1920x1080",
        help="blur images, WIDTHxHEIGHT, comma-separated ('' skips); the first gives the blur_ fields",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--threads", type=int, default=available_cores(), help="all cores (default: every core)"
    )
    parser.add_argument("--sgemm", default="1024,2048", help="sgemm cube sizes ('' skips)")
    parser.add_argument(
        "--models", default="resnet18,mobilenet_v2,bert_tiny", help="models ('' skips)"
    )
    parser.add_argument(
        "--records", default=None, help="records of tuned configs for the models and sgemm"
    )
    opts = parser.parse_args(argv)
    pin_openmp_threads()  # before any kernel loads libgomp
    print(f"machine: {_cpu_model()}, {available_cores()} cores usable; all cores = {opts.threads}")
    fields = {"threads": str(opts.threads)}
    timed: dict[str, float] = {}
    sizes = [int(n) for n in opts.sgemm.split(",") if n]
    if sizes:
        timed.update(sgemm_section(sizes, opts.threads, opts.rounds, opts.records))
    names = [n for n in opts.models.split(",") if n]
    if names:
        timed.update(models_section(names, opts.threads, opts.rounds, opts.records))
    first = ("sgemm_ratio", *(f"{FIELD_NAMES.get(n, n)}_ratio" for n in names))
    for key in (*first, *(k for k in timed if k.startswith("scaling_"))):
        if key in timed:
            fields[key] = f"{timed[key]:.2f}"
    for i, (h, w) in enumerate(_size(t) for t in opts.sizes.split(",") if t):
        ratios = blur_section(h, w, opts.rounds, opts.threads)
        if i == 0:
            rounds_full = int(ratios.pop("full_core_rounds"))
            fields.update({f"blur_{k}": f"{v:.2f}" for k, v in ratios.items()})
            fields["blur_full_core_rounds"] = f"{rounds_full}/{opts.rounds}"
        else:
            fields[f"blur_speedup_{w}x{h}"] = f"{ratios['speedup']:.2f}"
    fields.update({k: f"{v:.2f}" for k, v in timed.items() if k not in fields})
    print("\ncores: " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()

"""Generated CUDA kernels against the vendor library on one NVIDIA GPU, interleaved in one run.

    python benchmarks/cuda.py                       # every section, 75 s each (~5.5 min)
    python benchmarks/cuda.py --quick               # 1024 / 2048 only, 5 layers, 16 configs
    python benchmarks/cuda.py --sections gemm,fp16 --budget-s 120 --trials 96
    python benchmarks/cuda.py --budget-s 90 --total-s 330   # sections share at most 330 s
    python benchmarks/cuda.py --dry-run [--arch sm_90]   # no GPU: build every section's candidates
    bash scripts/gpu_check.sh                       # a lent GPU's one call: GPU tests, this, the
                                                    # agent flow (see that script)

Sections, in this order, each in a child process of its own with `--budget-s` seconds (a
kernel that faults poisons its CUDA context for the life of the process, and a child that runs
past its budget is killed: either way the next section still runs). When a candidate loses
the context (a sticky CUDA error), the section runs again without it, up to 3 times within its
budget, keeping the workloads it had finished; the candidate is named in the output:

- `gemm`: FP32 `cuda_dense` (Y = X . W^T) at 1024/2048/4096 against cuBLAS's sgemm on the same
  buffers (`Cublas.sgemm_nt`, default math mode: true FP32, no TF32).
- `fp16`: `cuda_dense_fp16_tc` (WMMA, fp16 in, fp32 sums) at 2048/4096 against cuBLAS's
  cublasGemmEx with fp16 inputs, fp32 output and CUBLAS_COMPUTE_32F (tensor cores).
- `conv`: ResNet-18's 11 distinct convolutions (batch 1, 224x224, no epilogue), the better of
  `cuda_conv2d` (direct) and `cuda_conv2d_gemm` (implicit GEMM), against cuDNN where the
  machine has it (`cuda_cudnn.py`: FP32, FMA math so no TF32, cuDNN's fastest algorithm by its
  own search); first a child of its own (`cudnn check`) loads it and runs layers against numpy,
  since a wrong ctypes call crashes a process. Without cuDNN (or `--no-cudnn`), and beside it
  in the table, the peer is **im2col + cuBLAS sgemm**: an im2col kernel of ours (generated)
  writes the [C*KH*KW][OH*OW] matrix, then sgemm multiplies the OIHW weight by it (both
  launches timed); the table and the `cuda: conv peer:` line say which peer the ratio is of.
- `models`: ResNet-18 and BERT-tiny end to end through `compiler.graph.build_model_cuda` (else
  "not built yet", and nan), run and timed by the `cuda` backend in-process (the agent's own
  code, CUDA events, `--rounds` repeats of at least 20 ms), outputs checked against the
  graph's numpy reference; the conv section's best configs are used where a task has the same
  template and geometry, the template's first config worth measuring elsewhere.

Search: not the tuner. A local pool (tracker + `kiln-agent --backend cuda`) costs a build, an
upload and an agent round trip per candidate, and the lent GPU is there for 15 minutes all told
(`scripts/gpu_check.sh` runs that flow separately, 8 trials). So each workload measures
in-process, through the driver: a seeded sample of `--trials` configs of the template's space
(for the conv section half as many, split over its two templates): presets first (register
tilings like the fastest SIMT GEMMs'; the tensor-core template's BENCHMARK_CONFIGS), then the
default config, then seeded draws among `worth_measuring` configs (for the FP32 GEMM, blocks of
64x64 outputs or more, 64-256 threads, 16-64 accumulators first). Every workload's builds start
at once in a process pool (nvcc, several kernels a translation unit, `compiler.build_cuda`);
each kernel is launched as its unit arrives, on NaN-filled output, checked against the peer's
output (for the convolutions im2col+sgemm's: cuDNN may pick Winograd or FFT, less exact; every
peer is itself checked against numpy first) and timed with CUDA events (about `--repeat-ms` of GPU time); then a quarter more
configs, each one of the best three with one knob changed. The best config and the peer then
alternate for `--rounds` rounds; tables show medians, ratio = peer time / ours (> 1: ours is
faster). Kernels are launched from Python (ctypes): for the smallest convolutions the GPU may
wait on the launches, ours and the peer's alike.

Ends with: cuda: gemm_min_ratio=<x> fp16_gemm_ratio=<x> conv_geomean_ratio=<x>
conv_vs_best_peer=<x> resnet18_ms=<ms> bert_tiny_ms=<ms> device=<name> (nan where a section
could not run; fp16 is the smallest ratio over its sizes; conv_vs_best_peer is the geomean
against the faster of cuDNN and im2col+sgemm per layer, nan without cuDNN). Without a GPU (or
nvcc) it says why and exits 2, unless `--dry-run`, which builds each section's sampled
candidates for `--arch` and measures nothing.
Targets (issue 26): gemm >= 0.9, fp16 >= 0.7, conv geomean >= 0.8.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.cuda_search import (
    Budget,
    SearchOptions,
    conv_layers,
    run_section,
)

SECTIONS = ("gemm", "fp16", "conv", "models")
RESULT_MARK = "RESULT "
NO_GPU_EXIT = 2
# A child's grace past its budget: process start, CUDA context, cuBLAS handle, the last rounds.
GRACE_S = 30.0
CHILD_OVERHEAD_S = 8.0  # a child's start, GPU context and cuBLAS handle, beside its budget
MIN_SECTION_S = 10.0
MAX_RESTARTS = 3  # runs of a section again after a candidate lost the GPU context
CUDNN_PROBE_S = 25.0  # cuDNN's check before the conv section: load, 11 layers once vs numpy


def gpu_name() -> str | None:
    """The first GPU's name, or None (with the reason on stderr) without a GPU or driver."""
    from device_agent.backends.cuda_driver import CudaError, RealDriver

    try:
        driver = RealDriver()
        driver.init()
        if driver.device_count() < 1:
            raise CudaError("cuDeviceGetCount", detail="no CUDA device")
        return driver.device_info(0).name
    except CudaError as e:
        print(f"cuda: no GPU here ({e}); nothing measured", file=sys.stderr)
        return None


def _relay(proc: subprocess.Popen[str], lines: list[str], prefix: str) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        print(f"{prefix}{line}", end="", flush=True)


_CHILDREN: set[int] = set()  # process groups of the running section children


def _end_children(signum: int, _frame: object) -> None:
    """On SIGTERM (a `timeout` around this script): end the section child's group too, which
    `timeout` does not reach (it is a group of its own), then exit."""
    for pgid in list(_CHILDREN):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def run_child(
    section: str, argv: list[str], budget_s: float, kill_after_s: float
) -> dict[str, object]:
    """Run one section in a child process, its output relayed as it comes; its RESULT, or
    {"error": ...} when it failed, ran past its budget or printed none."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--section", section, *argv]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        process_group=0,  # its build workers and nvcc runs end with it (killpg)
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    _CHILDREN.add(proc.pid)
    lines: list[str] = []
    reader = threading.Thread(target=_relay, args=(proc, lines, f"[{section}] "), daemon=True)
    reader.start()
    try:
        proc.wait(kill_after_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(5.0)
        return {
            "error": f"killed after {time.monotonic() - started:.0f} s (budget {budget_s:.0f} s)"
        }
    finally:
        _CHILDREN.discard(proc.pid)
    reader.join(5.0)
    for line in reversed(lines):
        if line.startswith(RESULT_MARK):
            result: dict[str, object] = json.loads(line[len(RESULT_MARK) :])
            return result
    return {"error": f"exit {proc.returncode} without a result"}


def run_with_restarts(
    section: str, argv: list[str], budget_s: float, end: float, state_file: Path
) -> dict[str, object]:
    """`run_child`, and again (MAX_RESTARTS times at most, within the section's budget) when a
    candidate lost the GPU context: without that candidate, keeping the workloads finished
    (the child keeps their rows in `state_file`)."""
    section_end = time.monotonic() + budget_s
    excluded: list[str] = []
    while True:
        budget = section_end - time.monotonic()
        extra = [f"--state-file={state_file}"]
        if excluded:
            extra.append(f"--exclude={','.join(excluded)}")
        run_argv = [a for a in argv if not a.startswith("--budget-s=")]
        run_argv += [f"--budget-s={budget:.1f}", *extra]
        kill_after = min(budget + GRACE_S, end - time.monotonic())
        result = run_child(section, run_argv, budget, kill_after)
        faulted = result.get("faulted")
        left = section_end - time.monotonic()
        if not isinstance(faulted, str) or len(excluded) >= MAX_RESTARTS or left < MIN_SECTION_S:
            if excluded:
                result["restarted_without"] = excluded
            return result
        excluded.append(faulted)
        print(f"== {section}: {faulted} lost the GPU context; again without it ({left:.0f} s left)")


def _fmt(value: object, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "nan"


def summary_line(results: dict[str, dict[str, object]], device: str) -> str:
    def get(section: str, key: str) -> object:
        return results.get(section, {}).get(key)

    return (
        f"cuda: gemm_min_ratio={_fmt(get('gemm', 'min_ratio'))} "
        f"fp16_gemm_ratio={_fmt(get('fp16', 'min_ratio'))} "
        f"conv_geomean_ratio={_fmt(get('conv', 'geomean_ratio'))} "
        f"conv_vs_best_peer={_fmt(get('conv', 'best_peer_geomean_ratio'))} "
        f"resnet18_ms={_fmt(get('models', 'resnet18_ms'), 3)} "
        f"bert_tiny_ms={_fmt(get('models', 'bert_tiny_ms'), 3)} "
        f"device={device.replace(' ', '_')}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").partition("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, in order")
    ap.add_argument("--budget-s", type=float, default=75.0, help="seconds per section")
    ap.add_argument(
        "--total-s", type=float, default=0.0, help="seconds for all sections (0: no cap)"
    )
    ap.add_argument("--trials", type=int, default=64, help="sampled configs per workload")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds, ours vs peer")
    ap.add_argument("--repeat-ms", type=float, default=3.0, help="GPU time of one timing")
    ap.add_argument("--sizes", default="1024,2048,4096", help="FP32 GEMM sizes")
    ap.add_argument("--fp16-sizes", default="2048,4096", help="FP16 GEMM sizes")
    ap.add_argument("--layers", type=int, default=len(conv_layers()), help="first N conv layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="1024 / 2048 only, 5 layers, 16 trials")
    ap.add_argument("--dry-run", action="store_true", help="build candidates only (no GPU)")
    ap.add_argument("--arch", default=None, help="nvcc arch (default: the GPU's; sm_90 dry)")
    ap.add_argument("--section", default=None, help=argparse.SUPPRESS)  # a child's one section
    ap.add_argument("--best-file", default=None, help=argparse.SUPPRESS)  # conv -> models
    ap.add_argument("--conv-peer", default="im2col", help=argparse.SUPPRESS)  # parent -> conv
    ap.add_argument("--exclude", default="", help=argparse.SUPPRESS)  # parent -> a restart
    ap.add_argument("--state-file", default=None, help=argparse.SUPPRESS)  # kept over restarts
    ap.add_argument("--no-cudnn", action="store_true", help="conv peer: im2col+sgemm only")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.fp16_sizes = "1024", "2048"
        args.layers = min(args.layers, 5)
        args.trials = min(args.trials, 16)
        args.rounds = min(args.rounds, 3)
    return args


def child_argv(args: argparse.Namespace, arch: str, best_file: Path, budget_s: float) -> list[str]:
    """The options a section's child runs with (the parent's, with arch and budget settled)."""
    out = [
        f"--budget-s={budget_s:.1f}",
        f"--trials={args.trials}",
        f"--rounds={args.rounds}",
        f"--repeat-ms={args.repeat_ms}",
        f"--sizes={args.sizes}",
        f"--fp16-sizes={args.fp16_sizes}",
        f"--layers={args.layers}",
        f"--seed={args.seed}",
        f"--arch={arch}",
        f"--best-file={best_file}",
    ]
    return [*out, "--dry-run"] if args.dry_run else out


def options_of(args: argparse.Namespace) -> SearchOptions:
    return SearchOptions(
        arch=args.arch,
        trials=args.trials,
        rounds=args.rounds,
        repeat_ms=args.repeat_ms,
        seed=args.seed,
        gemm_sizes=tuple(int(s) for s in args.sizes.split(",") if s),
        fp16_sizes=tuple(int(s) for s in args.fp16_sizes.split(",") if s),
        layers=args.layers,
        dry_run=args.dry_run,
        best_file=Path(args.best_file) if args.best_file else None,
        conv_peer=args.conv_peer,
        exclude=frozenset(x for x in args.exclude.split(",") if x),
        state_file=Path(args.state_file) if args.state_file else None,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.section is not None:  # a child: one section, its RESULT last
        result = run_section(args.section, options_of(args), Budget(args.budget_s))
        print(RESULT_MARK + json.dumps(result), flush=True)
        return 0 if "error" not in result else 1
    from compiler.toolchain import find_nvcc

    sections = [s for s in args.sections.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        print(f"cuda: unknown sections {unknown}; they are {list(SECTIONS)}", file=sys.stderr)
        return NO_GPU_EXIT
    if find_nvcc() is None:
        print("cuda: nvcc is not installed; nothing built or measured", file=sys.stderr)
        return NO_GPU_EXIT
    if args.dry_run:
        device, arch = "none_(dry_run)", args.arch or "sm_90"
        print(f"cuda: dry run: building each section's candidates for {arch}, measuring none")
    else:
        name = gpu_name()
        if name is None:
            return NO_GPU_EXIT
        from device_agent.backends.cuda_driver import RealDriver

        driver = RealDriver()
        driver.init()
        sm = driver.device_info(0).sm
        device, arch = name, args.arch or f"sm_{sm}"
        print(f"cuda: device {name} ({arch}); sections {sections}, {args.budget_s:.0f} s each")
    signal.signal(signal.SIGTERM, _end_children)
    results: dict[str, dict[str, object]] = {}
    started = time.monotonic()
    workdir = tempfile.TemporaryDirectory(prefix="kiln-cuda-bench-")
    best_file = Path(workdir.name) / "best.jsonl"
    state_file = Path(workdir.name) / "state.jsonl"
    end = started + args.total_s if args.total_s else math.inf
    for i, section in enumerate(sections):
        t0 = time.monotonic()
        # with --total-s, each section gets at most an equal share of what is left (less each
        # child's start-up), and its kill time stays inside the total
        share = (end - t0) / (len(sections) - i) - CHILD_OVERHEAD_S
        budget = min(args.budget_s, share)
        if budget < MIN_SECTION_S:
            results[section] = {"error": f"no time left ({max(0.0, end - t0):.0f} s)"}
            print(f"\n== {section}: skipped, no time left", flush=True)
            continue
        argv = child_argv(args, arch, best_file, budget)
        if section == "conv" and not args.dry_run and not args.no_cudnn:
            # cuDNN is the peer only once a child of its own ran it right (ctypes, untried)
            probe_s = min(CUDNN_PROBE_S, budget / 3)
            print(f"\n== cudnn check (budget {probe_s:.0f} s)", flush=True)
            probe_argv = child_argv(args, arch, best_file, probe_s)
            probe = run_child("cudnn", probe_argv, probe_s, min(probe_s + GRACE_S, end - t0))
            results["cudnn"] = probe
            ok = probe.get("ok") is True
            print(f"== cudnn: {'ok, the conv peer' if ok else probe.get('error')}", flush=True)
            if ok:
                argv.append("--conv-peer=cudnn")
            budget = min(budget, share - (time.monotonic() - t0))
            argv = [
                a if not a.startswith("--budget-s=") else f"--budget-s={budget:.1f}" for a in argv
            ]
        print(f"\n== {section} (budget {budget:.0f} s)", flush=True)
        results[section] = run_with_restarts(section, argv, budget, end, state_file)
        note = results[section].get("error") or results[section].get("note") or "ok"
        print(f"== {section}: {note} ({time.monotonic() - t0:.0f} s)", flush=True)
    print(f"\ncuda: {len(sections)} sections in {time.monotonic() - started:.0f} s")
    failed = [s for s in sections if "error" in results[s]]
    if failed:
        print(f"cuda: sections without a result: {failed}")
    if results.get("conv", {}).get("peer"):
        print(f"cuda: conv peer: {results['conv']['peer']}")
    print(summary_line(results, device), flush=True)
    workdir.cleanup()
    return 1 if failed and len(failed) == len(sections) else 0


if __name__ == "__main__":
    sys.exit(main())

"""MetaSchedule (TVM 0.27) tuning an fp32 matmul: the peer of `benchmarks/tuning.py`.

Runs in the TVM virtualenv, never in ours, and imports nothing of ours:

    /tmp/tvmvenv/bin/python benchmarks/metaschedule_peer.py --m 1024 --n 1024 --k 1024 \
        --trials 200 --threads 1 --work-dir DIR

It tunes `C[i, j] = sum_k A[i, k] * B[k, j]` (fp32, row-major A[M, K] and B[K, N]) with
`ms.tune_tir` for the llvm target of this CPU with `num-cores` = `--threads`, then builds the best
schedule from the database and re-times it in this process: MetaSchedule's own record of the best
is the minimum of many noisy single measurements and overstates the kernel. The last line of
stdout is one JSON object:

    {"trials": <measured>, "wall_s": <tuning wall s>, "best_s": <s per call, re-timed>,
     "gflops": <2*M*N*K/best_s/1e9>, "tvm": "<version>", ...}

Stock apache-tvm 0.27.0.post1 from PyPI needs, on this machine (the script checks 1 and 2 and
exits 2 naming the pip command; 3 it does itself):

1. apache-tvm-ffi 0.1.14.post1: 0.1.15.post2 segfaults in `tvm::ffi::ToJSONGraph` as soon as a
   MetaSchedule TuneContext is built.
2. xgboost (`xgboost-cpu`) for the default cost model; apache-tvm does not depend on it.
3. A build function without `import tvm.s_tir.tensor_intrin` (`_build_without_intrinsics`): the
   stock builder does that 30-45 s import in every fresh worker inside its 30 s per-build timeout,
   so every candidate timed out. One builder worker, 120 s timeouts.

On failure the script exits non-zero with the cause on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _set_threads(threads: int) -> None:
    """Pin TVM's and BLAS's thread pools before tvm/numpy load."""
    os.environ["TVM_NUM_THREADS"] = str(threads)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def _host_mcpu() -> str:
    """LLVM's name for this CPU.

    Under KVM this Xeon reports model 167, which LLVM's host detection names `rocketlake`; its
    flags (AMX, AVX512-FP16) are those of Sapphire Rapids, the target the reference figures used.
    """
    import tvm  # type: ignore[import-not-found]

    flags: set[str] = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if {"amx_tile", "avx512_fp16"} <= flags:
        return "sapphirerapids"
    try:
        name = str(tvm.get_global_func("target.llvm_get_system_cpu")())
        if name and name != "generic":
            return name
    except Exception:
        pass
    return "x86-64-v4" if "avx512f" in flags else "x86-64-v3"


def _check_environment() -> str | None:
    """The reason this TVM install cannot tune, or None when it can."""
    from importlib import metadata

    try:
        ffi = metadata.version("apache-tvm-ffi")
    except metadata.PackageNotFoundError:
        return "apache-tvm-ffi is not installed"
    if ffi.startswith("0.1.15"):
        return (
            f"apache-tvm-ffi {ffi} segfaults in tvm::ffi::ToJSONGraph when MetaSchedule creates a "
            f"tuning context; install the working one: {sys.executable} -m pip install "
            f"'apache-tvm-ffi==0.1.14.post1'"
        )
    try:
        import xgboost  # noqa: F401
    except ImportError:
        return (
            f"MetaSchedule's cost model needs xgboost: {sys.executable} -m pip install xgboost-cpu"
        )
    return None


def _matmul(m: int, n: int, k: int):
    """The fp32 matmul as a TIR PrimFunc named `main`."""
    from tvm import te

    a = te.placeholder((m, k), "float32", name="A")
    b = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c]).with_attr("global_symbol", "main")


def _build_without_intrinsics(mod, target, _params):
    """MetaSchedule's `default_build` without its `import tvm.s_tir.tensor_intrin`.

    That import parses hundreds of TVMScript tensor intrinsics and takes 30-45 s on this machine;
    the stock builder does it in every fresh worker (a new pool per batch), inside the per-build
    timeout, so with the default 30 s every candidate timed out. A scheduled module needs no
    registered intrinsics to compile (tensorize has already inlined them, and fp32 matmul has none).
    Runs in the builder's worker process (pickled by value with cloudpickle).
    """
    from tvm.driver import build as tvm_build  # type: ignore[import-not-found]
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # type: ignore[import-not-found]

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def _time_call(f, args, number: int, repeat: int) -> float:
    """Median seconds per call over `repeat` rounds of `number` calls (after one warm-up)."""
    f(*args)
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            f(*args)
        rounds.append((time.perf_counter() - t0) / number)
    rounds.sort()
    return rounds[len(rounds) // 2]


def main(argv: list[str] | None = None) -> int:
    """Tune, re-time, print the JSON line; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, default=1024)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--trials", type=int, default=64, help="max_trials_global")
    p.add_argument("--threads", type=int, default=1, help="num-cores of the target")
    p.add_argument("--work-dir", required=True)
    p.add_argument("--per-iter", type=int, default=64, help="num_trials_per_iter")
    p.add_argument("--build-workers", type=int, default=1, help="builder processes")
    p.add_argument("--build-timeout", type=float, default=120.0, help="s per candidate build")
    p.add_argument("--run-timeout", type=float, default=120.0, help="s per candidate run")
    p.add_argument("--tuning-cores", type=int, default=1, help="threads of the search itself")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mcpu", default="", help="LLVM cpu (default: detected)")
    args = p.parse_args(argv)
    if min(args.m, args.n, args.k, args.trials, args.threads, args.tuning_cores) < 1:
        p.error("--m, --n, --k, --trials, --threads and --tuning-cores must be positive")

    _set_threads(args.threads)
    problem = _check_environment()
    if problem:
        print(f"metaschedule_peer: {problem}", file=sys.stderr)
        return 2
    import numpy as np
    import tvm
    from tvm.s_tir import meta_schedule as ms  # type: ignore[import-not-found]

    os.makedirs(args.work_dir, exist_ok=True)
    mcpu = args.mcpu or _host_mcpu()
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": args.threads})
    func = _matmul(args.m, args.n, args.k)
    print(f"metaschedule_peer: tvm {tvm.__version__} target {target}", file=sys.stderr)

    # One-time import that TuneContext does anyway (30-45 s here): timed apart from tuning.
    t_setup = time.perf_counter()
    import tvm.s_tir.tensor_intrin  # type: ignore[import-not-found]

    setup_s = time.perf_counter() - t_setup
    builder = ms.builder.LocalBuilder(
        max_workers=args.build_workers,
        timeout_sec=args.build_timeout,
        f_build=_build_without_intrinsics,
    )
    runner = ms.runner.LocalRunner(
        timeout_sec=args.run_timeout,
        evaluator_config=ms.runner.EvaluatorConfig(
            number=3, repeat=1, min_repeat_ms=100, enable_cpu_cache_flush=False
        ),
    )
    t0 = time.perf_counter()
    database = ms.tune_tir(
        mod=func,
        target=target,
        work_dir=args.work_dir,
        max_trials_global=args.trials,
        num_trials_per_iter=min(args.per_iter, args.trials),
        builder=builder,
        runner=runner,
        num_tuning_cores=args.tuning_cores,
        seed=args.seed,
    )
    wall_s = time.perf_counter() - t0

    records = database.get_all_tuning_records()
    measured = [r for r in records if r.run_secs and all(float(s) < 1e9 for s in r.run_secs)]
    if not measured:
        print(
            f"metaschedule_peer: no candidate was measured successfully "
            f"({len(records)} records; see {args.work_dir}/logs)",
            file=sys.stderr,
        )
        return 1
    ms_best_s = min(float(np.mean([float(s) for s in r.run_secs])) for r in measured)

    sch = ms.tir_integration.compile_tir(database, func, target)
    if sch is None:
        print("metaschedule_peer: the database holds no schedule for the workload", file=sys.stderr)
        return 1
    lib = tvm.compile(sch.mod, target=target)
    dev = tvm.cpu(0)
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((args.m, args.k), dtype=np.float32)
    b_np = rng.standard_normal((args.k, args.n), dtype=np.float32)
    a = tvm.runtime.tensor(a_np, dev)
    b = tvm.runtime.tensor(b_np, dev)
    c = tvm.runtime.tensor(np.zeros((args.m, args.n), dtype=np.float32), dev)
    f = lib["main"]
    f(a, b, c)
    ref = a_np.astype(np.float64) @ b_np.astype(np.float64)
    err = float(np.max(np.abs(c.numpy() - ref)) / max(1.0, float(np.max(np.abs(ref)))))
    if err > 1e-4:
        print(f"metaschedule_peer: best kernel is wrong (rel err {err:.3g})", file=sys.stderr)
        return 1
    flop = 2.0 * args.m * args.n * args.k
    number = max(1, int(0.2 / max(ms_best_s, 1e-6)))
    best_s = _time_call(f, (a, b, c), number=number, repeat=7)
    out = {
        "trials": len(measured),
        "records": len(records),
        "wall_s": round(wall_s, 3),
        "setup_s": round(setup_s, 3),
        "best_s": best_s,
        "gflops": round(flop / best_s / 1e9, 3),
        "ms_record_s": ms_best_s,
        "ms_record_gflops": round(flop / ms_best_s / 1e9, 3),
        "tvm": str(tvm.__version__),
        "target": str(target),
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException as exc:
        import traceback

        traceback.print_exc()
        print(f"metaschedule_peer: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)

"""The model-guided tuner against random search, on real measurements from an embedded local pool.

Cases: sgemm 1024 cube (template `dense`) and two ResNet-18 3x3 convolutions (`conv2d_nchwc`, 64
channels at 56x56 and 256 at 14x14). Kernels are single-threaded; the agent's device is pinned to
one core and the builder runs on the other.

Phase 1, the real run: `tune()` with the model-guided searcher tunes sgemm 1024 on the local pool
(tracker and agent processes, leases, uploads, native timing) for `--budget` trials. Its wall time,
the cost model's share of it, and the best kernel re-timed against numpy (1 thread, interleaved,
in this process) are reported.

Phase 2, trials to 95%: for each case and each of `--seeds` seeds, the model-guided searcher and
random search (over the same valid configs) each run `--budget` trials through the same ask/tell
protocol as `tune()`. Each config is measured on the pool once, the first time any run asks for it,
and every later run that asks for it gets that same measurement: the runs differ only in what they
ask, which is what this phase compares, and it keeps the benchmark to minutes. The best known
throughput of a case is the best over every config measured here (the real run's included) and
the config `kernels.py` found (kernels_best.json), measured the same way. A run "reaches 95%" at
the first trial whose best-so-far is within 95% of it; a run that never does counts as budget+1. The final line gives the
worst case's median over seeds, for each searcher.

Phase 3: time to score 10,000 candidates (features and model prediction) with a model fitted on
the sgemm measurements.

Check cost (before phase 1, on the fresh pool): what checking every candidate on the device costs.
`--check-configs` (default: `--budget`) random valid sgemm 1024 configs go through build and measurement twice, in
batches of `--batch`, the two arms interleaved batch by batch (which goes first alternates):
checked (each candidate's reference kernel built beside it, uploaded, run once per layout on the
device, and the candidate's outputs compared with it) and unchecked. Each arm builds into a cache
of its own, so every compile is real. check_overhead = (checked - unchecked) / unchecked, over
build plus measurement time done in turn; a pipelined run hides some of the building, so this is
an upper bound of what it adds to a run's wall time.

With `--exhaustive` every valid config of each case is measured first (sgemm 1024 on AVX2:
1,960 configs, about 15 minutes), so the best known is the true best of the space the searchers
draw from and phase 2 measures nothing; `--table FILE` keeps those measurements, and a later run
with the same file replays any number of seeds in seconds (`--no-real-run` skips phase 1).

    python benchmarks/tuning.py [--seeds 5] [--budget 200] [--batch 8] [--only sgemm,conv]
        [--exhaustive] [--table build/tuning_table.json] [--no-real-run] [--check-configs N]
        [--tvm-python /tmp/tvmvenv/bin/python]   # MetaSchedule, same sgemm and budget (see README)

Ends with:
tuning: trials_to_95_median=<n> random_trials_to_95_median=<n> wall_s_sgemm1024=<s> model_share=<f> score_10k_ms=<ms> check_overhead=<f>
"""

from __future__ import annotations

import os

# One thread for numpy's BLAS (the peer), set before numpy loads its thread pool.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.kernel_search import NativeKernel, build_candidate  # noqa: E402
from compiler.toolchain import host_target_name  # noqa: E402
from tuner import records as rec  # noqa: E402
from tuner.loop import tune  # noqa: E402
from tuner.measure import EvaluatorConfig, MeasureResult, Status  # noqa: E402
from tuner.measure.builder import LocalBuilder  # noqa: E402
from tuner.measure.local_pool import LocalPool  # noqa: E402
from tuner.measure.pool_runner import PoolConfig, PoolRunner  # noqa: E402
from tuner.options import CONFIRM_TOP, TuneOptions  # noqa: E402
from tuner.search import RandomSearch, Searcher  # noqa: E402
from tuner.task import Task  # noqa: E402

BEST_FILE = Path(__file__).resolve().parent / "kernels_best.json"
AGENT_CORE, BUILD_CORE = 1, 0


@dataclass(frozen=True)
class Case:
    label: str
    workload: rec.Workload


CASES = {
    "sgemm": [Case("sgemm 1024", rec.Workload("dense", (1024, 1024, 1024)))],
    "conv": [
        Case("conv3x3 64@56", rec.Workload("conv2d_nchwc", (1, 64, 56, 56, 64, 3, 3, 1, 1, 1))),
        Case("conv3x3 256@14", rec.Workload("conv2d_nchwc", (1, 256, 14, 14, 256, 3, 3, 1, 1, 1))),
    ],
}


def model_searcher(task: Task, seed: int) -> Searcher:
    from tuner.search.xgb import XGBSearcher

    return XGBSearcher(task.space, flop=task.flop, seed=seed, valid=valid_fn(task))


def random_searcher(task: Task, seed: int) -> Searcher:
    return RandomSearch(len(task.space), seed=seed, valid=valid_fn(task))


def valid_fn(task: Task) -> Callable[[int], bool]:
    return lambda i: task.worth_measuring(i, "host")


class Table:
    """Each config of a task measured on the pool once, on first request."""

    def __init__(self, task: Task, builder: LocalBuilder, runner: PoolRunner) -> None:
        self.task, self.builder, self.runner = task, builder, runner
        self.results: dict[int, MeasureResult] = {}
        self.measure_s = 0.0

    def add(self, records: Sequence[rec.Record]) -> None:
        for r in records:
            if r.workload == self.task.workload:
                self.results.setdefault(r.config_index, r.result)

    def measure(self, indices: Sequence[int]) -> list[MeasureResult]:
        missing = [i for i in dict.fromkeys(indices) if i not in self.results]
        if missing:
            started = time.perf_counter()
            built = self.builder.build(self.task.workload, missing)
            arts = [b.artifact for b in built if b.artifact is not None]
            measured = iter(self.runner.run(arts))
            for b in built:
                if b.artifact is None:
                    self.results[b.config_index] = MeasureResult.failed(Status.BUILD_ERROR, b.error)
                else:
                    self.results[b.config_index] = next(measured)
            self.measure_s += time.perf_counter() - started
        return [self.results[i] for i in indices]

    def best_s(self) -> float:
        return min((r.median_s for r in self.results.values()), default=float("inf"))

    def key(self, target: str) -> str:
        w = self.task.workload
        return f"{target}|{w.op}|{','.join(map(str, w.shape))}|{len(self.task.space)}"

    def load(self, cache: dict[str, dict[str, float | None]], target: str) -> int:
        """Take earlier measurements of this case from `cache`; returns how many."""
        for i, s in cache.get(self.key(target), {}).items():
            self.results.setdefault(
                int(i),
                MeasureResult(Status.OK, (s,))
                if s
                else MeasureResult.failed(Status.RUNTIME_ERROR, "failed when cached"),
            )
        return len(cache.get(self.key(target), {}))

    def dump(self, cache: dict[str, dict[str, float | None]], target: str) -> None:
        cache[self.key(target)] = {
            str(i): (r.median_s if r.ok else None) for i, r in sorted(self.results.items())
        }


@dataclass
class Run:
    method: str
    seed: int
    curve: list[float] = field(default_factory=list)  # best-so-far seconds after each trial

    def trials_to(self, target_s: float, budget: int) -> int:
        for i, s in enumerate(self.curve, start=1):
            if s <= target_s:
                return i
        return budget + 1


def simulate(
    table: Table, searcher: Searcher, method: str, seed: int, budget: int, batch: int
) -> Run:
    run = Run(method, seed)
    best = float("inf")
    while len(run.curve) < budget:
        indices = searcher.ask(min(batch, budget - len(run.curve)))
        if not indices:
            break
        results = table.measure(indices)
        searcher.tell(indices, results)
        for r in results:
            best = min(best, r.median_s)
            run.curve.append(best)
    return run


@dataclass
class CheckCost:
    """Seconds each arm of the check A/B spent building and measuring the same configs."""

    build_s: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    run_s: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    configs: int = 0
    wrong: int = 0

    def total(self, checked: bool) -> float:
        return self.build_s[checked] + self.run_s[checked]

    @property
    def overhead(self) -> float:
        return self.total(True) / self.total(False) - 1.0


def check_cost(
    task: Task, target: str, runner: PoolRunner, n: int, batch: int, tmp: str
) -> CheckCost:
    """Build and measure `n` random valid configs of `task` checked and unchecked, the arms
    interleaved batch by batch, each arm with a compile cache of its own (see the docstring)."""
    rng = np.random.default_rng(1)
    valid = valid_fn(task)
    indices: list[int] = []
    for _ in range(100 * n):  # bounded: a space with fewer valid configs gives fewer
        if len(indices) == n:
            break
        i = int(rng.integers(len(task.space)))
        if valid(i) and i not in indices:
            indices.append(i)
    n = len(indices)
    builders = {
        checked: LocalBuilder(
            target=target,
            workers=1,
            per_unit=4,
            cpus=[BUILD_CORE],
            cache_dir=Path(tmp) / f"cache-{'checked' if checked else 'plain'}",
        )
        for checked in (True, False)
    }
    cost = CheckCost(configs=n)
    try:
        for b, start in enumerate(range(0, n, batch)):
            chunk = indices[start : start + batch]
            for checked in (True, False) if b % 2 == 0 else (False, True):
                t0 = time.perf_counter()
                built = builders[checked].build(task.workload, chunk, check=checked)
                t1 = time.perf_counter()
                ok = [x for x in built if x.artifact is not None]
                arts = [x.artifact for x in ok if x.artifact is not None]
                refs = [x.reference for x in ok] if checked else []
                results = runner.run(arts, refs)
                cost.build_s[checked] += t1 - t0
                cost.run_s[checked] += time.perf_counter() - t1
                if checked:
                    cost.wrong += sum(r.status is Status.WRONG_ANSWER for r in results)
    finally:
        for builder in builders.values():
            builder.close()
    return cost


def kernels_best_index(task: Task, target: str) -> int | None:
    if not BEST_FILE.exists():
        return None
    w = task.workload
    entry = json.loads(BEST_FILE.read_text()).get(f"{target}|{w.op}|{','.join(map(str, w.shape))}")
    if entry is None:
        return None
    try:
        return task.space.index_of(entry["knobs"])
    except ValueError:
        return None  # the space changed since kernels.py ran


def versus_numpy(task: Task, index: int, rounds: int, target: str) -> tuple[float, float]:
    """(our GFLOP/s, numpy GFLOP/s), single-threaded, interleaved, medians of `rounds`; ours
    built for `target`, the one the real run measured (a "host" build of the same config, with
    -march=native, ran 4-5% slower than its x86_64-avx512 build on a Xeon)."""
    w = task.workload
    t = task.template
    rng = np.random.default_rng(0)
    logical = t.random_inputs(w.shape, rng)  # type: ignore[attr-defined]
    _, path, error = build_candidate(w.op, w.shape, index, target)
    if error:
        raise RuntimeError(f"best config {index} does not build: {error}")
    kernel = NativeKernel(w.op, w.shape, task.space.get(index), path, logical)
    a, b = logical
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    expected = np.matmul(a, b)
    if not np.allclose(kernel.output(), expected, rtol=1e-3, atol=1e-3):
        raise RuntimeError(f"best config {index} gives a wrong answer")
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(statistics.median(kernel.seconds(50.0, repeat=1)))
        number, started = 0, time.perf_counter()
        while time.perf_counter() - started < 0.05:
            np.matmul(a, b, out=out)
            number += 1
        theirs.append((time.perf_counter() - started) / number)
    return task.flop / statistics.median(ours) / 1e9, task.flop / statistics.median(theirs) / 1e9


def metaschedule(python: str, budget: int, work_dir: str) -> dict[str, float] | None:
    """MetaSchedule on sgemm 1024 with `budget` trials, run by the TVM virtualenv's `python`."""
    script = Path(__file__).resolve().parent / "metaschedule_peer.py"
    cmd = [python, str(script), "--trials", str(budget), "--threads", "1", "--work-dir", work_dir]
    cmd += ["--m", "1024", "--n", "1024", "--k", "1024"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    if out.returncode != 0:
        print(f"MetaSchedule failed (exit {out.returncode}): {out.stderr[-1500:]}", flush=True)
        return None
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def score_10k_ms(table: Table) -> float:
    """Milliseconds to featurize and score 10,000 candidates with a model fitted on `table`."""
    from tuner.search.cost_model import CostModel
    from tuner.search.features import knob_features

    space = table.task.space
    done = [(i, r) for i, r in table.results.items()]
    x = knob_features(space, np.array([i for i, _ in done], dtype=np.int64))
    speed = np.array([1.0 / r.median_s if r.ok else 0.0 for _, r in done])
    model = CostModel(seed=0)
    model.fit(x, speed / max(speed.max(), 1e-30))
    candidates = np.random.default_rng(0).integers(len(space), size=10_000)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        model.predict(knob_features(space, candidates))
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=200, help="trials per run")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds vs numpy")
    parser.add_argument("--only", default="sgemm,conv", help="comma-separated: sgemm,conv")
    parser.add_argument(
        "--tvm-python",
        default="",
        help="python of a virtualenv with apache-tvm: run MetaSchedule on sgemm 1024 too",
    )
    parser.add_argument(
        "--table",
        default="",
        help="JSON cache of measurements (config -> seconds) per case: read at the start, "
        "written at the end; lets phase 2 replay searchers without measuring again",
    )
    parser.add_argument(
        "--exhaustive",
        action="store_true",
        help="measure every valid config of each case first: the best known is then the "
        "true best of the (filtered) space, and phase 2 measures nothing",
    )
    parser.add_argument("--no-real-run", action="store_true", help="skip phase 1")
    parser.add_argument(
        "--check-configs",
        type=int,
        default=None,
        help="sgemm configs of the check-cost A/B, built and measured in both arms (default: "
        "--budget, as many as a run; 0: skip)",
    )
    parser.add_argument(
        "--no-pipeline", action="store_true", help="phase 1 builds and measures in turn"
    )
    args = parser.parse_args(argv)
    if args.check_configs is None:
        args.check_configs = args.budget
    groups = args.only.split(",")
    cache: dict[str, dict[str, float | None]] = {}
    if args.table and Path(args.table).exists():
        cache = json.loads(Path(args.table).read_text())
    target = host_target_name()
    evaluator = EvaluatorConfig(repeat=3, min_repeat_ms=20.0, timeout_s=20.0)
    started_all = time.perf_counter()
    with (
        LocalPool(extra_agent_args=("--pin-cores", str(AGENT_CORE))) as pool,
        tempfile.TemporaryDirectory(prefix="kiln-tuning-") as tmp,
    ):
        os.sched_setaffinity(0, {BUILD_CORE})  # the search and the numpy peer
        config = PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token)
        runner = PoolRunner(config, evaluator)
        builder = LocalBuilder(target=target, workers=1, per_unit=4, cpus=[BUILD_CORE])
        cost: CheckCost | None = None
        try:
            sgemm = Task(CASES["sgemm"][0].workload)
            # -- check cost: first, while the agent has run no reference --------------------------
            if args.check_configs > 0:
                cost = check_cost(sgemm, target, runner, args.check_configs, args.batch, tmp)
                print(
                    f"check cost: {cost.configs} sgemm 1024 configs, checked / unchecked: build "
                    f"{cost.build_s[True]:.1f} / {cost.build_s[False]:.1f} s, measure "
                    f"{cost.run_s[True]:.1f} / {cost.run_s[False]:.1f} s, in all "
                    f"{cost.total(True):.1f} / {cost.total(False):.1f} s = "
                    f"{cost.overhead:+.1%}; {cost.wrong} wrong answers",
                    flush=True,
                )
            # -- phase 1: the real run ------------------------------------------------------------
            wall_s = share = float("nan")
            ours_gf = numpy_gf = float("nan")
            real: list[rec.Record] = []
            if "sgemm" in groups and not args.no_real_run:
                records_path = Path(tmp) / "sgemm.jsonl"
                searcher = model_searcher(sgemm, 0)
                t0 = time.perf_counter()
                progress = tune(
                    sgemm,
                    builder,
                    runner,
                    TuneOptions(
                        trials=args.budget,
                        batch_size=args.batch,
                        confirm=CONFIRM_TOP,
                        pipeline=not args.no_pipeline,
                        check=True,
                    ),
                    searcher=searcher,
                    records=records_path,
                )
                wall_s = time.perf_counter() - t0
                share = float(getattr(searcher, "model_seconds", float("nan"))) / wall_s
                real = list(progress.history)
                assert progress.best is not None
                ours_gf, numpy_gf = versus_numpy(
                    sgemm, progress.best.config_index, args.rounds, target
                )
                if args.tvm_python:
                    ms = metaschedule(args.tvm_python, args.budget, tmp)
                    if ms is not None:
                        ms_gf = float(ms["gflops"])
                        print(
                            f"MetaSchedule: {ms['trials']:g} trials in {ms['wall_s']:.1f} s "
                            f"(+{ms.get('setup_s', 0.0):.0f} s set-up), best re-timed "
                            f"{ms_gf:.1f} GFLOP/s = {ms_gf / numpy_gf:.2f}x numpy",
                            flush=True,
                        )
                print(
                    f"real run: sgemm 1024, {progress.trials} trials in {wall_s:.1f} s "
                    f"(build {progress.build_s:.1f} s, measure {progress.measure_s:.1f} s, "
                    f"{'pipelined' if not args.no_pipeline else 'in turn'}; "
                    f"{len(progress.confirmations)} confirmation runs; "
                    f"model {share:.1%}); best config {progress.best.config_index} "
                    f"{json.dumps(progress.best.knobs)}: {ours_gf:.1f} GFLOP/s vs numpy "
                    f"{numpy_gf:.1f} ({ours_gf / numpy_gf:.2f}x)",
                    flush=True,
                )

            # -- phase 2: trials to 95% -----------------------------------------------------------
            rows = []
            tables: dict[str, Table] = {}
            model_medians, random_medians = [], []
            for case in (c for g in groups for c in CASES[g]):
                task = Task(case.workload)
                table = tables[case.label] = Table(task, builder, runner)
                loaded = table.load(cache, target)  # first: a cached table is replayed as is
                table.add(real)
                if args.exhaustive:
                    check = valid_fn(task)
                    every = [i for i in range(len(task.space)) if check(i)]
                    todo = [i for i in every if i not in table.results]
                    print(
                        f"  {case.label}: {len(every)} valid configs, {loaded} cached, "
                        f"measuring {len(todo)}",
                        flush=True,
                    )
                    for start in range(0, len(todo), 64):
                        table.measure(todo[start : start + 64])
                        table.dump(cache, target)
                        if args.table:
                            Path(args.table).write_text(json.dumps(cache))
                known = kernels_best_index(task, target)
                if known is not None:
                    table.measure([known])
                runs = []
                for seed in range(args.seeds):
                    for method, make in (("model", model_searcher), ("random", random_searcher)):
                        run = simulate(
                            table, make(task, seed), method, seed, args.budget, args.batch
                        )
                        runs.append(run)
                        print(
                            f"  {case.label:<16} {method:<6} seed {seed}: "
                            f"best {task.flop / run.curve[-1] / 1e9:6.1f} GFLOP/s "
                            f"({len(table.results)} configs measured so far)",
                            flush=True,
                        )
                best_s = table.best_s()
                goal = best_s / 0.95
                per = {
                    m: [r.trials_to(goal, args.budget) for r in runs if r.method == m]
                    for m in ("model", "random")
                }
                med = {m: statistics.median(v) for m, v in per.items()}
                model_medians.append(med["model"])
                random_medians.append(med["random"])
                rows.append((case.label, task.flop / best_s / 1e9, len(table.results), per, med))

            if args.table:
                for t in tables.values():
                    t.dump(cache, target)
                Path(args.table).write_text(json.dumps(cache))

            # -- phase 3: scoring speed -----------------------------------------------------------
            score_ms = (
                score_10k_ms(tables["sgemm 1024"]) if "sgemm 1024" in tables else float("nan")
            )
        finally:
            runner.close()
            builder.close()

    print()
    print(
        f"{'case':<16} {'best GFLOP/s':>12} {'measured':>8}  "
        f"{'model trials to 95% (seeds)':<30} {'random trials to 95% (seeds)':<30}"
    )
    for label, best_gf, measured, per, med in rows:
        cells = [f"{med[m]:g}  {per[m]}" for m in ("model", "random")]
        print(f"{label:<16} {best_gf:12.1f} {measured:8d}  {cells[0]:<30} {cells[1]:<30}")
    print(
        f"(budget {args.budget} trials, batch {args.batch}; {args.budget + 1} = not reached; "
        f"{time.perf_counter() - started_all:.0f} s in all; target {target})"
    )
    if "sgemm" in groups:
        print(
            f"sgemm 1024 real run: {wall_s:.1f} s wall, model share {share:.3f}, "
            f"best {ours_gf:.1f} GFLOP/s vs numpy {numpy_gf:.1f} = {ours_gf / numpy_gf:.2f}x"
        )
    # The key figures are the worst case's medians over seeds.
    trials = max(model_medians, default=float("nan"))
    random_trials = max(random_medians, default=float("nan"))
    overhead = cost.overhead if cost is not None else float("nan")
    print(
        f"tuning: trials_to_95_median={trials:g} random_trials_to_95_median={random_trials:g} "
        f"wall_s_sgemm1024={wall_s:.1f} model_share={share:.3f} score_10k_ms={score_ms:.1f} "
        f"check_overhead={overhead:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

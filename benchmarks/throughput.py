"""Throughput of the whole tuning loop, local builder vs a Dask cluster of the same cores, and what
one candidate costs at each step.

    .venv/bin/python benchmarks/throughput.py [--trials 64] [--batch 8] [--samples 16]
        [--templates dense,conv2d_winograd_nchwc,...] [--costs-only] [--evaluator default|light]
        [--network-trials 0] [--rounds 2]

Loop: `tune()` (XGBoost-guided search, pipelined: builds stream into measurement as they finish,
on-device check on, records appended to a JSON-lines file) of dense 256 and a ResNet-18 conv
(3x3, 64 channels at 56x56, `conv2d_nchwc`) on an embedded pool of two agents (one device each,
real tracker, leases, uploads, native timing with the CLI's defaults: 3 repeats of at least
20 ms; `--evaluator light`: one repeat of at least 2 ms, which ranks candidates more coarsely
but leaves the loop's pace to the builds; the tuner's own defaults are not changed). Once with
`LocalBuilder` (build processes = the cores this process may use, 4 candidates per unit) and
once with `DaskBuilder` on a `distributed.LocalCluster` of as many worker processes (one
thread each) on 127.0.0.1, `--rounds` times each, which goes first alternating by round and
workload (local, dask, dask, local, ...): this VM has spells of minutes where a core does a third
less (a candidate's build core-seconds read 0.125-0.199 for the same local runs), so a figure is
the median over rounds, and dask / local the median of the ratio within each round. Every run builds into an
empty compile cache, and its workers are warmed (imports) before the clock.
Both build for this machine's target class (what a Dask builder resolves "host" to).
candidates/s = trials / wall time of `tune()`; build core-s = the CPU seconds (user + system) the
builder's processes and their compilers spent during it, per candidate: lowering, gcc, and the
references the check needs (read from /proc: the processes the builder started, and the children
they reaped).

Network (`--network-trials N`, off by default): `tune_network()` of ResNet-18 at 56x56 with the
local builder on the same pool, N trials with the random searcher (so both ways measure nearly
the same candidates), building each batch whole and then measuring it (`pipeline=False`) or
streaming each batch's builds into measurement as they finish (`pipeline=True`), each run into
an empty compile cache, in the order whole, streamed, streamed, whole; candidates/s = all
trials / all wall time of a way. Prints a `network:` line before the last.

Per-candidate costs (the "Scaling on paper" note in README.md uses them): for each template
(COSTED: dense, the ResNet-18 layer as conv2d_nchwc and as conv2d_winograd_nchwc, a 1x1, a
depthwise, a max pool, a global average pool, a row sum, a softmax; `--templates` picks some),
`--samples` random plausible configs: lowering (instantiate the schedule, lower to loop IR,
render C) and compiling (gcc, empty cache) one candidate alone, p50 and p95; upload: one quick
call of each of those dense artifacts with its upload less one without; measure: each timed as
the loop times it.

Ends with one line (the loop figures are dense 256's, nan with `--costs-only`; lower_p95_s /
compile_p95_s the worst template's):
    throughput: candidates_per_s_local=<x> candidates_per_s_dask=<x> lower_p95_s=<s> compile_p95_s=<s>
        build_core_s_local=<s> dask_over_local=<x>   (on the same line: core-seconds per
        candidate, local builder; the median within-round ratio of dask's candidates/s to local's)
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed import LocalCluster

from compiler import build as compiler_build
from compiler.artifact import Artifact
from compiler.frontend.onnx import from_onnx
from compiler.toolchain import CACHE_ENV, compile_shared, host_target_name
from compiler.zoo import resnet18
from tuner.loop import tune
from tuner.measure import EvaluatorConfig
from tuner.measure.builder import Builder, LocalBuilder
from tuner.measure.dask_builder import DaskBuilder
from tuner.measure.local_pool import LocalPool
from tuner.measure.pool_runner import PoolConfig, PoolRunner
from tuner.network.tune import tune_network
from tuner.options import TuneOptions
from tuner.records import FileRecords, Workload
from tuner.task import Task

DENSE = Workload("dense", (256, 256, 256))
CONV = Workload("conv2d_nchwc", (1, 64, 56, 56, 64, 3, 3, 1, 1, 1))
WINOGRAD = Workload("conv2d_winograd_nchwc", (1, 64, 56, 56, 64, 3, 3, 1, 1, 1))
COSTED = (
    DENSE,
    CONV,
    WINOGRAD,
    Workload("conv2d_1x1_nchwc", (1, 64, 56, 56, 128, 1, 1, 2, 0, 1)),
    Workload("depthwise_conv2d_nchwc", (1, 32, 112, 112, 3, 3, 1, 1, 1)),
    Workload("max_pool2d_nchwc", (1, 64, 112, 112, 3, 2, 1)),
    Workload("global_avg_pool2d_nchwc", (1, 512, 7, 7)),
    Workload("reduce_sum", (512, 512, 1)),
    Workload("softmax", (128, 512)),
)
LOOP_CASES = (("dense 256", DENSE), ("resnet18 conv 64@56", CONV))
WARM_UP = Workload("matmul", (16, 16, 16))
EVALUATORS = {
    "default": EvaluatorConfig(repeat=3, min_repeat_ms=20.0, timeout_s=30.0),  # `kiln tune-op`'s
    "light": EvaluatorConfig(repeat=1, min_repeat_ms=2.0, timeout_s=30.0),
}
QUICK = EvaluatorConfig(warmup=0, repeat=1, min_repeat_ms=0.0)  # one call: what an upload adds
PER_UNIT = 4


@dataclass(frozen=True)
class LoopRun:
    builder: str
    case: str
    trials: int
    wall_s: float
    build_s: float
    measure_s: float
    search_s: float
    ok: int
    build_core_s: float  # CPU seconds of the builder's processes and compilers, all candidates

    @property
    def build_core_s_per(self) -> float:
        return self.build_core_s / self.trials

    @property
    def per_s(self) -> float:
        return self.trials / self.wall_s


def _process_table() -> dict[int, tuple[int, float]]:
    """Every process's parent and CPU seconds (its own and its reaped children's), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        # after the name: state, ppid, ... utime, stime, cutime, cstime (fields 4 and 14-17)
        table[int(stat.parent.name)] = (int(fields[1]), sum(map(int, fields[11:15])) / tick)
    return table


def descendants(pid: int) -> dict[int, float]:
    """CPU seconds of each process below `pid` (its compilers' included once they are reaped)."""
    table = _process_table()
    below: dict[int, float] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, cpu_s) in table.items():
            if ppid == parent and child not in below:
                below[child] = cpu_s
                frontier.append(child)
    return below


@contextmanager
def local_builder(cores: int, cache: str, target: str) -> Iterator[Builder]:
    builder = LocalBuilder(target=target, workers=cores, per_unit=PER_UNIT, cache_dir=cache)
    try:
        yield builder
    finally:
        builder.close()


@contextmanager
def dask_builder(cores: int, cache: str, target: str) -> Iterator[Builder]:
    with LocalCluster(
        n_workers=cores,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        scheduler_port=0,
        dashboard_address="127.0.0.1:0",
        silence_logs=logging.ERROR,
        env={CACHE_ENV: cache},
    ) as cluster:
        builder = DaskBuilder(cluster.scheduler_address, target=target, per_unit=PER_UNIT)
        try:
            yield builder
        finally:
            builder.close()


def loop_run(
    name: str,
    make: Callable[[int, str, str], AbstractContextManager[Builder]],
    case: str,
    workload: Workload,
    config: PoolConfig,
    args: argparse.Namespace,
    target: str,
) -> LoopRun:
    task = Task(workload)
    before = set(descendants(os.getpid()))  # the agents and the tracker: not the builder's
    with (
        tempfile.TemporaryDirectory(prefix="kiln-throughput-") as tmp,
        make(args.cores, str(Path(tmp) / "cache"), target) as builder,
    ):
        builder.build(WARM_UP, list(range(args.cores * PER_UNIT)))  # imports, process starts
        runner = PoolRunner(config, EVALUATORS[args.evaluator], devices=2)
        try:
            start = {p: s for p, s in descendants(os.getpid()).items() if p not in before}
            t0 = time.perf_counter()
            progress = tune(
                task,
                builder,
                runner,
                TuneOptions(trials=args.trials, batch_size=args.batch, pipeline=True, confirm=0),
                records=Path(tmp) / "records.jsonl",
            )
            wall = time.perf_counter() - t0
            end = descendants(os.getpid())
            build_core_s = sum(end.get(p, s) - s for p, s in start.items())
        finally:
            runner.close()
    ok = sum(r.result.ok for r in progress.history)
    run = LoopRun(
        name,
        case,
        progress.trials,
        wall,
        progress.build_s,
        progress.measure_s,
        progress.search_s,
        ok,
        build_core_s,
    )
    print(
        f"  {case:<22} {name:<6} {run.trials} trials in {wall:5.1f} s = {run.per_s:5.1f}/s "
        f"({ok} ok, build {run.build_core_s_per:.3f} core-s each)",
        file=sys.stderr,
        flush=True,
    )
    return run


def network_run(
    pipeline: bool, config: PoolConfig, args: argparse.Namespace, target: str
) -> tuple[int, float]:
    """Trials and wall seconds of `tune_network` on ResNet-18 at 56x56 (local builder)."""
    graph = from_onnx(resnet18(image=56))
    with (
        tempfile.TemporaryDirectory(prefix="kiln-throughput-") as tmp,
        local_builder(args.cores, str(Path(tmp) / "cache"), target) as builder,
    ):
        builder.build(WARM_UP, list(range(args.cores * PER_UNIT)))  # imports, process starts
        runner = PoolRunner(config, EVALUATORS[args.evaluator], devices=2)
        store = FileRecords(Path(tmp) / "records.jsonl")
        options = TuneOptions(
            trials=args.network_trials,
            batch_size=args.batch,
            tuner="random",
            pipeline=pipeline,
            confirm=0,
        )
        try:
            t0 = time.perf_counter()
            result = tune_network(graph, builder, runner, options, store=store)
            wall = time.perf_counter() - t0
        finally:
            runner.close()
            store.close()
    name = "streamed" if pipeline else "whole batch"
    print(
        f"  resnet18@56 network  {name:<11} {result.trials} trials in {wall:5.1f} s = "
        f"{result.trials / wall:5.2f}/s",
        file=sys.stderr,
        flush=True,
    )
    return result.trials, wall


@contextmanager
def fresh_cache() -> Iterator[None]:
    saved = os.environ.get(CACHE_ENV)
    with tempfile.TemporaryDirectory(prefix="kiln-throughput-cache-") as cache:
        os.environ[CACHE_ENV] = cache
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = saved


def step_costs(
    workload: Workload, samples: int, target: str, keep: list[Artifact] | None = None
) -> tuple[list[float], list[float]]:
    """Seconds to lower (schedule -> loop IR -> C) and to compile one candidate alone, for
    `samples` random plausible configs of `workload`; their artifacts go to `keep`."""
    task = Task(workload)
    rng = random.Random(0)
    configs: list[int] = []
    for _ in range(200 * samples):
        if len(configs) == samples:
            break
        i = rng.randrange(len(task.space))
        if i not in configs and task.worth_measuring(i, target):
            configs.append(i)
    lower, compile_ = [], []
    with fresh_cache():
        for i in configs:
            t0 = time.perf_counter()
            sch, tensors = task.template.instantiate(workload.shape, task.space.get(i))
            kernel = compiler_build.Kernel(sch, tensors, f"kiln_bench_c{i}", task.flop)
            source = compiler_build.build_source_many([kernel], target)
            t1 = time.perf_counter()
            compile_shared(source, target)
            t2 = time.perf_counter()
            lower.append(t1 - t0)
            compile_.append(t2 - t1)
            if keep is not None:
                keep.append(compiler_build.build_many([kernel], target))  # from the cache
    return lower, compile_


def upload_and_measure(
    arts: list[Artifact], config: PoolConfig, evaluator: EvaluatorConfig
) -> tuple[float, float]:
    """Median seconds per candidate on one device: its upload (one quick call with the upload,
    less one without) and its measurement as the loop times it (cached)."""
    runner = PoolRunner(config, QUICK, devices=1)
    upload, measure = [], []
    try:
        runner.run(arts[:1])  # the lease
        for art in arts[1:]:
            runner.evaluator = QUICK
            t0 = time.perf_counter()
            runner.run([art])
            t1 = time.perf_counter()
            runner.run([art])
            t2 = time.perf_counter()
            runner.evaluator = evaluator
            runner.run([art])
            t3 = time.perf_counter()
            upload.append((t1 - t0) - (t2 - t1))
            measure.append(t3 - t2)
    finally:
        runner.close()
    return max(0.0, statistics.median(upload)), statistics.median(measure)


def p(values: list[float], q: int) -> float:
    """The q-th percentile of `values`."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def print_costs(costs: dict[str, tuple[list[float], list[float]]], samples: int) -> None:
    print(f"\nper candidate, alone, empty cache ({samples} configs per template)")
    print(
        f"{'template':<24} {'lower p50':>10} {'lower p95':>10} {'compile p50':>12} {'compile p95':>12}"
    )
    for op, (lower, comp) in costs.items():
        print(
            f"{op:<24} {p(lower, 50):9.3f}s {p(lower, 95):9.3f}s {p(comp, 50):11.3f}s "
            f"{p(comp, 95):11.3f}s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=64, help="trials per loop run")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=16, help="configs per template costed")
    parser.add_argument(
        "--templates",
        default=",".join(w.op for w in COSTED),
        help="comma-separated templates of COSTED to cost (dense always, for the loop)",
    )
    parser.add_argument("--costs-only", action="store_true", help="skip the loop runs")
    parser.add_argument(
        "--rounds", type=int, default=2, help="loop runs of each builder per case (alternating)"
    )
    parser.add_argument(
        "--evaluator",
        choices=sorted(EVALUATORS),
        default="default",
        help="the loop's measurement: default (3 x >= 20 ms) or light (1 x >= 2 ms)",
    )
    parser.add_argument(
        "--network-trials",
        type=int,
        default=0,
        help="trials of a ResNet-18 network tuning run, whole-batch and streamed (0: none)",
    )
    args = parser.parse_args()
    args.cores = len(os.sched_getaffinity(0))
    target = host_target_name()
    logging.getLogger("distributed").setLevel(logging.ERROR)
    wanted = set(args.templates.split(","))
    unknown = wanted - {w.op for w in COSTED}
    if unknown:
        parser.error(f"not in COSTED: {', '.join(sorted(unknown))}")

    print(f"{args.cores} cores, target {target}; lowering and compile costs", file=sys.stderr)
    costs: dict[str, tuple[list[float], list[float]]] = {}
    dense_arts: list[Artifact] = []
    for workload in COSTED:
        if workload.op in wanted or (workload is DENSE and not args.costs_only):
            keep = dense_arts if workload is DENSE else None
            costs[workload.op] = step_costs(workload, args.samples, target, keep)
            print(f"  costed {workload.op}", file=sys.stderr, flush=True)
    lower_p95 = max(p(lower, 95) for lower, _ in costs.values())
    compile_p95 = max(p(comp, 95) for _, comp in costs.values())
    if args.costs_only:
        print_costs(costs, args.samples)
        print(
            f"throughput: candidates_per_s_local=nan candidates_per_s_dask=nan "
            f"lower_p95_s={lower_p95:.3f} compile_p95_s={compile_p95:.3f} build_core_s_local=nan "
            "dask_over_local=nan"
        )
        return

    evaluator = EVALUATORS[args.evaluator]
    runs: list[LoopRun] = []
    with LocalPool(key="bench-throughput", agents=2, devices_per_agent=1) as pool:
        config = PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token)
        upload_s, measure_s = upload_and_measure(dense_arts, config, evaluator)
        builders = [("local", local_builder), ("dask", dask_builder)]
        for n, (case, workload) in enumerate(LOOP_CASES):
            for round_ in range(args.rounds):
                for name, make in builders if (n + round_) % 2 == 0 else builders[::-1]:
                    runs.append(loop_run(name, make, case, workload, config, args, target))
        network: dict[bool, list[tuple[int, float]]] = {False: [], True: []}
        for pipeline in (False, True, True, False) if args.network_trials > 0 else ():
            network[pipeline].append(network_run(pipeline, config, args, target))

    print(
        f"\nwhole loop, {args.trials} trials in batches of {args.batch}, 2 agents, {args.cores} cores, "
        f"evaluator {args.evaluator}"
    )
    head = f"{'case':<22} {'builder':<8} {'cand/s':>7} {'wall s':>7} {'build s':>8} {'measure s':>9} {'search s':>8} {'ok':>4} {'build core-s/cand':>17}"
    print(head)
    for r in runs:
        print(
            f"{r.case:<22} {r.builder:<8} {r.per_s:7.1f} {r.wall_s:7.1f} {r.build_s:8.1f} "
            f"{r.measure_s:9.1f} {r.search_s:8.1f} {r.ok:4d} {r.build_core_s_per:17.3f}"
        )
    print_costs(costs, args.samples)
    print(
        f"dense 256 on one device: upload {upload_s * 1e3:.1f} ms, measure {measure_s * 1e3:.1f} ms "
        f"(median of {len(dense_arts) - 1})"
    )
    searches = [r.search_s / r.trials for r in runs]
    print(
        f"search (ask + tell) per candidate: {statistics.median(searches) * 1e3:.1f} ms (median of runs)"
    )
    if network[True]:
        whole, streamed = (
            sum(n for n, _ in network[way]) / sum(s for _, s in network[way])
            for way in (False, True)
        )
        print(
            f"network: resnet18@56 candidates_per_s_whole_batch={whole:.2f} "
            f"candidates_per_s_streamed={streamed:.2f}"
        )
    dense = [r for r in runs if r.case == LOOP_CASES[0][0]]
    local = [r for r in dense if r.builder == "local"]
    dask = [r for r in dense if r.builder == "dask"]
    # each round ran the two back to back: their ratio within a round is what the host's
    # slow and fast spells (minutes apart on this VM) leave alone
    ratio = statistics.median(d.per_s / b.per_s for b, d in zip(local, dask, strict=True))
    print(
        f"dense 256, {args.rounds} rounds: local {' '.join(f'{r.per_s:.1f}' for r in local)}, "
        f"dask {' '.join(f'{r.per_s:.1f}' for r in dask)} candidates/s; dask / local within "
        f"a round, median {ratio:.2f}"
    )
    print(
        f"throughput: candidates_per_s_local={statistics.median(r.per_s for r in local):.1f} "
        f"candidates_per_s_dask={statistics.median(r.per_s for r in dask):.1f} "
        f"lower_p95_s={lower_p95:.3f} compile_p95_s={compile_p95:.3f} "
        f"build_core_s_local={statistics.median(r.build_core_s_per for r in local):.3f} "
        f"dask_over_local={ratio:.2f}"
    )


if __name__ == "__main__":
    main()

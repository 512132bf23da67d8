"""Whole models, ours vs onnxruntime, single-threaded, interleaved in one process.

For each model (ResNet-18, MobileNetV2, BERT-tiny from `compiler/zoo.py`, seeded weights) the
ONNX model is imported and built with the default configs (untuned) and, with `--records R` (a
records file or store from `kiln tune`, issue 7's budget being at most 2,000 trials in all), with
the best configs of those records (tuned), through `tuner.network.tune.configs_from_records` when
that function exists (else the tuned build is skipped with a note). Every build's outputs are
checked against onnxruntime's (max |ours - ort| <= 1e-4 * max |ort|) before anything is timed.
Then ours (the C entry `kiln_model_run` called in a loop through ctypes) and onnxruntime (1
intra-op thread, 1 inter-op, sequential, all graph optimizations) alternate for `--rounds`
rounds, each a loop of at least `--min-round-s`; a time is the median of its rounds. All of it
is `tuner.network.timing.versus_onnxruntime`, the path `kiln demo` times with: on one core
(`--core`, default the last; the session is created there), and every BLAS / OpenMP pool has
one thread. Ratio = onnxruntime time / our time (> 1: ours is faster). Workspace: the planned bytes against the plan's lower bound (the
most bytes live at any one step). `--profile` adds each model's kernels timed one by one, alone
(warm caches) and one after another in the model's order (the caches the kernel before leaves).

    python benchmarks/models.py [--models resnet18,mobilenet_v2,bert_tiny] [--image 224]
        [--seq 128] [--records tune.jsonl] [--rounds 5] [--min-round-s 0.2] [--profile]
        [--check-demo]

`--check-demo` times each model's builds with `kiln demo`'s own routine too, alternating with
this benchmark's (bench, demo, three times), and adds a last line
`demo_check: ort_ratio=<demo's onnxruntime time / the benchmark's> ours_ratio=<the same for
ours> ratio_ratio=<demo's ratio to onnxruntime / the benchmark's>`, each the median over the
three (demo, the bench just before it) pairs, the model furthest from 1 for each; 0.95-1.05 is
agreement within the noise.

Records come from tuning the same models (same sizes, seed 0), e.g. 2,000 trials in all:

    kiln models export -o m/ --image 224 --seq 128
    kiln tune m/resnet18.onnx --trials 800 --records tune.jsonl     # likewise the other two

Ends with:
models: resnet18_ratio=<r> mobilenetv2_ratio=<r> bert_tiny_ratio=<r> workspace_over_bound=<f>
(the tuned build's ratio where there is one, else the untuned; workspace_over_bound is the worst
model's).
"""

from __future__ import annotations

import os

# One thread for every pool, set before numpy or onnxruntime load theirs.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import ctypes  # noqa: E402
import importlib  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from compiler import zoo  # noqa: E402
from compiler.frontend.onnx import from_onnx  # noqa: E402
from compiler.graph.build_model import (  # noqa: E402
    MODEL_ENTRY,
    ModelArtifact,
    ModelPlan,
    build_model,
    plan_model,
)
from compiler.graph.ir import Graph  # noqa: E402
from compiler.toolchain import CACHE_ENV  # noqa: E402
from device_agent import abi  # noqa: E402
from tuner.network.timing import (  # noqa: E402
    NativeModel,
    OutputMismatch,
    VersusOrt,
    one_core,
    seeded_feeds,
    versus_onnxruntime,
)

MODELS = ("resnet18", "mobilenet_v2", "bert_tiny")
FINAL_KEYS = {"resnet18": "resnet18", "mobilenet_v2": "mobilenetv2", "bert_tiny": "bert_tiny"}
RTOL = 1e-4
_BOUND = re.compile(r"workspace (\d+) bytes \(lower bound (\d+)")

ConfigsFromRecords = Callable[[Graph, Any, str], Any]


@dataclass
class Build:
    """One build of a model: the artifact, its configs, its build time; once timed, its loaded
    model and its times."""

    label: str  # "untuned" | "tuned"
    artifact: ModelArtifact
    configs: Any
    build_s: float
    native: NativeModel | None = None
    times_s: list[float] = field(default_factory=list)


@dataclass
class Row:
    name: str
    builds: dict[str, Build]
    ort_s: float
    workspace: int
    lower_bound: int
    kernels: int
    # (onnxruntime, ours, ratio to onnxruntime): the demo's / the benchmark's
    demo_check: tuple[float, float, float] | None = None

    def ours_s(self, label: str) -> float | None:
        b = self.builds.get(label)
        return statistics.median(b.times_s) if b else None

    def ratio(self, label: str) -> float | None:
        ours = self.ours_s(label)
        return self.ort_s / ours if ours else None


def onnx_model(name: str, image: int, seq: int) -> onnx.ModelProto:
    return zoo.build(name, **({"seq": seq} if name == "bert_tiny" else {"image": image}))


def feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs: token ids below the vocabulary for int64 inputs, N(0, 1) for floats."""
    return seeded_feeds(model, seed, zoo.BERT_VOCAB)


def configs_from_records() -> ConfigsFromRecords | None:
    """`tuner.network.tune.configs_from_records`, or None where it does not exist yet."""
    try:
        module = importlib.import_module("tuner.network.tune")
    except ImportError:
        return None
    fn = getattr(module, "configs_from_records", None)
    return fn if callable(fn) else None


def workspace_bound(artifact: ModelArtifact, graph: Graph, configs: Any) -> tuple[int, int]:
    """(planned workspace bytes, lower bound), from the build summary or else a fresh plan."""
    match = _BOUND.search(artifact.summary)
    if match:
        return int(match.group(1)), int(match.group(2))
    plan = plan_model(graph, configs)
    return plan.memory.total, plan.memory.lower_bound


def build(label: str, graph: Graph, configs: Any) -> Build:
    start = time.perf_counter()
    artifact = build_model(graph, configs)
    return Build(label, artifact, configs, time.perf_counter() - start)


@dataclass(frozen=True)
class KernelTime:
    """One kernel's median seconds per call, run alone with the model's buffers."""

    symbol: str
    group: int
    role: str
    ops: str  # the fused group's ops, "+"-joined
    anchor_op: str
    seconds: float
    template: bool = False  # a template's anchor kernel: what tuning tasks time and tune

    @property
    def share(self) -> str:
        """Which part of the model's time this kernel is (see `split`)."""
        if self.template:
            return "tuned kernels"
        if self.role in ("pad", "tail"):
            return f"{self.role}s around them"
        return "other steps"


def kernel_seconds(
    native: NativeModel, plan: ModelPlan, min_repeat_ms: float = 10.0
) -> list[KernelTime]:
    """Each kernel timed alone (median of 3 native repeats), in the order the entry calls them.

    `plan` must be the plan this artifact was built from (`plan_model` with the same graph,
    configs and target); its kernel symbols are checked against the artifact's.

    Raises:
        ValueError: the plan's kernels are not the artifact's.
    """
    symbols = [s.kernel.symbol for s in plan.steps]
    built = [e.symbol for e in native.model.artifact.entries if e.symbol != MODEL_ENTRY]
    if symbols != built:
        raise ValueError("the plan's kernels differ from the artifact's: not its plan")
    groups = {grp.index: grp for grp in plan.fusion.groups}
    out: list[KernelTime] = []
    for step in plan.steps:
        args = native.step_args(plan, step)
        timer = abi.bind_timing(native.lib, native.model.artifact.entries[len(out)].timing_symbol)
        cfg = abi.TimingConfigC(
            warmup=1,
            number=1,
            repeat=3,
            min_repeat_ms=min_repeat_ms,
            cooldown_ms=0.0,
            flush_buf=None,
            flush_bytes=0,
        )
        samples = (ctypes.c_double * 3)()
        if timer(args, ctypes.byref(cfg), samples, None) != 0:
            raise RuntimeError(f"timing entry of {step.kernel.symbol} returned an error")
        grp = groups[step.group]
        out.append(
            KernelTime(
                step.kernel.symbol,
                step.group,
                step.role,
                "+".join(grp.ops),
                grp.anchor.op,
                statistics.median(samples),
                step.role == "anchor" and step.config is not None,
            )
        )
    return out


def split(times: list[KernelTime], whole_s: float) -> list[tuple[str, float]]:
    """The model's time in parts: its tuned kernels (templates' anchors), the pads and tails
    around them, the other steps (by anchor op, largest first), each timed alone, and the gap:
    the whole model's time less the sum of its kernels alone (calls, caches cold or shared
    between kernels, what timing one kernel at a time hides)."""
    parts: dict[str, float] = {}
    for t in times:
        parts[t.share] = parts.get(t.share, 0.0) + t.seconds
    out = [
        (k, parts.get(k, 0.0)) for k in ("tuned kernels", "pads around them", "tails around them")
    ]
    others: dict[str, float] = {}
    for t in times:
        if t.share == "other steps":
            others[t.anchor_op] = others.get(t.anchor_op, 0.0) + t.seconds
    out += sorted(((f"other: {op}", s) for op, s in others.items()), key=lambda kv: -kv[1])
    out.append(("gap (whole - sum alone)", whole_s - sum(t.seconds for t in times)))
    return out


def kernel_seconds_in_model(native: NativeModel, plan: ModelPlan, rounds: int = 20) -> list[float]:
    """Each kernel's median seconds when the kernels run one after another in the entry's order,
    on the model's buffers, as `kiln_model_run` calls them: with the caches each leaves the next
    (weights and activations cold, as in the model), where `kernel_seconds` times a kernel again
    and again on warm ones. Called from Python (about a microsecond a call more than the entry),
    `rounds` runs of the sequence after one that warms up; one figure per step of `plan`.

    Raises:
        RuntimeError: a kernel returned an error code.
    """
    calls = [
        (abi.bind_entry(native.lib, s.kernel.symbol), native.step_args(plan, s)) for s in plan.steps
    ]
    samples: list[list[float]] = [[] for _ in calls]
    clock = time.perf_counter
    for round_ in range(rounds + 1):
        for i, (fn, args) in enumerate(calls):
            t0 = clock()
            rc = fn(args)
            t1 = clock()
            if rc != 0:
                raise RuntimeError(f"{plan.steps[i].kernel.symbol} returned {rc}")
            if round_:
                samples[i].append(t1 - t0)
    return [statistics.median(x) for x in samples]


def profile(name: str, graph: Graph, b: Build, top: int) -> None:
    """Print the `top` slowest kernels of a build, timed one by one, and time by anchor op."""
    assert b.native is not None  # timed first
    plan = plan_model(graph, b.configs)
    times = kernel_seconds(b.native, plan)
    total = sum(t.seconds for t in times)
    whole = statistics.median(b.times_s) if b.times_s else float("nan")
    print(
        f"\n{name} {b.label}: {len(times)} kernels, sum {total * 1e3:.2f} ms alone "
        f"(whole model {whole * 1e3:.2f} ms)"
    )
    print(f"  {'kernel':<16} {'role':<6} {'ms':>8} {'share':>6}  group ops")
    for t in sorted(times, key=lambda t: -t.seconds)[:top]:
        share = t.seconds / total if total else 0.0
        ops = t.ops if len(t.ops) <= 60 else t.ops[:57] + "..."
        print(f"  {t.symbol:<16} {t.role:<6} {t.seconds * 1e3:8.3f} {share:6.1%}  {ops}")
    by_op: dict[str, float] = {}
    for t in times:
        by_op[t.anchor_op] = by_op.get(t.anchor_op, 0.0) + t.seconds
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1])
    print("  by anchor op: " + ", ".join(f"{op} {s * 1e3:.2f} ms" for op, s in ranked))
    if b.times_s:
        print(f"  where the whole model's {whole * 1e3:.2f} ms go:")
        for part, seconds in split(times, whole):
            print(f"    {part:<32} {seconds * 1e3:8.3f} ms {seconds / whole:7.1%}")
    in_model = kernel_seconds_in_model(b.native, plan)
    total_in = sum(in_model)
    print(
        f"  in the model's order (each kernel after the one before): sum {total_in * 1e3:.2f} ms "
        f"against {total * 1e3:.2f} alone; the kernels losing most:"
    )
    print(f"  {'kernel':<16} {'role':<6} {'alone ms':>9} {'in model':>9} {'lost ms':>8}  group ops")
    lost = sorted(zip(times, in_model, strict=True), key=lambda p: p[0].seconds - p[1])
    for t, s_in in lost[:top]:
        ops = t.ops if len(t.ops) <= 50 else t.ops[:47] + "..."
        print(
            f"  {t.symbol:<16} {t.role:<6} {t.seconds * 1e3:9.3f} {s_in * 1e3:9.3f} "
            f"{(s_in - t.seconds) * 1e3:8.3f}  {ops}"
        )


def _ms(value: float | None) -> str:
    return f"{value * 1e3:.2f}" if value is not None else "-"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def print_table(rows: list[Row], tuned_note: str, cache: str) -> None:
    head = (
        f"{'model':<13} {'untuned ms':>10} {'tuned ms':>9} {'ort ms':>8} {'ratio unt':>9} "
        f"{'ratio tun':>9} {'ws MB':>7} {'bound MB':>8} {'kernels':>7} {'build s':>11}"
    )
    print()
    print(head)
    for r in rows:
        builds = "/".join(f"{b.build_s:.1f}" for b in r.builds.values())
        print(
            f"{r.name:<13} {_ms(r.ours_s('untuned')):>10} {_ms(r.ours_s('tuned')):>9} "
            f"{r.ort_s * 1e3:8.2f} {_ratio(r.ratio('untuned')):>9} {_ratio(r.ratio('tuned')):>9} "
            f"{r.workspace / 2**20:7.3f} {r.lower_bound / 2**20:8.3f} {r.kernels:7d} {builds:>11}"
        )
    print(
        "(1 thread, timed on one core; ratio = onnxruntime time / our time, medians of "
        f"interleaved rounds; build s = untuned[/tuned], {cache}; final line: {tuned_note})"
    )


def measure_model(
    name: str, args: argparse.Namespace, store: Any, from_records: ConfigsFromRecords | None
) -> Row:
    """Build, check and time (interleaved with onnxruntime, `versus_onnxruntime`) one model;
    with --check-demo, time it the demo's way too; with --profile, its kernels one by one."""
    proto = onnx_model(name, args.image, args.seq)
    inputs = feeds(proto, args.seed)
    graph = from_onnx(proto)
    builds = {"untuned": build("untuned", graph, None)}
    if store is not None and from_records is not None:
        configs = from_records(graph, store, "host")
        if configs:
            builds["tuned"] = build("tuned", graph, configs)
        else:
            print(f"{name}: no records of its tasks: no tuned build", flush=True)
    for b in builds.values():
        print(f"{name} {b.label}: built in {b.build_s:.1f} s", flush=True)
    artifacts = {label: b.artifact for label, b in builds.items()}
    try:
        times = versus_onnxruntime(
            proto, inputs, artifacts, args.rounds, args.min_round_s, RTOL, core=args.core
        )
    except OutputMismatch as exc:
        raise AssertionError(f"{name}: {exc}") from None
    print(f"{name}: outputs of every build match onnxruntime (rel {RTOL:g})", flush=True)
    for label, b in builds.items():
        b.times_s, b.native = times.ours[label], times.natives[label]
    last = builds.get("tuned", builds["untuned"])  # the build the final line reports
    workspace, bound = workspace_bound(last.artifact, graph, last.configs)
    row = Row(
        name,
        builds,
        times.ort_s,
        workspace,
        bound,
        len(last.artifact.artifact.entries),
    )
    print(
        f"  {name}: ours {_ms(row.ours_s(last.label))} ms ({last.label}), "
        f"onnxruntime {row.ort_s * 1e3:.2f} ms, ratio {_ratio(row.ratio(last.label))}",
        flush=True,
    )
    if args.check_demo:
        row.demo_check = check_demo(proto, inputs, artifacts, last.label, args, times)
    if args.profile:
        with one_core(args.core):
            for b in builds.values():
                profile(name, graph, b, args.top)
    return row


CHECK_PAIRS = 3  # (bench, demo) pairs of --check-demo


def check_demo(
    proto: onnx.ModelProto,
    inputs: dict[str, np.ndarray],
    artifacts: dict[str, ModelArtifact],
    label: str,
    args: argparse.Namespace,
    first: VersusOrt,
) -> tuple[float, float, float]:
    """The same builds timed by `kiln demo`'s own routine and by this benchmark's, alternately,
    CHECK_PAIRS times (bench, demo, bench, demo, ...; `first` is the first bench): medians over
    the pairs of (demo's onnxruntime time / the benchmark's, the same for `label`, demo's ratio
    to onnxruntime / the benchmark's). Each figure compares a demo run with the bench run just
    before it: on a VM whose speed drifts 20-30% from one minute to the next (the Xeon of stop
    40), medians over separate phases compared times from different minutes."""
    from kiln.cli.demo import time_builds

    bench: list[VersusOrt] = [first]
    demo: list[VersusOrt] = []
    for i in range(CHECK_PAIRS):
        if i:
            bench.append(
                versus_onnxruntime(
                    proto, inputs, artifacts, args.rounds, args.min_round_s, RTOL, core=args.core
                )
            )
        demo.append(time_builds(proto, inputs, artifacts))
    pairs = list(zip(demo, bench, strict=True))
    ort = statistics.median(d.ort_s / b.ort_s for d, b in pairs)
    ours = statistics.median(d.median_s(label) / b.median_s(label) for d, b in pairs)
    same = statistics.median(d.ratio(label) / b.ratio(label) for d, b in pairs)
    print(
        f"  demo's timing / this benchmark's, same {label} build, {CHECK_PAIRS} pairs: onnxruntime "
        f"{' '.join(f'{d.ort_s * 1e3:.2f}/{b.ort_s * 1e3:.2f}' for d, b in pairs)} ms -> {ort:.3f}; "
        f"ours {' '.join(f'{d.median_s(label) * 1e3:.2f}/{b.median_s(label) * 1e3:.2f}' for d, b in pairs)}"
        f" ms -> {ours:.3f}; ratio to onnxruntime "
        f"{' '.join(f'{d.ratio(label):.3f}/{b.ratio(label):.3f}' for d, b in pairs)} -> {same:.3f}",
        flush=True,
    )
    return ort, ours, same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    parser.add_argument("--image", type=int, default=224, help="image side (resnet18, mobilenet)")
    parser.add_argument("--seq", type=int, default=128, help="sequence length (bert_tiny)")
    parser.add_argument("--records", help="records of `kiln tune` for the tuned builds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--min-round-s", type=float, default=0.2, help="length of one round")
    parser.add_argument(
        "--core", type=int, help="core the timing runs on (default: the last allowed)"
    )
    parser.add_argument(
        "--check-demo",
        action="store_true",
        help="also time each model with kiln demo's routine and compare (demo_check line)",
    )
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs")
    parser.add_argument("--profile", action="store_true", help="time each kernel alone")
    parser.add_argument("--top", type=int, default=12, help="kernels listed by --profile")
    parser.add_argument(
        "--cold-build", action="store_true", help="build with an empty gcc cache (build s cold)"
    )
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if args.core is not None and args.core not in os.sched_getaffinity(0):
        parser.error(f"--core {args.core}: this process may use {sorted(os.sched_getaffinity(0))}")
    core = args.core if args.core is not None else max(os.sched_getaffinity(0))

    from_records = configs_from_records() if args.records else None
    store = None
    if args.records and from_records is None:
        tuned_note = "untuned ratios (no tuner.network.tune.configs_from_records: tuned skipped)"
    elif args.records:
        from tuner.records import open_store

        store = open_store(args.records)
        tuned_note = f"tuned ratio where tuned, else untuned (records {args.records})"
    else:
        tuned_note = "untuned ratios (no --records)"
    print(f"timing on core {core}; {tuned_note}", flush=True)
    cache = "warm gcc cache"
    if args.cold_build:
        os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="kiln-models-cache-")
        cache = "empty gcc cache"

    rows: list[Row] = []
    started = time.perf_counter()
    try:
        for name in names:
            rows.append(measure_model(name, args, store, from_records))
    finally:
        if args.cold_build:
            shutil.rmtree(os.environ[CACHE_ENV], ignore_errors=True)
        if store is not None:
            store.close()
    print_table(rows, tuned_note, cache)
    print(f"({time.perf_counter() - started:.0f} s in all)")
    ratios = {r.name: r.ratio("tuned") or r.ratio("untuned") for r in rows}
    parts = [
        f"{FINAL_KEYS[n]}_ratio={_ratio(ratios.get(n)) if n in ratios else 'nan'}" for n in MODELS
    ]
    over = max((r.workspace / r.lower_bound for r in rows if r.lower_bound), default=float("nan"))
    print(f"models: {' '.join(parts)} workspace_over_bound={over:.3f}")
    checks = [r.demo_check for r in rows if r.demo_check is not None]
    if checks:
        worst_ort = max(checks, key=lambda c: abs(c[0] - 1.0))[0]
        worst_ours = max(checks, key=lambda c: abs(c[1] - 1.0))[1]
        worst_same = max(checks, key=lambda c: abs(c[2] - 1.0))[2]
        print(
            f"demo_check: ort_ratio={worst_ort:.3f} ours_ratio={worst_ours:.3f} "
            f"ratio_ratio={worst_same:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

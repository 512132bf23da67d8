"""`kiln demo`: the whole story on a local pool, from an ONNX model to a tuned, checked build.

1. Build the model (ResNet-18 by default) as ONNX with seeded weights and import it.
2. Start a local pool (tracker + agent) and tune every task of the model within `--trials`
   (the gradient task scheduler hands them out; each task's fastest configs are measured again
   at the end), with the records in `--records` or a temporary file.
3. Build the model twice, with the builder's default configs (untuned) and with the best
   recorded configs (tuned), and run the tuned build on the pool's device: its outputs are
   checked against onnxruntime's (1e-4 of the output's scale).
4. Time the untuned build, the tuned build and onnxruntime (one intra-op thread) in this process
   on one core, interleaved in rounds (`versus_onnxruntime`, the path `benchmarks/models.py`
   times with), the device's timing of the tuned build taking its turn in each round, and print
   the table.

With `--cores SET` the local device runs on that core set: tuning and both builds are for as many
threads as the set has cores, and the agent's figure is on them, with no ratio to onnxruntime's
one thread (the in-process rows stay on one core; `benchmarks/cores.py` compares at equal threads).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack, closing
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.cli import common, table
from kiln.cli.errors import CliError
from kiln.cli.network import report, tune_network_from_args

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from compiler.graph.build_model import ModelArtifact
    from tuner.measure.pool_runner import PoolRunner
    from tuner.network.timing import VersusOrt

# ResNet-18's warm-up round (8 trials for each of its 16 tasks), then one confirmation each: a
# tile-4 Winograd candidate takes 6 s to lower and 7 s to compile on a 2-core Zen 3, and 256
# trials with 4 confirmations ran past 25 minutes there.
DEMO_MODEL_TRIALS = 128
DEMO_CONFIRM = 1
DEMO_SGEMM_TRIALS = 64
# `kiln demo --sgemm`: rounds of the best kernel and numpy's matmul, interleaved, each side at
# least SGEMM_MIN_ROUND_S a round.
SGEMM_ROUNDS = 7
SGEMM_MIN_ROUND_S = 0.2

RTOL = 1e-4
ROUNDS = 5
MIN_ROUND_S = 0.2


DEMO_MODELS = ("resnet18", "mobilenet_v2", "bert_tiny")  # compiler.zoo' (onnx loads slowly)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="start a local pool, tune a model (ResNet-18), build it, check and time it against "
        "onnxruntime; --sgemm: tune one sgemm instead",
    )
    p.add_argument(
        "--sgemm", action="store_true", help="tune one sgemm (dense, packed B) of --shape instead"
    )
    p.add_argument("--shape", type=common.shape, default=(512, 512, 512), help="M,N,K for --sgemm")
    p.add_argument(
        "--model",
        default="resnet18",
        choices=DEMO_MODELS,
        help="the model to tune (default resnet18)",
    )
    p.add_argument("--image", type=int, default=224, help="image side for the CNNs")
    p.add_argument("--seq", type=int, default=128, help="sequence length for bert_tiny")
    p.add_argument(
        "--devices", type=int, default=1, help="devices of the local pool to measure on at once"
    )
    common.add_cores_arg(p)
    common.add_security_args(p)
    common.add_tuning_args(p, caches=True)
    p.set_defaults(func=cmd_demo, trials=None, confirm=DEMO_CONFIRM, tracker="", key="", tag=[])
    for action in p._actions:  # the defaults that depend on --sgemm, said in the help
        if action.dest == "trials":
            action.help = (
                f"trial budget (default {DEMO_MODEL_TRIALS} for the model, "
                f"{DEMO_SGEMM_TRIALS} with --sgemm)"
            )
        elif action.dest == "confirm":
            action.help = f"re-measure the K fastest configs of each task (default {DEMO_CONFIRM})"


def cmd_demo(args: argparse.Namespace) -> int:
    if args.trials is None:
        args.trials = DEMO_SGEMM_TRIALS if args.sgemm else DEMO_MODEL_TRIALS
    return cmd_sgemm_demo(args) if args.sgemm else cmd_model_demo(args)


def _proto(args: argparse.Namespace) -> onnx.ModelProto:
    from compiler import zoo

    if args.model == "bert_tiny":
        return zoo.build(args.model, seq=args.seq)
    return zoo.build(args.model, image=args.image)


def time_builds(
    proto: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    builds: Mapping[str, ModelArtifact],
    timers: Sequence[tuple[str, Callable[[], float]]] = (),
) -> VersusOrt:
    """The demo's timing of its builds against onnxruntime: `versus_onnxruntime`, the path
    `benchmarks/models.py` times with too, at the demo's rounds (`benchmarks/models.py
    --check-demo` compares the two on one build); `timers` (the device's timing of the tuned
    build) take their turn in the same rounds."""
    from tuner.network.timing import versus_onnxruntime

    return versus_onnxruntime(proto, feeds, builds, ROUNDS, MIN_ROUND_S, RTOL, timers=timers)


def device_timer(
    runner: PoolRunner, model: ModelArtifact, min_round_s: float = MIN_ROUND_S
) -> Callable[[], float]:
    """One round of the device's timing of `model`, taken as this process takes its own
    (`loop_seconds`): one warm-up call, then the mean of back-to-back calls over at least
    `min_round_s`, no cache sweep. Seconds per call; NaN for a round that failed (the figure is
    the median of the others). On a noisy Xeon VM the agent's figure read 4-7% under the
    in-process one with tuning's evaluator (ten single calls after a 64 MiB sweep) in the same
    rounds; this way, once both read the weights from the blob in the shared object
    (`NativeModel`), within 2.1% in four demos."""
    from compiler.graph.build_model import MODEL_ENTRY

    evaluator = dataclasses.replace(
        runner.evaluator,
        warmup=1,
        number=1,
        repeat=1,
        min_repeat_ms=min_round_s * 1e3,
        cooldown_ms=0.0,
        flush_cache_bytes=0,
    )

    def timed() -> float:
        lat = runner.measure_entry(model.artifact, MODEL_ENTRY, evaluator)
        return lat.median_s if lat.ok else math.nan

    return timed


def cmd_model_demo(args: argparse.Namespace) -> int:
    from compiler import zoo
    from compiler.frontend.onnx import from_onnx
    from compiler.graph.build_model import build_model
    from tuner.measure.pool_runner import NoDeviceError
    from tuner.network.run import ModelRunError, run_model
    from tuner.network.timing import OutputMismatch, output_mismatch, seeded_feeds
    from tuner.network.tune import configs_from_records, model_tasks

    common.tune_options(args)
    if args.image < 8 or args.seq < 1:
        raise CliError.usage(f"--image must be >= 8 and --seq >= 1, got {args.image}, {args.seq}")
    proto = _proto(args)
    graph = from_onnx(proto)
    tunable, skipped = model_tasks(graph)
    feeds = seeded_feeds(proto, args.seed, zoo.BERT_VOCAB)
    print(
        f"Kiln demo: {args.model} ({len(graph.nodes)} ONNX-level nodes, {len(tunable)} tuning "
        f"tasks) tuned with the {args.tuner} tuner for up to {args.trials} trials on a local pool",
        file=sys.stderr,
    )
    with ExitStack() as stack:
        if not args.records:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kiln-demo-"))
            args.records = str(Path(tmp) / "records.jsonl")
            shown_records = "(temporary)"
        else:
            shown_records = args.records
        started = time.monotonic()
        result, pool = tune_network_from_args(args, graph, stack)
        target = pool.target
        tune_s = time.monotonic() - started
        print(report(result))
        store = common.open_records(args.records)
        assert store is not None
        stack.callback(store.close)
        configs = configs_from_records(graph, store, target, pool.threads)
        untuned = build_model(graph, None, target, pool.threads)
        tuned = build_model(graph, configs, target, pool.threads)
        runner = stack.enter_context(closing(pool.runner()))
        try:
            on_device = run_model(tuned, feeds, runner)
        except (ModelRunError, NoDeviceError) as exc:
            raise CliError(f"running the tuned build on the pool: {exc}") from None
        builds = {"untuned": untuned, "tuned": tuned}
        # the device's figure is taken in the same rounds as this process's, not before them:
        # on a shared host a spell of minutes would otherwise split the two (seen: 14% apart)
        agent = [("agent", device_timer(runner, tuned))] if on_device.latency.ok else []
        try:
            times = time_builds(proto, feeds, builds, agent)
        except OutputMismatch as exc:
            raise CliError(str(exc)) from None
    why = output_mismatch(list(on_device.outputs), times.reference, RTOL)
    if why is not None:
        raise CliError(f"the tuned build's outputs on the device differ from onnxruntime's: {why}")
    labels = {
        "untuned": f"kiln, untuned ({len(tunable)} tasks on default configs)",
        "tuned": f"kiln, tuned ({result.trials} trials)",
    }
    rows = [[labels[k], f"{times.median_s(k) * 1e3:.2f}", f"{times.ratio(k):.2f}x"] for k in builds]
    rows.append(["onnxruntime (1 thread)", f"{times.ort_s * 1e3:.2f}", "1.00x"])
    lat = on_device.latency
    agent_s = times.timed_s("agent")
    if agent_s is not None:  # the same tuned build, timed by the agent's own loop on its device
        rows.append(agent_row(on_device.device_id, agent_s, times.ort_s, pool.threads))
    print()
    print(table.render(["build", "latency ms", "onnxruntime / this"], rows))
    device_ms = (
        f"{agent_s * 1e3:.2f} ms"
        if agent_s is not None
        else f"failed ({lat.status.value if not lat.ok else 'in every timing round'})"
    )
    print(
        f"(one core, medians of {ROUNDS} interleaved rounds in this process, the agent's "
        f"timing taking its turn in each; outputs of both builds match onnxruntime within "
        f"{RTOL:g} of scale)\n"
        f"tuning: {result.trials} trials in {tune_s:.0f} s over {len(result.tasks)} tasks"
        f"{f', {len(skipped)} not tunable' if skipped else ''}; the tuned build on device "
        f"{on_device.device_id}: outputs match, {device_ms}; workspace "
        f"{tuned.workspace_bytes / 2**20:.2f} MB; records in "
        f"{shown_records}"
    )
    return 0


def agent_row(device_id: str, agent_s: float, ort_s: float, threads: int) -> list[str]:
    """The table's row of the agent's figure: its ratio to onnxruntime's one-thread time only
    when the device runs one thread too (with `--cores 0-1` a two-thread figure against one
    thread read "1.61x"; `benchmarks/cores.py` compares at equal threads)."""
    if threads == 1:
        label = f"kiln, tuned, timed by the agent ({device_id})"
        return [label, f"{agent_s * 1e3:.2f}", f"{ort_s / agent_s:.2f}x"]
    return [
        f"kiln, tuned, timed by the agent on {threads} threads ({device_id})",
        f"{agent_s * 1e3:.2f}",
        f"- ({threads} threads against 1)",
    ]


def _sgemm_build_target(args: argparse.Namespace, best_target: str, emulated: bool) -> str:
    """The compile target the demo's pool built the best config for: --target, else "host"
    when the record's target is this machine's class (what a local pool like this one gets),
    else the record's."""
    from compiler.toolchain import host_target_name

    if getattr(args, "target", None):
        return str(args.target)
    return "host" if best_target == host_target_name() and not emulated else best_target


def cmd_sgemm_demo(args: argparse.Namespace) -> int:
    """Tune one sgemm (dense, packed B) on a local pool, then time its best kernel against
    numpy's matmul interleaved in one process (`tuner.peer.interleaved_matmul_seconds`)."""
    from compiler.toolchain import get_target
    from kiln.api import op_task
    from kiln.cli.tune_op import report as tune_report
    from kiln.cli.tune_op import tune_with_progress
    from tuner import peer
    from tuner.measure.builder import build_one
    from tuner.records import split_threads

    m, n, k = args.shape
    try:
        task = op_task("dense", (m, n, k))
    except ValueError as exc:
        raise CliError.usage(str(exc)) from None
    options = common.tune_options(args)
    print(
        f"Kiln demo: tuning sgemm (dense) {m}x{n}x{k} float32 with the {args.tuner} tuner for "
        f"{args.trials} trials on a local pool",
        file=sys.stderr,
    )
    started = time.monotonic()
    progress = tune_with_progress(args, task, options)
    wall_s = time.monotonic() - started
    best = progress.best
    assert best is not None
    print(tune_report(progress))
    target = _sgemm_build_target(args, split_threads(best.target)[0], best.result.emulated)
    versus: peer.Interleaved | None = None
    if not get_target(target).is_cross:
        # the config's index is of the space for the record's threads; numpy runs one thread
        built = build_one(task.workload, best.config_index, target, best.threads)
        if built.artifact is None:
            raise CliError(f"the best config {best.config_index} does not build: {built.error}")
        print(
            f"timing the best config against numpy's matmul, interleaved in one process "
            f"({SGEMM_ROUNDS} rounds)",
            file=sys.stderr,
        )
        knobs = dict(best.knobs)
        try:
            versus = peer.interleaved_matmul_seconds(
                built.artifact,
                "dense",
                (m, n, k),
                knobs,
                rounds=SGEMM_ROUNDS,
                min_round_s=SGEMM_MIN_ROUND_S,
                rtol=RTOL,
            )
        except peer.KernelMismatch as exc:
            raise CliError(f"the best config {best.config_index} is refused: {exc}") from None
        except RuntimeError as exc:
            raise CliError(str(exc)) from None
    dash = "-"
    print()
    print(
        table.render(
            [
                "trials",
                "errors",
                "best GFLOP/s",
                "numpy GFLOP/s (1 thread)",
                "ours / numpy",
                "tuning wall s",
                "model share",
                "best GFLOP/s in tuning",
                "measured on",
            ],
            [
                [
                    str(progress.trials),
                    str(progress.errors),
                    f"{task.flop / versus.ours_median_s / 1e9:.1f}" if versus else dash,
                    f"{task.flop / versus.numpy_median_s / 1e9:.1f}" if versus else dash,
                    f"{versus.ratio:.2f}x" if versus else dash,
                    f"{wall_s:.1f}",
                    f"{progress.model_share:.1%}",
                    f"{best.gflops:.1f}",
                    best.result.device_id,
                ]
            ],
        )
    )
    if versus is None:
        print(f"(built for {target}, which this machine does not run: not compared with numpy)")
    else:
        print(
            f"(best config {best.config_index} and numpy's matmul interleaved in one process, "
            f"{versus.rounds} rounds, one thread on core {versus.core}: medians "
            f"{versus.ours_median_s * 1e3:.3f} ms ours, {versus.numpy_median_s * 1e3:.3f} ms "
            f"numpy; outputs match numpy's within {RTOL:g} of scale. \"in tuning\": the agent's "
            f"figure for the best record)"
        )
    return 0

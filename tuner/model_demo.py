"""`kiln demo`: the whole story on a local pool, from an ONNX model to a tuned, checked build.

1. Build the model (ResNet-18 by default) as ONNX with seeded weights and import it.
2. Start a local pool (tracker + agent) and tune every task of the model within `--trials`
   (the gradient task scheduler hands them out; each task's fastest configs are measured again
   at the end), with the records in `--records` or a temporary file.
3. Build the model twice, with the builder's default configs (untuned) and with the best
   recorded configs (tuned), and run the tuned build on the pool's device: its outputs are
   checked against onnxruntime's (1e-4 of the output's scale) and its latency is timed there.
4. With the pool stopped, time the untuned build, the tuned build and onnxruntime (one intra-op
   thread) in this process on one core, interleaved in rounds, and print the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuner import table
from tuner.model_cli import ModelCliError, report, tune_from_args
from tuner.model_tuning import configs_from_records, model_tasks
from tuner.record_store import FileRecords
from tuner.runner.pool import PoolConfig

if TYPE_CHECKING:
    import onnx

RTOL = 1e-4
ROUNDS = 5
MIN_ROUND_S = 0.2


@dataclass
class _Timed:
    label: str
    call: Callable[[], None]
    times_s: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)


DEMO_MODELS = ("resnet18", "mobilenet_v2", "bert_tiny")  # compiler.models' (onnx loads slowly)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The model demo's own flags (the tuning flags are added by the caller)."""
    p.add_argument(
        "--model",
        default="resnet18",
        choices=DEMO_MODELS,
        help="the model to tune (default resnet18)",
    )
    p.add_argument("--image", type=int, default=224, help="image side for the CNNs")
    p.add_argument("--seq", type=int, default=128, help="sequence length for bert_tiny")


def _proto(args: argparse.Namespace) -> onnx.ModelProto:
    from compiler import models

    if args.model == "bert_tiny":
        return models.build(args.model, seq=args.seq)
    return models.build(args.model, image=args.image)


def cmd_model_demo(args: argparse.Namespace) -> int:
    from compiler import models
    from compiler.frontend.onnx import from_onnx
    from compiler.graph.build_model import build_model
    from tuner import cli
    from tuner.model_run import ModelRunError, run_model
    from tuner.model_timing import NativeModel, OrtPeer, loop_seconds, output_mismatch, seeded_feeds
    from tuner.runner.pool import NoDeviceError

    cli._check_tuning_args(args)
    if args.image < 8 or args.seq < 1:
        raise cli.UsageError(f"--image must be >= 8 and --seq >= 1, got {args.image}, {args.seq}")
    proto = _proto(args)
    graph = from_onnx(proto)
    tunable, skipped = model_tasks(graph)
    feeds = seeded_feeds(proto, args.seed, models.BERT_VOCAB)
    print(
        f"Kiln demo: {args.model} ({len(graph.nodes)} ONNX-level nodes, {len(tunable)} tuning "
        f"tasks) tuned with the {args.tuner} tuner for up to {args.trials} trials on a local pool",
        file=sys.stderr,
    )
    with ExitStack() as stack:
        if args.records:
            records_path = Path(args.records)
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kiln-demo-"))
            records_path = Path(tmp) / "records.jsonl"
        store = FileRecords(records_path)
        stack.callback(store.close)
        local = cli.local_pool(args, stack)
        print(
            f"  local pool: tracker {local.tracker_address}, agent {local.agent_addresses[0]}",
            file=sys.stderr,
        )
        pool = PoolConfig(tracker=local.tracker_address, key=local.key, token=local.client_token)
        runner, builder = cli.runner_and_builder(args, pool)
        stack.callback(builder.close)
        stack.callback(runner.close)
        started = time.monotonic()
        result = tune_from_args(args, graph, runner, builder, store)
        tune_s = time.monotonic() - started
        print(report(result))
        configs = configs_from_records(graph, store, args.target)
        untuned = build_model(graph, None, args.target)
        tuned = build_model(graph, configs, args.target)
        try:
            on_device = run_model(tuned, feeds, runner)
        except (ModelRunError, NoDeviceError) as exc:
            raise ModelCliError(f"running the tuned build on the pool: {exc}") from None
    peer = OrtPeer(proto, feeds)
    reference = peer.run()
    why = output_mismatch(list(on_device.outputs), reference, RTOL)
    if why is not None:
        raise ModelCliError(f"the tuned build's outputs differ from onnxruntime's: {why}")
    natives = {"untuned": NativeModel(untuned, feeds), "tuned": NativeModel(tuned, feeds)}
    for label, native in natives.items():
        why = output_mismatch(native.run(), reference, RTOL)
        if why is not None:
            raise ModelCliError(f"the {label} build's outputs differ from onnxruntime's: {why}")
    timed = [
        _Timed(
            f"kiln, untuned ({len(tunable)} tasks on default configs)", natives["untuned"].call, []
        ),
        _Timed(f"kiln, tuned ({result.trials} trials)", natives["tuned"].call, []),
        _Timed("onnxruntime (1 thread)", peer.call, []),
    ]
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(allowed)})
    try:
        for _ in range(ROUNDS):
            for t in timed:
                t.times_s.append(loop_seconds(t.call, MIN_ROUND_S))
    finally:
        os.sched_setaffinity(0, allowed)
    ort_s = timed[-1].median_s
    rows = [[t.label, f"{t.median_s * 1e3:.2f}", f"{ort_s / t.median_s:.2f}x"] for t in timed]
    print()
    print(table.render(["build", "latency ms", "onnxruntime / this"], rows))
    lat = on_device.latency
    device_ms = f"{lat.median_s * 1e3:.2f} ms" if lat.ok else f"failed ({lat.status.value})"
    print(
        f"(one core, medians of {ROUNDS} interleaved rounds in this process; outputs of both "
        f"builds match onnxruntime within {RTOL:g} of scale)\n"
        f"tuning: {result.trials} trials in {tune_s:.0f} s over {len(result.tasks)} tasks"
        f"{f', {len(skipped)} not tunable' if skipped else ''}; the tuned build on device "
        f"{on_device.device_id}: outputs match, {device_ms}; workspace "
        f"{tuned.workspace_bytes / 2**20:.2f} MB; records in "
        f"{records_path if args.records else '(temporary)'}"
    )
    return 0

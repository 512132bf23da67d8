"""`kiln tune MODEL.onnx` and `kiln build MODEL.onnx`: tune a whole model, then compile it.

    kiln tune net.onnx --trials 512 --records r.jsonl                # a local pool
    kiln tune net.onnx --tracker HOST:PORT --key x86 --token-file pool.secrets \
        --trials 2000 --records r.jsonl --resume --input-shape x=1,3,224,224
    kiln build net.onnx --records r.jsonl -o net.kiln
    kiln run net.kiln --input x.npy --check net.onnx --output y.npy    # a local pool

`kiln tune` takes the flags of `kiln tune-op` (pool, budget, batch, tuner, records, resume,
target, measurement); `--trials` is the budget of the whole model, handed out by the task
scheduler, and `--early-stop N` retires a task after N trials without a better candidate. It
ends with a per-task table and the estimated model latency (sum of weight x best latency).
`kiln build` writes the model artifact (model.so, params.npz, model.json) with the best recorded
config of each task, and the builder's default config for tasks without records.
`kiln run` runs a built model on a device of its target (the packed `kiln_model` entry, params
embedded), checks its outputs against onnxruntime with `--check`, and prints the native latency.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tuner import table
from tuner.model_tuning import ModelTuneResult, ModelTuneStep, SearcherFactory, tune_model
from tuner.record_store import RecordStore, is_redis_url
from tuner.search import Searcher
from tuner.task import Task
from tuner.tune import TuningError

if TYPE_CHECKING:
    from compiler.graph.ir import Graph
    from tuner.builder import LocalBuilder
    from tuner.runner.pool import PoolRunner


class ModelCliError(Exception):
    """A model command cannot do its work (unreadable model, failed build): `kiln: <message>`."""


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    from tuner.cli import _shape  # lazily: tuner.cli imports this module

    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"want NAME=D,D,..., got {text!r}")
    return name, _shape(dims)


MODEL_EARLY_STOP = 200


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `tune` and `build` to the `kiln` subcommands."""
    from tuner.cli import _add_tuning_args  # lazily: tuner.cli imports this module

    t = sub.add_parser(
        "tune", help="tune every task of an ONNX model on a pool (a local one if no --tracker)"
    )
    t.add_argument("model", help="the .onnx file")
    _add_shape_arg(t)
    _add_tuning_args(t, remote=True)
    # Per task here: a task that has not improved in this many trials gives its share to others
    # (BERT-tiny's dense tasks went 1,700 trials without a gain without it).
    t.set_defaults(early_stop=MODEL_EARLY_STOP)
    for action in t._actions:
        if action.dest == "early_stop":
            action.help = (
                f"retire a task after N trials without a better candidate "
                f"(default {MODEL_EARLY_STOP})"
            )

    b = sub.add_parser("build", help="compile an ONNX model with the best configs of --records")
    b.add_argument("model", help="the .onnx file")
    b.add_argument("--records", required=True, metavar="PATH|URL", help="records of `kiln tune`")
    b.add_argument("-o", "--output", required=True, help="directory to write the artifact into")
    b.add_argument("--target", default="host", help="what to compile for (as `kiln tune`)")
    _add_shape_arg(b)

    r = sub.add_parser(
        "run", help="run a built model on a device of the pool (a local one if no --tracker)"
    )
    r.add_argument("model", help="the directory `kiln build` wrote")
    r.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="[NAME=]X.npy",
        help="a model input; without NAME=, the next input in model order (repeatable)",
    )
    r.add_argument("--output", default=None, help=".npy for one output (.npz with several)")
    r.add_argument("--check", default=None, metavar="MODEL.onnx", help="compare with onnxruntime")
    r.add_argument("--repeat", type=int, default=5, help="latency samples (default 5)")
    r.add_argument("--tracker", default="", help="HOST:PORT; omitted: start a local pool")
    r.add_argument("--key", default="", help="device key to lease (required with --tracker)")
    r.add_argument("--tag", action="append", default=[], help="k=v a device must carry")
    _add_security(r)
    r.set_defaults(devices=1)


def _add_security(p: argparse.ArgumentParser) -> None:
    from tuner.cli import _add_security_args  # lazily: tuner.cli imports this module

    _add_security_args(p)


def _add_shape_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--input-shape",
        type=_input_shape,
        action="append",
        default=[],
        metavar="NAME=D,D,...",
        help="static shape of a model input with symbolic dims, e.g. x=1,3,224,224 (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "tune": cmd_tune,
        "build": cmd_build,
        "run": cmd_run,
    }
    return commands[args.command](args)


def _load(args: argparse.Namespace) -> Graph:
    from compiler.frontend.onnx import load_onnx  # onnx is slow to import; only these need it
    from compiler.graph.ir import GraphError

    try:
        return load_onnx(args.model, dict(args.input_shape))
    except GraphError as exc:
        hint = " (give it with --input-shape NAME=D,D,...)" if "symbolic" in str(exc) else ""
        raise ModelCliError(f"{exc}{hint}") from None


def _searcher_factory(args: argparse.Namespace, store: RecordStore | None) -> SearcherFactory:
    """Each task's searcher as `kiln tune-op` makes it, transfer from other records included."""
    from tuner import cli

    def factory(task: Task, valid: Callable[[int], bool]) -> Searcher:
        transfer = None
        if args.tuner == "xgb" and args.transfer and store is not None:
            transfer = cli._transfer_from(store, task, args.seed, args.target)
        return cli.make_searcher(args.tuner, task, args.seed, transfer, args.target, valid)

    return factory


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if math.isfinite(seconds) else "-"


def _progress(step: ModelTuneStep) -> None:
    a = step.allocation
    task_best = _ms(step.task_best_s) if step.task_best_s is not None else "-"
    print(
        f"[{step.trials}/{step.total_trials}] {a.task} ({a.reason}): {a.trials} trials, "
        f"{a.failures} failed; task best {task_best} ms; est. model {_ms(step.estimated_s)} ms",
        file=sys.stderr,
    )


def report(result: ModelTuneResult) -> str:
    """The per-task table, the tasks not tuned and the estimated model latency."""
    rows = [
        [
            t.name,
            str(t.weight),
            f"{t.trials} ({t.resumed} resumed)" if t.resumed else str(t.trials),
            f"{t.best_gflops:.1f}" if t.best else "-",
            _ms(t.estimated_s),
            t.status,
        ]
        for t in result.tasks
    ]
    lines = [table.render(["task", "weight", "trials", "best GFLOP/s", "est. ms", "status"], rows)]
    lines += [f"not tuned: {s.anchor_op} x{s.weight}: {s.note}" for s in result.skipped]
    lines.append(
        f"estimated latency: {_ms(result.estimated_s)} ms (sum of weight x best over "
        f"{len(result.tasks)} tasks) after {result.trials} trials on {result.target}"
    )
    if result.schedule.stop_reason not in ("", "budget"):
        lines.append(f"stopped before the budget: {result.schedule.stop_reason}")
    return "\n".join(lines)


def tune_from_args(
    args: argparse.Namespace,
    graph: Graph,
    runner: PoolRunner,
    builder: LocalBuilder,
    store: RecordStore | None,
) -> ModelTuneResult:
    """`tune_model` with the tuning flags of `args` (`kiln tune` and `kiln demo`), progress on
    stderr; a task retires after `--early-stop` trials without gain (default MODEL_EARLY_STOP)."""
    return tune_model(
        graph,
        runner,
        builder,
        store,
        total_trials=args.trials,
        batch_size=args.batch,
        target=args.target,
        seed=args.seed,
        early_stop_per_task=args.early_stop if args.early_stop is not None else MODEL_EARLY_STOP,
        confirm=args.confirm,
        on_batch=_progress,
        resume=args.resume,
        searcher_factory=_searcher_factory(args, store),
    )


def cmd_tune(args: argparse.Namespace) -> int:
    from tuner import cli

    cli._check_tuning_args(args)
    token, tls = cli._credentials(args)
    tags = cli._tags(args.tag)
    graph = _load(args)
    with ExitStack() as stack:
        store = cli._open_records(args.records)
        if store is not None:
            stack.callback(store.close)
        pool = cli.pool_config(args, stack, token, tls, tags)
        runner, builder = cli.runner_and_builder(args, pool)
        stack.callback(builder.close)
        stack.callback(runner.close)
        try:
            result = tune_from_args(args, graph, runner, builder, store)
        except KeyboardInterrupt:
            if store is not None:
                print(
                    f"kiln: stopped; the records so far are in {store}; run again with --resume "
                    "to continue",
                    file=sys.stderr,
                )
            raise
    print(report(result))
    if result.tasks and all(t.best is None for t in result.tasks):
        raise TuningError(f"no task of {args.model} has a working candidate")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from compiler.errors import CompilerError
    from compiler.graph.build_model import build_model
    from compiler.graph.ir import GraphError
    from compiler.toolchain import BuildError, get_target
    from tuner import cli
    from tuner.model_tuning import configs_from_records, model_tasks

    try:
        get_target(args.target)
    except BuildError as exc:
        raise cli.UsageError(f"--target: {exc}") from None
    if not is_redis_url(args.records) and not Path(args.records).is_file():
        raise cli.UsageError(f"--records {args.records}: no such file")
    graph = _load(args)
    store = cli._open_records(args.records)
    assert store is not None
    try:
        configs = configs_from_records(graph, store, args.target)
    finally:
        store.close()
    tunable, skipped = model_tasks(graph)
    try:
        artifact = build_model(graph, configs, args.target)
    except (GraphError, CompilerError) as exc:
        raise ModelCliError(f"building {args.model}: {exc}") from None
    out = artifact.save(args.output)
    print(artifact.summary)
    print(
        f"wrote {out}: {len(configs)} of {len(tunable)} tunable tasks tuned from {args.records}, "
        f"{len(tunable) - len(configs)} with default configs, {len(skipped)} not tunable"
    )
    return 0


def _feeds(args: argparse.Namespace, names: list[str]) -> dict[str, np.ndarray]:
    """The --input arrays by input name (unnamed ones fill the model's inputs in order)."""
    from tuner import cli

    feeds: dict[str, np.ndarray] = {}
    unnamed = iter(n for n in names)
    for item in args.input:
        name, sep, path = item.rpartition("=")
        if not sep:
            name = next((n for n in unnamed if n not in feeds), "")
            if not name:
                raise cli.UsageError(f"--input {item}: the model has only inputs {names}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise cli.UsageError(f"--input {item}: cannot read {path}: {exc}") from None
    return feeds


def _reference(path: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


def cmd_run(args: argparse.Namespace) -> int:
    from compiler.graph.build_model import ModelArtifact
    from tuner import cli
    from tuner.measure import EvaluatorConfig
    from tuner.model_run import ModelRunError, check_feeds, run_model
    from tuner.runner.pool import NoDeviceError, PoolRunner

    if args.repeat < 1:
        raise cli.UsageError(f"--repeat must be >= 1, got {args.repeat}")
    if not (Path(args.model) / "model.json").is_file():
        raise cli.UsageError(f"{args.model}: not a model directory (no model.json)")
    if args.check and not Path(args.check).is_file():
        raise cli.UsageError(f"--check {args.check}: no such file")
    model = ModelArtifact.load(args.model)
    feeds = _feeds(args, [s.name for s in model.inputs])
    try:
        check_feeds(model.inputs, feeds)  # before a local pool starts: bad input fails fast
    except ModelRunError as exc:
        raise ModelCliError(str(exc)) from None
    # as the model takes them (onnxruntime wants the model's dtypes too)
    feeds = {s.name: np.asarray(feeds[s.name]).astype(s.dtype) for s in model.inputs}
    token, tls = cli._credentials(args)
    tags = cli._tags(args.tag)
    with ExitStack() as stack:
        pool = cli.pool_config(args, stack, token, tls, tags)
        runner = PoolRunner(pool, EvaluatorConfig(repeat=args.repeat))
        stack.callback(runner.close)
        try:
            result = run_model(model, feeds, runner)
        except (ModelRunError, NoDeviceError) as exc:
            raise ModelCliError(str(exc)) from None
    if args.output:
        if len(result.outputs) == 1:
            np.save(args.output, result.outputs[0])
        else:
            named = dict(zip((s.name for s in model.outputs), result.outputs, strict=True))
            np.savez(args.output, **named)  # type: ignore[arg-type]
    lat = result.latency
    rows = [[f"{i}", _ms(s)] for i, s in enumerate(lat.samples_s)]
    print(table.render(["repeat", "ms"], rows))
    if not lat.ok:
        raise ModelCliError(f"timing on {result.device_id} failed: {lat.status.value}: {lat.error}")
    print(f"latency: {_ms(lat.median_s)} ms median of {len(lat.samples_s)} on {result.device_id}")
    if args.check:
        want = _reference(args.check, feeds)
        for spec, got, ref in zip(model.outputs, result.outputs, want, strict=True):
            scale = float(np.abs(ref).max()) if ref.size else 0.0
            err = float(np.abs(got.astype(np.float64) - ref).max()) if ref.size else 0.0
            if got.shape != ref.shape or err > 1e-4 * max(scale, 1e-30):
                raise ModelCliError(
                    f"output {spec.name!r} differs from onnxruntime: max abs error {err:.3g} "
                    f"(scale {scale:.3g}, shape {list(got.shape)} vs {list(ref.shape)})"
                )
        print(f"check: {len(want)} output(s) match onnxruntime (rel 1e-4)")
    return 0

"""`kiln tune MODEL.onnx`, `kiln build MODEL.onnx`, `kiln run MODEL_DIR`: a whole network.

`kiln tune` takes the flags of `kiln tune-op` (pool, budget, search, records, resume, target,
measurement); `--trials` is the budget of the whole network, handed out by the task scheduler,
and `--early-stop N` retires a task after N trials without a better candidate. It ends with a
per-task table and the estimated network latency (sum of weight x best latency). On a key of
GPUs (target cuda/sm=N) the tasks are the GPU model build's template tasks (cuda_conv2d,
cuda_dense, ...), and after the table the GPU model is built from the records (as `kiln build
--target cuda/sm=N` builds it), run on seeded inputs and timed on the pool's device, and its
outputs compared with onnxruntime's; not on an emulated device (a fake driver computes nothing:
the check is off and says so).
`kiln build` writes the model artifact (model.so, params.npz, model.json) with the best recorded
config of each task, and the builder's default config for tasks without records.
`kiln run` runs a built model on a device of its target (the packed `kiln_model` entry, params
embedded), checks its outputs against onnxruntime with `--check`, and prints the native latency.
With `--target cuda/sm=N`, `kiln build` writes a GPU model instead (model.kcud, model.json: one
CUDA container whose `kiln_model` entry launches every kernel, `build_model_cuda`), its GPU
templates' configs from the records `kiln tune-op` made on such a GPU; `kiln run` sends it to a
`cuda` device, which times the whole launch sequence (no threads to choose there).

Threads: `kiln build --threads N` records N in model.json (`ModelArtifact.threads`), and
`kiln run` runs the model on N threads, as it was tuned and built. A local pool's device is
started on N cores (the first N this process may use, or `--cores SET` of N cores); on a
tracker, only devices tagged threads=N are leased (a `--tag threads=...` of the user's stands).
A device with another thread count would run the kernels correctly but not as they were tuned,
and its latency would not be the build's, so that is an error naming both counts, never a
silent run; so is a machine with fewer than N cores for a local run.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from contextlib import ExitStack, closing
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kiln.cli import common, table
from kiln.cli.errors import CliError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from compiler.graph.build_model import ModelArtifact, TensorSpec
    from compiler.graph.ir import Graph
    from kiln.pool import Pool
    from tuner.network.tune import ModelTuneResult, ModelTuneStep
    from tuner.records import RecordStore

EXAMPLES = """examples:
  kiln tune net.onnx --trials 512 --records r.jsonl                # a local pool
  kiln tune net.onnx --tracker HOST:PORT --key x86 --token-file pool.secrets \\
      --trials 2000 --records r.jsonl --resume --input-shape x=1,3,224,224
  kiln tune net.onnx --tracker HOST:PORT --key gpu --trials 512 --records r.jsonl  # GPUs
  kiln build net.onnx --records r.jsonl -o net.kiln
  kiln run net.kiln --input x.npy --check net.onnx --output y.npy    # a local pool
"""

# Per task: a task that has not improved in this many trials gives its share to others
# (BERT-tiny's dense tasks went 1,700 trials without a gain without it).
NETWORK_EARLY_STOP = 200
# `kiln run --check`: the outputs match onnxruntime within this share of their largest value.
CHECK_RTOL = 1e-4


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `tune`, `build` and `run` to the `kiln` subcommands."""
    t = sub.add_parser(
        "tune",
        help="tune every task of an ONNX model on a pool (a local one if no --tracker)",
        epilog=EXAMPLES,
        formatter_class=common.ExamplesFormatter,
    )
    t.add_argument("model", help="the .onnx file")
    common.add_input_shape_arg(t)
    common.add_pool_args(t)
    common.add_tuning_args(t, early_stop_default=NETWORK_EARLY_STOP, caches=True)
    t.set_defaults(func=cmd_tune)

    b = sub.add_parser("build", help="compile an ONNX model with the best configs of --records")
    b.add_argument("model", help="the .onnx file")
    b.add_argument("--records", required=True, metavar="PATH|URL", help="records of `kiln tune`")
    b.add_argument("-o", "--output", required=True, help="directory to write the artifact into")
    b.add_argument(
        "--target",
        default="host",
        help="what to compile for: host (default), a named target, or a GPU (cuda/sm=90)",
    )
    b.add_argument(
        "--threads",
        type=common.positive_int,
        default=None,
        metavar="N",
        help="threads each kernel runs on (default: the count --target carries, "
        "'host/threads=4', else 1): only records tuned on N threads are used, and untuned "
        "kernels run their outer loops on N threads",
    )
    common.add_input_shape_arg(b)
    b.set_defaults(func=cmd_build)

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
    r.add_argument(
        "--in-process",
        action="store_true",
        help="also time the build in this process on one core (a build for this machine) and "
        "print it beside the device's figure",
    )
    common.add_pool_args(r, local_devices=False)
    r.set_defaults(func=cmd_run)


def _load(args: argparse.Namespace) -> Graph:
    from compiler.frontend.onnx import load_onnx  # onnx is slow to import; only these need it
    from compiler.graph.ir import GraphError

    try:
        return load_onnx(args.model, dict(args.input_shape))
    except GraphError as exc:
        hint = " (give it with --input-shape NAME=D,D,...)" if "symbolic" in str(exc) else ""
        raise CliError(f"{exc}{hint}") from None


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
    if result.transfer:
        lines.append(
            f"transfer: {len(result.transfer)} of {len(result.tasks)} tasks began from a model "
            "of the records of other workloads (--no-transfer: off)"
        )
    emulated = any(t.best is not None and t.best.result.emulated for t in result.tasks)
    lines.append(
        f"estimated latency: {_ms(result.estimated_s)} ms (sum of weight x best over "
        f"{len(result.tasks)} tasks) after {result.trials} trials on {result.target}"
        + (" (emulated: not the device's speed)" if emulated else "")
    )
    half = [(t, s) for t, s in result.curve if t <= result.trials // 2 and math.isfinite(s)]
    if half and math.isfinite(result.estimated_s) and half[-1][0] < result.trials:
        t, s = half[-1]
        lines.append(
            f"the estimate after {t} trials was {_ms(s)} ms: the second half of the budget gained "
            f"{(s - result.estimated_s) / s:.1%}"
        )
    elif result.tasks and math.isfinite(result.estimated_s):
        first = next((t for t, s in result.curve if math.isfinite(s)), result.trials)
        lines.append(
            f"the first estimate came at {first} of {result.trials} trials, once every task had "
            "a measured config: this budget is about one round per task, and more trials would "
            "tune each further"
        )
    if result.schedule.stop_reason not in ("", "budget"):
        lines.append(f"stopped before the budget: {result.schedule.stop_reason}")
    return "\n".join(lines)


def tune_network_from_args(
    args: argparse.Namespace, graph: Graph, stack: ExitStack, gpu: bool = False
) -> tuple[ModelTuneResult, Pool]:
    """Tune `graph` as the flags say (`kiln tune` and `kiln demo`), progress on stderr; the
    result and the pool it ran on. The pool, builder and store live on `stack`.

    Raises:
        CliError: the pool's devices are GPUs and `gpu` is False (the demo's builds are CPU
            models, timed in this process).
    """
    from compiler.build_cuda import is_cuda_target
    from tuner.network.tune import tune_network

    options = common.fit_pipeline(args, common.tune_options(args))
    store = common.open_records(args.records)
    if store is not None:
        stack.callback(store.close)
    pool = common.open_pool(args, stack, pin=args.pipeline)
    if not gpu and is_cuda_target(pool.target):
        raise CliError.usage(
            f"the devices run {pool.target}: this command builds and times CPU models; "
            "`kiln tune MODEL.onnx --key KEY` tunes a model on GPUs"
        )
    builder = common.builder(args, pool)
    stack.callback(builder.close)
    try:
        # closed on return: it keeps its leases between batches, and the demo runs the build next
        param_bytes = sum(int(c.nbytes) for c in graph.constants.values())
        timing = common.evaluator(args, common.times_cold(args, cpu_measured(pool), param_bytes))
        with closing(pool.runner(timing)) as runner:
            result = tune_network(graph, builder, runner, options, store=store, on_batch=_progress)
    except KeyboardInterrupt:
        if store is not None:
            print(
                f"kiln: stopped; the records so far are in {store}; run again with --resume "
                "to continue",
                file=sys.stderr,
            )
        raise
    return result, pool


def cpu_measured(pool: Pool) -> bool:
    """Whether `pool`'s devices time kernels natively on a CPU, where cold timing applies (a
    GPU flushes its own L2, an accelerator simulator counts cycles, and an emulated device
    would sweep the caches at the emulator's pace)."""
    from compiler.build_cuda import is_cuda_target
    from tuner.measure.device_target import is_vta_target

    return not (is_cuda_target(pool.target) or is_vta_target(pool.target) or pool.emulated)


def cmd_tune(args: argparse.Namespace) -> int:
    from compiler.build_cuda import is_cuda_target

    common.tune_options(args)  # bad flags fail before the model is read
    graph = _load(args)
    with ExitStack() as stack:
        result, pool = tune_network_from_args(args, graph, stack, gpu=True)
        print(report(result))
        if result.tasks and all(t.best is None for t in result.tasks):
            raise CliError(f"no task of {args.model} has a working candidate")
        if is_cuda_target(pool.target):  # on the pool while it is open
            run_gpu_model(args, graph, result, pool)
    return 0


def _seeded_inputs(specs: Sequence[TensorSpec], seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs of a model's input specs: N(0, 1) floats, integers in [0, 2) (valid
    indices of any embedding), False / True."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for s in specs:
        if np.dtype(s.dtype).kind == "f":
            feeds[s.name] = rng.standard_normal(s.shape).astype(s.dtype)
        else:
            feeds[s.name] = rng.integers(0, 2, s.shape).astype(s.dtype)
    return feeds


def run_gpu_model(
    args: argparse.Namespace, graph: Graph, result: ModelTuneResult, pool: Pool
) -> None:
    """`kiln tune` on GPUs, after the table: build the GPU model with the best configs (of
    --records as `kiln build --target cuda/sm=N` takes them, else of this run), run it once on
    seeded inputs on the pool's device and time its whole launch sequence there; compare its
    outputs with onnxruntime's, except on an emulated device (a fake driver computes nothing).

    Raises:
        CliError: the build, the run or the comparison failed.
    """
    from compiler.errors import CompilerError
    from compiler.graph.build_model_cuda import build_model_cuda
    from compiler.graph.ir import GraphError
    from kiln.api import gpu_model_configs
    from tuner.measure.pool_runner import NoDeviceError
    from tuner.network.run import ModelRunError, run_model
    from tuner.network.timing import output_mismatch
    from tuner.task import Task

    target = pool.target
    store = common.open_records(args.records)
    try:
        if store is not None:
            configs = gpu_model_configs(graph, store, target)
            source = f"the best records of {args.records}"
        else:
            configs = {
                t.spec.key: Task(t.best.workload).space.get(t.best.config_index)
                for t in result.tasks
                if t.best is not None
            }
            source = "the best of this run"
        model = build_model_cuda(graph, target, configs)
    except (GraphError, CompilerError) as exc:
        raise CliError(f"building {args.model} for {target}: {exc}") from None
    finally:
        if store is not None:
            store.close()
    print(model.summary)
    print(f"built with {source}: {len(configs)} of {len(model.tasks)} template tasks tuned")
    feeds = _seeded_inputs(model.inputs, args.seed)
    try:
        with closing(pool.runner(common.evaluator(args))) as runner:
            ran = run_model(model, feeds, runner)  # type: ignore[arg-type]
    except (ModelRunError, NoDeviceError) as exc:
        raise CliError(f"running the tuned model on the pool: {exc}") from None
    lat = ran.latency
    if not lat.ok:
        raise CliError(f"timing on {ran.device_id} failed: {lat.status.value}: {lat.error}")
    emulated = pool.device_tags.get("emulated")
    timed = f"emulated by {emulated}, not a GPU's time" if emulated else "CUDA events"
    print(
        f"tuned model on {ran.device_id}: {_ms(lat.median_s)} ms median of "
        f"{len(lat.samples_s)} ({model.launches} launches; {timed})"
    )
    if emulated:
        print(f"check: off ({emulated} computes no outputs; `kiln run --check` on a real GPU)")
        return
    want = _reference(args.model, feeds)
    why = output_mismatch(list(ran.outputs), want, CHECK_RTOL)
    if why is not None:
        raise CliError(f"the tuned model's outputs differ from onnxruntime's: {why}")
    print(f"check: {len(want)} output(s) match onnxruntime (rel {CHECK_RTOL:g})")


def cmd_build(args: argparse.Namespace) -> int:
    from compiler.build_cuda import is_cuda_target
    from compiler.errors import CompilerError
    from compiler.graph.build_model import build_model
    from compiler.graph.ir import GraphError
    from tuner.network.tune import configs_from_records, model_tasks
    from tuner.records import split_threads

    common.check_target_name(split_threads(args.target)[0])
    store = common.open_records(args.records, must_exist=True)
    assert store is not None
    graph = _load(args)
    if is_cuda_target(split_threads(args.target)[0]):
        return _build_gpu(args, graph, store)
    try:
        configs = configs_from_records(graph, store, args.target, args.threads)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    finally:
        store.close()
    target, carried = split_threads(args.target)
    threads = carried if args.threads is None else args.threads
    tunable, skipped = model_tasks(graph, threads)
    try:
        artifact = build_model(graph, configs, target, threads)
    except (GraphError, CompilerError) as exc:
        raise CliError(f"building {args.model}: {exc}") from None
    out = artifact.save(args.output)
    print(artifact.summary)
    print(
        f"wrote {out}: {len(configs)} of {len(tunable)} tunable tasks tuned from {args.records}, "
        f"{len(tunable) - len(configs)} with default configs, {len(skipped)} not tunable; "
        f"kernels for {threads} thread(s)"
    )
    return 0


def _build_gpu(args: argparse.Namespace, graph: Graph, store: RecordStore) -> int:
    """`kiln build --target cuda/sm=N`: one CUDA container whose `kiln_model` entry runs every
    kernel of the model (`build_model_cuda`), its templates' configs from the records."""
    from compiler.errors import CompilerError
    from compiler.graph.build_model_cuda import build_model_cuda
    from compiler.graph.ir import GraphError
    from kiln.api import gpu_model_configs

    if args.threads not in (None, 1):
        raise CliError.usage(f"--threads {args.threads}: a GPU build ({args.target}) has none")
    try:
        configs = gpu_model_configs(graph, store, args.target)
        model = build_model_cuda(graph, args.target, configs)
    except (GraphError, CompilerError) as exc:
        raise CliError(f"building {args.model}: {exc}") from None
    finally:
        store.close()
    out = model.save(args.output)
    print(model.summary)
    print(
        f"wrote {out}: {len(configs)} of {len(model.tasks)} GPU template tasks tuned from "
        f"{args.records}, the others with default configs; one entry of {model.launches} launches"
    )
    untuned = [t for t in model.tasks if t.key not in configs]
    if untuned:
        print("untuned (kiln tune-op TEMPLATE --shape SHAPE on a pool of these GPUs):")
        for t in untuned:
            print(f"  {t.template} {','.join(map(str, t.workload))} (x{t.weight})")
    return 0


def _feeds(args: argparse.Namespace, names: list[str]) -> dict[str, np.ndarray]:
    """The --input arrays by input name (unnamed ones fill the model's inputs in order)."""
    feeds: dict[str, np.ndarray] = {}
    unnamed = iter(n for n in names)
    for item in args.input:
        name, sep, path = item.rpartition("=")
        if not sep:
            name = next((n for n in unnamed if n not in feeds), "")
            if not name:
                raise CliError.usage(f"--input {item}: the model has only inputs {names}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise CliError.usage(f"--input {item}: cannot read {path}: {exc}") from None
    return feeds


def _reference(path: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


def in_process_seconds(model: ModelArtifact, feeds: dict[str, np.ndarray], rounds: int) -> float:
    """Median seconds per call of `model` run in this process on one core (`one_core`), over
    `rounds` rounds of 0.2 s (`interleaved_rounds`), as `kiln demo` times its builds."""
    import statistics

    from tuner.network.timing import NativeModel, interleaved_rounds, one_core

    with one_core():
        native = NativeModel(model, feeds)
        times = interleaved_rounds([("model", native.call)], max(rounds, 1), 0.2)
    return statistics.median(times["model"])


def select_threads(args: argparse.Namespace, threads: int) -> bool:
    """Set the pool flags so that `kiln run` gets a device of `threads` threads (module doc):
    a local device on `threads` cores, or the tag threads=N on a tracker; whether that tag was
    added.

    Raises:
        CliError: --cores sets of another size, or fewer usable cores than `threads` here.
    """
    built = f"{args.model} was built for {threads} thread(s) (kiln build --threads {threads})"
    if args.tracker:
        if threads > 1 and not any(t.partition("=")[0] == "threads" for t in args.tag):
            args.tag = [*args.tag, f"threads={threads}"]
            return True
        return False
    sets = common.local_core_sets(args)
    other = sorted({len(cores) for cores in sets} - {threads})
    if other:
        raise CliError.usage(
            f"{built}, but --cores gives a device {other[0]} core(s): give a set of {threads} "
            f"or rebuild with --threads {other[0]}"
        )
    if sets or threads == 1:
        return False  # a device without a core set runs one thread
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < threads:
        raise CliError(
            f"{built}, but this process may use only {len(usable)} core(s) ({usable}): "
            f"rebuild with --threads {len(usable)}, or run it on a pool (--tracker) with "
            f"devices of {threads} threads"
        )
    args.cores = [",".join(map(str, usable[:threads]))]
    return False


def check_threads(args: argparse.Namespace, pool: Pool, threads: int) -> None:
    """Refuse a pool whose matching devices run another thread count than the model's."""
    if pool.thread_counts == (threads,):
        return
    runs = " or ".join(map(str, pool.thread_counts))
    fix = (
        f"--tag threads={threads} (kiln-agent --cores with a set of {threads} cores)"
        if threads > 1 or len(pool.thread_counts) > 1
        else "devices of one thread (kiln-agent without --cores)"
    )
    raise CliError(
        f"{args.model} was built for {threads} thread(s) (kiln build --threads {threads}), "
        f"but the matching devices of key {pool.key!r} run {runs} thread(s): its kernels would "
        f"not run as tuned and the latency would not be the build's; lease {fix}, or rebuild "
        f"with --threads {pool.thread_counts[0]}"
    )


def cmd_run(args: argparse.Namespace) -> int:
    from compiler.graph.build_model_cuda import CudaModelArtifact
    from kiln.api import load_model
    from tuner.measure.pool_runner import NoDeviceError
    from tuner.measure.result import NOISY_SPREAD
    from tuner.network.run import ModelRunError, check_feeds, run_model
    from tuner.network.timing import output_mismatch

    timing = common.evaluator(args)
    if not (Path(args.model) / "model.json").is_file():
        raise CliError.usage(f"{args.model}: not a model directory (no model.json)")
    if args.check and not Path(args.check).is_file():
        raise CliError.usage(f"--check {args.check}: no such file")
    model = load_model(args.model)
    gpu = isinstance(model, CudaModelArtifact)  # one device of its target, no threads to pick
    if gpu and args.in_process:
        raise CliError.usage(f"--in-process: {args.model} is built for {model.artifact.target}")
    feeds = _feeds(args, [s.name for s in model.inputs])
    try:
        check_feeds(model.inputs, feeds)  # before a local pool starts: bad input fails fast
    except ModelRunError as exc:
        raise CliError(str(exc)) from None
    # as the model takes them (onnxruntime wants the model's dtypes too)
    feeds = {s.name: np.asarray(feeds[s.name]).astype(s.dtype) for s in model.inputs}
    threads = 1 if isinstance(model, CudaModelArtifact) else model.threads
    tagged = not gpu and select_threads(args, threads)
    if args.in_process:
        import platform

        from protos.hostinfo import cpu_tags
        from tuner.measure.device_target import TargetError, check_target

        host = {"arch": platform.machine(), **cpu_tags()}  # what an agent here would say
        try:
            check_target(model.artifact.target, host, "this machine")
        except TargetError as exc:
            raise CliError.usage(f"--in-process: {exc}") from None
    with ExitStack() as stack:
        args.target = model.artifact.target
        try:
            pool = common.open_pool(args, stack)
        except NoDeviceError as exc:
            if not tagged:
                raise
            raise CliError(
                f"{exc} ({args.model} was built for {threads} thread(s): a tracker's "
                f"device runs that many with kiln-agent --cores and a set of {threads} "
                "cores; or rebuild with --threads N for the devices there are)"
            ) from None
        if not gpu:
            check_threads(args, pool, threads)
        runner = stack.enter_context(closing(pool.runner(timing)))
        try:
            # a GPU model has what run_model reads: the artifact, its entry, the I/O specs
            result = run_model(model, feeds, runner)  # type: ignore[arg-type]
        except (ModelRunError, NoDeviceError) as exc:
            raise CliError(str(exc)) from None
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
        raise CliError(f"timing on {result.device_id} failed: {lat.status.value}: {lat.error}")
    noisy = f" (noisy: more than {NOISY_SPREAD:.0%})" if lat.spread > NOISY_SPREAD else ""
    built_for = model.artifact.target if gpu else f"{threads} thread(s)"
    print(
        f"latency: {_ms(lat.median_s)} ms median of {len(lat.samples_s)} on {result.device_id} "
        f"({built_for}, as built), spread {lat.spread:.1%} (interquartile range / "
        f"median){noisy}"
    )
    if args.in_process and not isinstance(model, CudaModelArtifact):
        here = in_process_seconds(model, feeds, len(lat.samples_s))
        print(
            f"in process: {_ms(here)} ms median of {len(lat.samples_s)} rounds on one core "
            f"(device / in process = {lat.median_s / here:.3f})"
        )
    if args.check:
        want = _reference(args.check, feeds)
        why = output_mismatch(list(result.outputs), want, CHECK_RTOL)
        if why is not None:
            raise CliError(f"the outputs differ from onnxruntime's: {why}")
        print(f"check: {len(want)} output(s) match onnxruntime (rel {CHECK_RTOL:g})")
    return 0

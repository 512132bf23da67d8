"""The `kiln` command line: tune an operator, list a pool's devices, read records, run the demo.

    kiln tune-op dense --shape 512,512,512 --trials 200 --records r.jsonl      # local pool
    kiln tune-op conv2d --shape 1,64,56,56,64,3,3,1,1,0 --tracker HOST:PORT --key x86 \
        --token-file pool.secrets --records redis://db:6379/0 --resume --early-stop 64
    kiln records summary r.jsonl
    kiln records plot r.jsonl -o curve.png
    kiln tune net.onnx --trials 512 --records r.jsonl    # every task of a model (model_cli)
    kiln build net.onnx --records r.jsonl -o net.kiln
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from compiler.toolchain import BuildError, get_target
from protos.auth import SecretsError, TlsFiles
from tuner import devices_view, model_cli, model_demo, models_cli, peer, records_cli, table
from tuner.builder import LocalBuilder
from tuner.local_pool import LocalPool
from tuner.measure import EvaluatorConfig
from tuner.progress import ProgressBar
from tuner.record_store import RecordStore, RecordStoreError, is_redis_url, open_store
from tuner.records import Workload
from tuner.runner.pool import PoolConfig, PoolRunner
from tuner.search import RandomSearch, Searcher
from tuner.task import Task
from tuner.tracker_client import read_client_token
from tuner.tune import CONFIRM_TOP, TuneProgress, TuningError, target_name, tune

# index array -> scores; tuner.model_search.TransferScore, named here without importing xgboost
TransferScore = Callable[[np.ndarray], np.ndarray]

_LOG = logging.getLogger(__name__)


class UsageError(Exception):
    """Bad input on the command line: printed as `kiln: <message>`, exit status 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that a killed run stops its local pool and keeps its records."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


# Short names for templates whose registered names carry their layout.
OP_ALIASES = {"conv2d": "conv2d_nchwc", "conv2d_1x1": "conv2d_1x1_nchwc"}
TUNERS = ("xgb", "random")
# ResNet-18's warm-up round (8 trials for each of its 16 tasks), then one confirmation each: a
# tile-4 Winograd candidate takes 6 s to lower and 7 s to compile on a 2-core Zen 3, and 256
# trials with 4 confirmations ran past 25 minutes there; this took 5 min 13 s in all (make demo,
# 2026-11-26), the tuned build at 1.36x onnxruntime.
DEMO_MODEL_TRIALS = 128
DEMO_CONFIRM = 1
DEMO_SGEMM_TRIALS = 64


def _checked_task(workload: Workload) -> Task:
    """The task of a workload, or a UsageError naming what is wrong with the op or its shape."""
    op = OP_ALIASES.get(workload.op, workload.op)
    task = Task(Workload(op, workload.shape, workload.dtype))
    try:
        len(task.space)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    except ValueError as exc:
        alias = f" ({workload.op} is {op})" if op != workload.op else ""
        raise UsageError(f"{exc}{alias}") from None
    return task


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be comma-separated integers, got {text!r}"
        ) from None
    if not dims or any(d < 0 for d in dims):
        # 0 passes here: a conv's pad may be 0; the template says which fields must be positive.
        raise argparse.ArgumentTypeError(f"no dimension may be negative, got {text!r}")
    return dims


def _tags(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"--tag wants k=v, got {item!r}")
        out[k] = v
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description=__doc__)
    parser.add_argument("--log-level", default="warning")
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("tune-op", help="tune one operator on a pool (a local one if no --tracker)")
    t.add_argument(
        "op",
        help="op template: dense, matmul, conv2d (= conv2d_nchwc) or any of compiler.ops",
    )
    t.add_argument(
        "--shape",
        type=_shape,
        required=True,
        help="the workload: M,N,K for dense/matmul; N,IC,H,W,OC,KH,KW,stride,pad,epilogue for conv2d",
    )
    _add_tuning_args(t, remote=True)

    d = sub.add_parser("devices", help="list the devices of a tracker (live with --watch)")
    d.add_argument("--tracker", required=True, help="HOST:PORT")
    d.add_argument("--key", default="", help="only devices with this key")
    d.add_argument("--json", action="store_true", help="print JSON instead of a table")
    d.add_argument(
        "--watch",
        type=_positive_seconds,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )
    d.add_argument(
        "--count", type=int, default=0, help="with --watch: stop after this many refreshes"
    )
    _add_security_args(d)

    records_cli.add_parser(sub)
    models_cli.add_parser(sub)
    model_cli.add_parser(sub)

    demo = sub.add_parser(
        "demo",
        help="start a local pool, tune a model (ResNet-18), build it, check and time it against "
        "onnxruntime; --sgemm: tune one sgemm instead",
    )
    model_demo.add_arguments(demo)
    demo.add_argument(
        "--sgemm", action="store_true", help="tune one sgemm (dense, packed B) of --shape instead"
    )
    demo.add_argument("--shape", type=_shape, default=(512, 512, 512), help="M,N,K for --sgemm")
    _add_tuning_args(demo, remote=False)
    demo.set_defaults(trials=None, devices=1, confirm=DEMO_CONFIRM)
    for action in demo._actions:
        if action.dest == "trials":
            action.help = (
                f"trial budget (default {DEMO_MODEL_TRIALS} for the model, "
                f"{DEMO_SGEMM_TRIALS} with --sgemm)"
            )
        if action.dest == "confirm":
            action.help = f"re-measure the K fastest configs of each task (default {DEMO_CONFIRM})"
    return parser


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"want a positive number of seconds, got {text!r}")
    return value


def _add_security_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token-file", help="pool secrets file; its client token goes with every call")
    p.add_argument("--tls-ca", help="PEM CA that signed the tracker's and agents' certificates")
    p.add_argument("--tls-cert", help="PEM client certificate (mutual TLS)")
    p.add_argument("--tls-key", help="PEM key of --tls-cert")


def _credentials(args: argparse.Namespace) -> tuple[str | None, TlsFiles | None]:
    """(client token, TLS files) from the security flags; a bad file is a UsageError."""
    token = None
    if args.token_file:
        try:
            token = read_client_token(args.token_file)
        except SecretsError as exc:
            raise UsageError(str(exc)) from None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("a TLS client certificate needs both --tls-cert and --tls-key")
    for flag, path in (
        ("--tls-ca", args.tls_ca),
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
    ):
        if path and not Path(path).is_file():
            raise UsageError(f"{flag} {path}: no such file")
    tls = TlsFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
    return token, (tls if tls.enabled else None)


def _add_tuning_args(p: argparse.ArgumentParser, remote: bool) -> None:
    if remote:
        p.add_argument("--tracker", default="", help="HOST:PORT; omitted: start a local pool")
        p.add_argument("--key", default="", help="device key to lease (required with --tracker)")
        p.add_argument("--tag", action="append", default=[], help="k=v a device must carry")
    _add_security_args(p)
    p.add_argument("--trials", type=int, default=64, help="trial budget (resumed ones count)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tuner",
        choices=TUNERS,
        default="xgb",
        help="xgb: cost-model-guided simulated annealing (default); random: random search",
    )
    p.add_argument(
        "--early-stop",
        type=int,
        default=None,
        metavar="N",
        help="stop after N trials without a better candidate",
    )
    p.add_argument(
        "--confirm",
        type=int,
        default=CONFIRM_TOP,
        metavar="K",
        help=f"measure the K fastest configs again at the end and keep the one that holds its "
        f"speed (default {CONFIRM_TOP}; 0: off)",
    )
    p.add_argument(
        "--records",
        default=None,
        metavar="PATH|URL",
        help="append records to this JSON-lines file or redis://host:port/db[?prefix=P]",
    )
    p.add_argument(
        "--transfer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --tuner xgb and --records: let a model trained on the records of other "
        "workloads of this target pick the first candidates (default: on)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the --records of this workload and target: never re-measure them",
    )
    p.add_argument("--build-workers", type=int, default=2)
    p.add_argument(
        "--pipeline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="build the next batch while this one is measured (default: on; a local pool's "
        "devices then get cores of their own and the builds the others)",
    )
    p.add_argument(
        "--devices",
        type=int,
        default=1,
        help="measure on up to N leased devices at once (a local pool starts N devices)",
    )
    p.add_argument(
        "--per-unit", type=int, default=4, help="candidates compiled together in one gcc call"
    )
    p.add_argument(
        "--target",
        default="host",
        help="what to compile for: host (this machine, -march=native) or a named target, e.g. "
        "aarch64-neon for arm boards behind --tracker",
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--min-repeat-ms", type=float, default=20.0)
    p.add_argument(
        "--timeout-s", type=float, default=30.0, help="per-measurement limit on the device"
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        commands: dict[str, Callable[[argparse.Namespace], int]] = {
            "tune-op": cmd_tune_op,
            "devices": cmd_devices,
            "demo": cmd_demo,
            "records": records_cli.run,
            "models": models_cli.run,
            "tune": model_cli.run,
            "build": model_cli.run,
            "run": model_cli.run,
        }
        code = commands[args.command](args)
    except UsageError as exc:
        print(f"kiln: {exc}", file=sys.stderr)
        code = 2
    except (
        TuningError,
        RecordStoreError,
        records_cli.RecordsCliError,
        models_cli.ModelsCliError,
        model_cli.ModelCliError,
    ) as exc:
        print(f"kiln: {exc}", file=sys.stderr)
        code = 1
    except Terminated:
        print("kiln: terminated", file=sys.stderr)
        code = 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        code = 130
    finally:
        signal.signal(signal.SIGTERM, previous)  # main() may run inside another program
    sys.exit(code)


def make_searcher(
    name: str,
    task: Task,
    seed: int,
    transfer: TransferScore | None = None,
    target: str = "host",
    constraint: Callable[[int], bool] | None = None,
) -> Searcher:
    """The searcher `--tuner name` asks for, over the task's space.

    Both searchers skip configs the template calls implausible on `target` (a register tile that
    spills there) and, when given, those `constraint` rejects (a model's layout blocks).
    `transfer` (xgb only) scores candidates with a model pretrained on other workloads.

    Raises:
        UsageError: an unknown name, or the model-guided searcher cannot be imported.
    """
    if name not in TUNERS:
        raise UsageError(f"--tuner must be one of {', '.join(TUNERS)}, got {name!r}")
    space = task.space

    def plausible(index: int) -> bool:
        if constraint is not None and not constraint(index):
            return False
        return task.worth_measuring(index, target)

    checked = constraint is not None or hasattr(task.template, "worth_measuring")
    valid: Callable[[int], bool] | None = plausible if checked else None

    if name == "random":
        return RandomSearch(len(space), seed=seed, valid=valid)
    try:  # imported lazily: it pulls in xgboost, which `--tuner random` never needs
        from tuner.model_search import ModelSearcher
    except ImportError as exc:
        raise UsageError(f"--tuner xgb is not available here ({exc}); use --tuner random") from None
    searcher: Searcher = ModelSearcher(
        space, flop=task.flop, seed=seed, valid=valid, transfer=transfer
    )
    return searcher


def _check_tuning_args(args: argparse.Namespace) -> None:
    try:
        get_target(args.target)
    except BuildError as exc:
        raise UsageError(f"--target: {exc}") from None
    if args.trials < 1:
        raise UsageError(f"--trials must be >= 1, got {args.trials}")
    if args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")
    for flag in ("devices", "per_unit", "build_workers"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.confirm < 0:
        raise UsageError(f"--confirm must be >= 0, got {args.confirm}")
    if args.early_stop is not None and args.early_stop < 1:
        raise UsageError(f"--early-stop must be >= 1, got {args.early_stop}")
    if args.resume and not args.records:
        raise UsageError("--resume needs --records (the file or database to resume from)")


def _open_records(spec: str | None) -> RecordStore | None:
    if spec is None:
        return None
    if not is_redis_url(spec) and not Path(spec).resolve().parent.is_dir():
        raise UsageError(f"--records {spec}: directory {Path(spec).parent} does not exist")
    try:
        return open_store(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _transfer_from(
    store: RecordStore, task: Task, seed: int, args_target: str
) -> TransferScore | None:
    """A scorer pretrained on the store's records of other workloads on this host's target."""
    from tuner.transfer import TransferModel  # lazily, like the model searcher

    target = target_name(args_target)
    model = TransferModel(seed=seed)
    samples = model.fit(store.load(target=target), target, exclude=task.workload)
    if samples == 0:
        return None
    print(
        f"transfer: a model of {samples} records of {len(model.workloads)} other workloads "
        f"on {target} picks the first candidates",
        file=sys.stderr,
    )
    return model.scorer(task)


def _prepare(
    args: argparse.Namespace, task: Task, stack: ExitStack
) -> tuple[Searcher, RecordStore | None]:
    """The searcher and records store of a tuning command, made before any pool is started."""
    store = _open_records(args.records)
    if store is not None:
        stack.callback(store.close)
    transfer = None
    if args.tuner == "xgb" and args.transfer and store is not None:
        transfer = _transfer_from(store, task, args.seed, args.target)
    return make_searcher(args.tuner, task, args.seed, transfer, args.target), store


def runner_and_builder(
    args: argparse.Namespace, pool: PoolConfig
) -> tuple[PoolRunner, LocalBuilder]:
    """The pool runner and local builder the tuning flags ask for; the caller closes both."""
    evaluator = EvaluatorConfig(
        repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, timeout_s=args.timeout_s
    )
    runner = PoolRunner(pool, evaluator, devices=args.devices)
    cpus = getattr(args, "build_cpus", ())
    workers = min(args.build_workers, len(cpus)) if cpus else args.build_workers
    builder = LocalBuilder(target=args.target, workers=workers, per_unit=args.per_unit, cpus=cpus)
    return runner, builder


def local_pool(args: argparse.Namespace, stack: ExitStack) -> LocalPool:
    """A local pool of `--devices` devices started on `stack`.

    With `--pipeline` and more cores than devices, each device is pinned to a core of its own
    (the last ones) and `args.build_cpus` keeps the builds on the others, so a build running
    beside a measurement does not disturb it.
    """
    allowed = sorted(os.sched_getaffinity(0))
    pins: list[int] = []
    if getattr(args, "pipeline", False) and len(allowed) > args.devices:
        pins = allowed[-args.devices :]
        args.build_cpus = tuple(allowed[: -args.devices])
    return stack.enter_context(LocalPool(devices=args.devices, pin_cores=pins))


def _run_tuning(
    args: argparse.Namespace,
    task: Task,
    pool: PoolConfig,
    searcher: Searcher,
    store: RecordStore | None,
) -> TuneProgress:
    runner, builder = runner_and_builder(args, pool)
    bar = ProgressBar()
    try:
        return tune(
            task,
            builder,
            runner,
            n_trials=args.trials,
            batch_size=args.batch,
            searcher=searcher,
            records=store,
            resume=args.resume,
            early_stop=args.early_stop,
            on_batch=bar,
            confirm=args.confirm,
            pipeline=args.pipeline,
        )
    except KeyboardInterrupt:
        bar.close()
        last = bar.last
        if store is not None and last is not None:
            print(
                f"kiln: stopped after {last.trials} trials; their records are in "
                f"{store}; run again with --resume to continue",
                file=sys.stderr,
            )
        raise
    finally:
        bar.close()
        runner.close()
        builder.close()


def _report(progress: TuneProgress) -> None:
    best = progress.best
    assert best is not None  # tune() raises otherwise
    resumed = f", {progress.resumed} of them resumed" if progress.resumed else ""
    print(
        f"best of {progress.trials} trials{resumed}: {best.gflops:.1f} GFLOP/s "
        f"({best.result.median_s * 1e3:.3f} ms) config {best.config_index} {json.dumps(best.knobs)} "
        f"on {best.result.device_id}"
    )
    print(
        f"stopped: {progress.stop_reason}; wall {progress.wall_s:.1f} s, "
        f"build {progress.build_s:.1f} s, measure {progress.measure_s:.1f} s, "
        f"search {progress.search_s:.1f} s, model {progress.model_s:.1f} s "
        f"({100 * progress.model_share:.1f}% of wall)"
    )


def cmd_tune_op(args: argparse.Namespace) -> int:
    task = _checked_task(Workload(args.op, args.shape))
    _check_tuning_args(args)
    token, tls = _credentials(args)
    with ExitStack() as stack:
        tags = _tags(args.tag)
        searcher, store = _prepare(args, task, stack)
        pool = pool_config(args, stack, token, tls, tags)
        progress = _run_tuning(args, task, pool, searcher, store)
    _report(progress)
    return 0


def pool_config(
    args: argparse.Namespace,
    stack: ExitStack,
    token: str | None,
    tls: TlsFiles | None,
    tags: dict[str, str],
) -> PoolConfig:
    """The pool of `--tracker`/`--key`, or a local pool started on `stack` when no --tracker."""
    if args.tracker:
        if not args.key:
            raise UsageError("--key is required with --tracker")
        tracker, key = args.tracker, args.key
    else:
        local = local_pool(args, stack)
        tracker, key, token = local.tracker_address, local.key, local.client_token
        print(f"local pool: tracker {tracker}, agent {local.agent_addresses[0]}", file=sys.stderr)
    return PoolConfig(tracker=tracker, key=key, tags=tags, token=token, tls=tls)


def cmd_devices(args: argparse.Namespace) -> int:
    token, tls = _credentials(args)
    if args.count < 0:
        raise UsageError(f"--count must be >= 0, got {args.count}")
    return devices_view.run(
        args.tracker,
        key=args.key,
        as_json=args.json,
        watch_s=args.watch,
        count=args.count,
        token=token,
        tls=tls,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    if args.trials is None:
        args.trials = DEMO_SGEMM_TRIALS if args.sgemm else DEMO_MODEL_TRIALS
    if not args.sgemm:
        return model_demo.cmd_model_demo(args)
    m, n, k = args.shape
    task = _checked_task(Workload("dense", (m, n, k)))
    _check_tuning_args(args)
    print(
        f"Kiln demo: tuning sgemm (dense) {m}x{n}x{k} float32 with the {args.tuner} tuner for "
        f"{args.trials} trials on a local pool",
        file=sys.stderr,
    )
    with ExitStack() as stack:
        searcher, store = _prepare(args, task, stack)
        pool = local_pool(args, stack)
        print(
            f"  tracker pid {pool.procs[0].pid} at {pool.tracker_address}, "
            f"agent pid {pool.procs[1].pid} at {pool.agent_addresses[0]}",
            file=sys.stderr,
        )
        started = time.monotonic()
        progress = _run_tuning(
            args,
            task,
            PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token),
            searcher,
            store,
        )
        wall_s = time.monotonic() - started
    best = progress.best
    assert best is not None
    np_s = statistics.median(peer.numpy_matmul_seconds(m, n, k, threads=1))
    np_gflops = task.flop / np_s / 1e9
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
                "measured on",
            ],
            [
                [
                    str(progress.trials),
                    str(progress.errors),
                    f"{best.gflops:.1f}",
                    f"{np_gflops:.1f}",
                    f"{best.gflops / np_gflops:.2f}x",
                    f"{wall_s:.1f}",
                    f"{progress.model_share:.1%}",
                    f"{best.result.device_id} (key {pool.key}, agent {pool.agent_addresses[0]})",
                ]
            ],
        )
    )
    print(f"best config: {json.dumps(best.knobs)}")
    return 0

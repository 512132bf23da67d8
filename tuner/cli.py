"""The `kiln` command line: tune an operator, list a pool's devices, run the demo."""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

from protos.auth import SecretsError, TlsFiles
from tuner import devices_view, peer, table
from tuner.builder import LocalBuilder
from tuner.local_pool import LocalPool
from tuner.measure import EvaluatorConfig
from tuner.records import Workload
from tuner.runner.pool import PoolConfig, PoolRunner
from tuner.search import RandomSearch
from tuner.task import Task
from tuner.tracker_client import read_client_token
from tuner.tune import TuneProgress, TuningError, tune

_LOG = logging.getLogger(__name__)


class UsageError(Exception):
    """Bad input on the command line: printed as `kiln: <message>`, exit status 2."""


def _checked_task(workload: Workload) -> Task:
    """The task of a workload, or a UsageError naming what is wrong with the op or its shape."""
    task = Task(workload)
    try:
        len(task.space)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return task


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be comma-separated integers, got {text!r}"
        ) from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"every dimension must be positive, got {text!r}")
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
    t.add_argument("op", help="op template, e.g. matmul")
    t.add_argument(
        "--shape", type=_shape, required=True, help="e.g. 512,512,512 (M,N,K for matmul)"
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

    demo = sub.add_parser("demo", help="start a local pool, tune a matmul, print a table")
    demo.add_argument("--shape", type=_shape, default=(512, 512, 512))
    _add_tuning_args(demo, remote=False)
    demo.set_defaults(trials=32)
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
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--records", type=Path, default=None, help="append records to this JSON-lines file"
    )
    p.add_argument("--build-workers", type=int, default=2)
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
    try:
        code = {"tune-op": cmd_tune_op, "devices": cmd_devices, "demo": cmd_demo}[args.command](
            args
        )
    except UsageError as exc:
        print(f"kiln: {exc}", file=sys.stderr)
        code = 2
    except TuningError as exc:
        print(f"kiln: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


def _print_progress(total: int, started: float) -> Callable[[TuneProgress], None]:
    def show(p: TuneProgress) -> None:
        elapsed = time.monotonic() - started
        eta = elapsed / p.trials * (total - p.trials) if p.trials else 0.0
        print(
            f"  trials {p.trials:4d}/{total}  best {p.best_gflops:7.1f} GFLOP/s  "
            f"errors {p.errors}  elapsed {elapsed:5.1f} s  eta {eta:5.1f} s",
            file=sys.stderr,
        )

    return show


def _run_tuning(args: argparse.Namespace, task: Task, pool: PoolConfig) -> TuneProgress:
    evaluator = EvaluatorConfig(
        repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, timeout_s=args.timeout_s
    )
    runner = PoolRunner(pool, evaluator)
    builder = LocalBuilder(workers=args.build_workers)
    try:
        return tune(
            task,
            builder,
            runner,
            n_trials=args.trials,
            batch_size=args.batch,
            searcher=RandomSearch(len(task.space), seed=args.seed),
            records_path=args.records,
            on_batch=_print_progress(args.trials, time.monotonic()),
        )
    finally:
        runner.close()
        builder.close()


def cmd_tune_op(args: argparse.Namespace) -> int:
    task = _checked_task(Workload(args.op, args.shape))
    token, tls = _credentials(args)
    with ExitStack() as stack:
        tags = _tags(args.tag)
        if args.tracker:
            if not args.key:
                raise UsageError("--key is required with --tracker")
            tracker, key = args.tracker, args.key
        else:
            pool = stack.enter_context(LocalPool())
            tracker, key, token = pool.tracker_address, pool.key, pool.client_token
            print(
                f"local pool: tracker {tracker}, agent {pool.agent_addresses[0]}", file=sys.stderr
            )
        progress = _run_tuning(
            args, task, PoolConfig(tracker=tracker, key=key, tags=tags, token=token, tls=tls)
        )
    best = progress.best
    assert best is not None  # tune() raises otherwise
    print(
        f"best of {progress.trials} trials: {best.gflops:.1f} GFLOP/s "
        f"({best.result.median_s * 1e3:.3f} ms) config {best.config_index} {json.dumps(best.knobs)} "
        f"on {best.result.device_id}"
    )
    return 0


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
    m, n, k = args.shape
    task = _checked_task(Workload("matmul", (m, n, k)))
    print(
        f"Kiln demo: tuning matmul {m}x{n}x{k} float32 for {args.trials} trials on a local pool",
        file=sys.stderr,
    )
    with LocalPool() as pool:
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
                    f"{best.result.device_id} (key {pool.key}, agent {pool.agent_addresses[0]})",
                ]
            ],
        )
    )
    print(f"best config: {json.dumps(best.knobs)}")
    return 0

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

import grpc

from protos import tracker_pb2, tracker_pb2_grpc
from tuner import peer
from tuner.builder import LocalBuilder
from tuner.local_pool import LocalPool
from tuner.measure import EvaluatorConfig
from tuner.records import Workload
from tuner.runner.pool import PoolConfig, PoolRunner
from tuner.search import RandomSearch
from tuner.task import Task
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

    d = sub.add_parser("devices", help="list the devices of a tracker")
    d.add_argument("--tracker", required=True, help="HOST:PORT")
    d.add_argument("--key", default="")
    d.add_argument("--json", action="store_true")

    demo = sub.add_parser("demo", help="start a local pool, tune a matmul, print a table")
    demo.add_argument("--shape", type=_shape, default=(512, 512, 512))
    _add_tuning_args(demo, remote=False)
    demo.set_defaults(trials=32)
    return parser


def _add_tuning_args(p: argparse.ArgumentParser, remote: bool) -> None:
    if remote:
        p.add_argument("--tracker", default="", help="HOST:PORT; omitted: start a local pool")
        p.add_argument("--key", default="", help="device key to lease (required with --tracker)")
        p.add_argument("--tag", action="append", default=[], help="k=v a device must carry")
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
    with ExitStack() as stack:
        tags = _tags(args.tag)
        if args.tracker:
            if not args.key:
                raise UsageError("--key is required with --tracker")
            tracker, key = args.tracker, args.key
        else:
            pool = stack.enter_context(LocalPool())
            tracker, key = pool.tracker_address, pool.key
            print(
                f"local pool: tracker {tracker}, agent {pool.agent_addresses[0]}", file=sys.stderr
            )
        progress = _run_tuning(args, task, PoolConfig(tracker=tracker, key=key, tags=tags))
    best = progress.best
    assert best is not None  # tune() raises otherwise
    print(
        f"best of {progress.trials} trials: {best.gflops:.1f} GFLOP/s "
        f"({best.result.median_s * 1e3:.3f} ms) config {best.config_index} {json.dumps(best.knobs)} "
        f"on {best.result.device_id}"
    )
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    with grpc.insecure_channel(args.tracker) as channel:
        try:
            resp = tracker_pb2_grpc.TrackerStub(channel).ListDevices(
                tracker_pb2.ListDevicesRequest(key=args.key), timeout=10
            )
        except grpc.RpcError as exc:
            print(
                f"kiln: tracker {args.tracker}: {exc.code().name}: {exc.details()}", file=sys.stderr
            )
            return 2
    rows = [
        {
            "key": d.spec.key,
            "device": d.spec.device_id,
            "agent": d.spec.agent_address,
            "state": tracker_pb2.DeviceState.Name(d.state),
            "holder": d.lease_holder,
            "heartbeat_age_s": round(d.heartbeat_age_s, 2),
            "queue": d.queue_depth,
        }
        for d in resp.devices
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(
            _table(
                ["key", "device", "agent", "state", "holder", "heartbeat_age_s", "queue"],
                [[str(r[c]) for c in r] for r in rows],
            )
        )
    return 0


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
        progress = _run_tuning(args, task, PoolConfig(tracker=pool.tracker_address, key=pool.key))
        wall_s = time.monotonic() - started
    best = progress.best
    assert best is not None
    np_s = statistics.median(peer.numpy_matmul_seconds(m, n, k, threads=1))
    np_gflops = task.flop / np_s / 1e9
    print()
    print(
        _table(
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


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])

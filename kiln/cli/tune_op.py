"""`kiln tune-op`: tune one operator on a pool (a local one without --tracker)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from contextlib import ExitStack, closing
from typing import TYPE_CHECKING

from kiln.cli import common
from kiln.cli.errors import CliError

if TYPE_CHECKING:
    from tuner.loop import TuneProgress
    from tuner.options import TuneOptions
    from tuner.task import Task

EXAMPLES = """examples:
  kiln tune-op dense --shape 512,512,512 --trials 200 --records r.jsonl      # a local pool
  kiln tune-op conv2d --shape 1,64,56,56,64,3,3,1,1,0 --tracker HOST:PORT --key x86 \\
      --token-file pool.secrets --records redis://db:6379/0 --resume --early-stop 64
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser(
        "tune-op",
        help="tune one operator on a pool (a local one if no --tracker)",
        epilog=EXAMPLES,
        formatter_class=common.ExamplesFormatter,
    )
    t.add_argument(
        "op", help="op template: dense, matmul, conv2d (= conv2d_nchwc) or any of compiler.ops"
    )
    t.add_argument(
        "--shape",
        type=common.shape,
        required=True,
        help="the workload: M,N,K for dense/matmul; N,IC,H,W,OC,KH,KW,stride,pad,epilogue for conv2d",
    )
    common.add_pool_args(t)
    common.add_tuning_args(t)
    t.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kiln.api import op_task

    try:
        task = op_task(args.op, args.shape)
    except ValueError as exc:
        raise CliError.usage(str(exc)) from None
    options = common.fit_pipeline(args, common.tune_options(args))
    progress = tune_with_progress(args, task, options)
    print(report(progress))
    return 0


def tune_with_progress(args: argparse.Namespace, task: Task, options: TuneOptions) -> TuneProgress:
    """Tune `task` on the flags' pool with a progress bar; Ctrl-C says where the records are."""
    from kiln.api import for_target
    from kiln.cli.progress import ProgressBar
    from tuner.loop import builder_records_target, on_progress, tune
    from tuner.search import searcher_for

    with ExitStack() as stack:
        store = common.open_records(args.records)
        if store is not None:
            stack.callback(store.close)
        pool = common.open_pool(args, stack, pin=args.pipeline)
        builder = common.builder(args, pool)
        stack.callback(builder.close)
        runner = stack.enter_context(closing(pool.runner(common.evaluator(args))))
        # the space of the threads the builder builds for (the device's `threads` tag)
        task = dataclasses.replace(task, threads=int(getattr(builder, "threads", 1)))
        try:
            accel = for_target(task, builder.target)
        except ValueError as exc:
            raise CliError.usage(str(exc)) from None
        if accel is not task:
            kind = " (int8)" if accel.workload.op.startswith("vta_") else ""
            print(f"kiln: {task.workload.op} on {builder.target} tunes {accel.workload.op} "
                  f"{','.join(map(str, accel.workload.shape))}{kind}", file=sys.stderr)  # fmt: skip
            task = accel
        searcher, note = searcher_for(
            task, options, store, pool.target, builder_records_target(builder)
        )
        if note:
            print(note, file=sys.stderr)
        bar = ProgressBar(emulated=pool.emulated)
        stack.callback(bar.close)
        try:
            return tune(
                task,
                builder,
                runner,
                options,
                searcher=searcher,
                records=store,
                callbacks=[on_progress(bar)],
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


def report(progress: TuneProgress) -> str:
    """The best config (confirmed or measured once, said so) and where the time went."""
    from tuner.measure.result import NOISY_SPREAD

    best = progress.best
    assert best is not None  # tune() raises otherwise
    resumed = f", {progress.resumed} of them resumed" if progress.resumed else ""
    how = (
        f"confirmed over {progress.best_measurements} measurements"
        if progress.confirmations
        else "measured once"
    )
    emulated = " (emulated: not the real device's speed)" if best.result.emulated else ""
    wrong = progress.errors_by_status.get("WRONG_ANSWER", 0)
    checked = f"; {wrong} wrong answers caught by the check" if wrong else ""
    noisy = sum(r.result.noisy for r in progress.history)
    if noisy:
        checked += (
            f"; {noisy} noisy results (samples spread over {NOISY_SPREAD:.0%} after measuring "
            "again: a busy machine?)"
        )
    return (
        f"best of {progress.trials} trials{resumed}: {best.gflops:.1f} GFLOP/s{emulated} "
        f"({best.result.median_s * 1e3:.3f} ms, {how}) config {best.config_index} "
        f"{json.dumps(best.knobs)} on {best.result.device_id}\n"
        f"stopped: {progress.stop_reason}; wall {progress.wall_s:.1f} s, "
        f"build {progress.build_s:.1f} s, measure {progress.measure_s:.1f} s, "
        f"search {progress.search_s:.1f} s, model {progress.model_s:.1f} s "
        f"({100 * progress.model_share:.1f}% of wall){checked}"
    )

"""`kiln records summary|plot`: what a records file (or Redis records database) holds.

    kiln records summary r.jsonl                 # per workload and target: trials, OK, errors, best
                                                 # ("cold": the best was timed with caches swept)
    kiln records plot r.jsonl -o curve.png       # best-so-far GFLOP/s against trials, per workload

Both take a path or a `redis://` URL. Plotting needs matplotlib (`pip install 'kiln[plot]'`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kiln.cli import table
from kiln.cli.errors import CliError
from tuner import records as rec
from tuner.records import is_redis_url, open_store


@dataclass(frozen=True)
class PairSummary:
    """What the records of one (workload, target) say."""

    workload: rec.Workload
    target: str
    trials: int
    ok: int
    errors: dict[str, int]
    best: rec.Record | None


def group(records: Sequence[rec.Record]) -> dict[tuple[rec.Workload, str], list[rec.Record]]:
    """Records by (workload, target), in first-seen order, each list in the records' order."""
    out: dict[tuple[rec.Workload, str], list[rec.Record]] = {}
    for r in records:
        out.setdefault((r.workload, r.target), []).append(r)
    return out


def summarize(records: Sequence[rec.Record]) -> list[PairSummary]:
    """One summary per (workload, target) of `records`; confirmation runs are not trials, but
    the best counts them (`records.best`)."""
    out = []
    for (workload, target), rs in group(records).items():
        trials = [r for r in rs if not r.confirmation]
        errors = Counter(r.result.status.value for r in trials if not r.result.ok)
        out.append(
            PairSummary(
                workload,
                target,
                len(trials),
                sum(r.result.ok for r in trials),
                dict(sorted(errors.items())),
                rec.best(rs, workload, target),
            )
        )
    return out


def best_so_far(records: Sequence[rec.Record]) -> list[float]:
    """The best GFLOP/s after each trial, in the records' order (confirmation runs left out)."""
    curve, top = [], 0.0
    for r in records:
        if r.confirmation:
            continue
        top = max(top, r.gflops)
        curve.append(top)
    return curve


def _load(source: str) -> list[rec.Record]:
    if not is_redis_url(source) and not os.path.isfile(source):
        raise CliError(f"{source}: no such records file")
    store = open_store(source)
    try:
        return store.load()
    finally:
        store.close()


def render_summary(summaries: Sequence[PairSummary]) -> str:
    """The summary table, one row per (workload, target)."""
    rows = []
    for s in summaries:
        errors = " ".join(f"{k}={v}" for k, v in s.errors.items()) or "-"
        if s.best is None:
            best, config = "-", "-"
        else:
            # timed with the caches swept: only compared with other cold times (`records.best`)
            best = f"{s.best.gflops:.1f}{' cold' if s.best.result.cold else ''}"
            config = f"#{s.best.config_index} {json.dumps(s.best.knobs, sort_keys=True)}"
        rows.append([str(s.workload), s.target, str(s.trials), str(s.ok), errors, best, config])
    header = ["workload", "target", "trials", "OK", "errors", "best GFLOP/s", "best config"]
    return table.render(header, rows)


def cmd_summary(args: argparse.Namespace) -> int:
    records = _load(args.source)
    if not records:
        print(f"{args.source}: no records")
        return 0
    print(render_summary(summarize(records)))
    print(f"{len(records)} records, {len(group(records))} workload/target pairs")
    return 0


def plot(records: Sequence[rec.Record], out: str, title: str = "") -> int:
    """Draw best-so-far GFLOP/s against trials, one line per (workload, target), into `out`.

    Returns:
        The number of lines drawn.

    Raises:
        CliError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError(
            "records plot needs the matplotlib package, which is not installed "
            "(pip install matplotlib, or pip install 'kiln[plot]')"
        ) from None
    pairs = group(records)
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        for (workload, target), rs in pairs.items():
            curve = best_so_far(rs)
            label = f"{workload} @ {target}" if len({t for _, t in pairs}) > 1 else str(workload)
            ax.plot(range(1, len(curve) + 1), curve, label=label, drawstyle="steps-post")
        ax.set_xlabel("trials")
        ax.set_ylabel("best GFLOP/s so far")
        ax.set_title(title or "Tuning curves")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out, format="png", dpi=100)
    finally:
        plt.close(fig)
    return len(pairs)


def cmd_plot(args: argparse.Namespace) -> int:
    records = _load(args.source)
    if not records:
        raise CliError(f"{args.source}: no records to plot")
    try:
        n = plot(records, args.output, title=os.path.basename(args.source))
    except OSError as exc:
        raise CliError(f"cannot write {args.output}: {exc}") from None
    print(f"wrote {args.output}: {n} curve(s) from {len(records)} records")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `records summary` and `records plot` to the `kiln` parser."""
    r = sub.add_parser("records", help="summarize or plot tuning records")
    r.set_defaults(func=run)
    rsub = r.add_subparsers(dest="records_command", required=True)
    s = rsub.add_parser("summary", help="per workload and target: trials, errors, best config")
    s.add_argument("source", help="records file or redis:// URL")
    s.set_defaults(records_func=cmd_summary)
    p = rsub.add_parser("plot", help="best-so-far GFLOP/s against trials (PNG)")
    p.add_argument("source", help="records file or redis:// URL")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.set_defaults(records_func=cmd_plot)


def run(args: argparse.Namespace) -> int:
    """Dispatch a parsed `kiln records ...` command."""
    code: int = args.records_func(args)
    return code

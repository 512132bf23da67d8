"""The tuning loop: ask the searcher, build, measure, record, tell; stop at the trial budget.

Records are appended (and fsync'd) to the store once per batch, so a run killed or interrupted
loses at most the batch in flight. `TuneOptions.resume` reads the records of this workload and target
back, tells the searcher their results (it never proposes them again and its model trains on
them) and counts them toward the budget. The loop ends at the budget, when the space runs out,
after `early_stop` trials with no better candidate, or with a `TuningError` when the first
`give_up_after_batches` batches produced no working candidate at all.

With `pipeline`, builds and measurements overlap twice over: the next batch is asked for and its
builds started before this one is measured, and this batch's candidates are measured as their
builds finish (`BuildStream.as_completed`, with a streaming builder: every chunk of finished
builds goes to the runner while the rest still compile, so one slow build holds up only itself,
and a unit past the builder's `timeout_s` is a BUILD_ERROR). A builder without `submit` builds a
whole batch in a thread. The searcher still tells and the records are still written per batch.

With `confirm=k`, the k fastest configs are measured again at the end, in `CONFIRM_ROUNDS`
interleaved rounds, and the best is the config whose upper median over all its measurements is
fastest (`records.best`): on a shared machine one lucky measurement of a cache-hungry tile
otherwise wins, and the build runs far slower than the record said.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from compiler.toolchain import BuildError, get_target
from tuner import records as rec
from tuner.measure.build_stream import BuildStream, FuturesEngine
from tuner.measure.builder import Builder, BuildResult, StreamingBuilder
from tuner.measure.device_target import (
    cuda_target_arch,
    is_cuda_target,
    is_vta_target,
    vta_records_name,
    vta_target_spec,
)
from tuner.measure.result import MeasureResult, Status
from tuner.measure.runner import Runner
from tuner.options import TuneOptions
from tuner.records import FileRecords, RecordStore, open_store
from tuner.search import Searcher, searcher_for
from tuner.task import Task

_LOG = logging.getLogger(__name__)

CONFIRM_ROUNDS = 2


@dataclass
class TuneProgress:
    """What the loop has done so far; handed to the progress callback after every batch.

    Times are seconds of this run (resumed records cost nothing): `build_s` in the builder,
    `measure_s` in the runner, `search_s` in the searcher's ask and tell, `model_s` the part of it
    the searcher reports as cost-model work (its `model_seconds`, when it has one).
    """

    total: int = 0
    history: list[rec.Record] = field(default_factory=list)
    best: rec.Record | None = None
    best_at: int = 0
    resumed: int = 0
    started: float = field(default_factory=time.monotonic)
    wall_s: float = 0.0
    build_s: float = 0.0
    measure_s: float = 0.0
    search_s: float = 0.0
    model_s: float = 0.0
    stop_reason: str = ""
    confirmations: list[rec.Record] = field(default_factory=list)

    @property
    def trials(self) -> int:
        """Trials done, resumed ones included (what the budget counts)."""
        return len(self.history)

    @property
    def new_trials(self) -> int:
        """Trials measured by this run."""
        return len(self.history) - self.resumed

    @property
    def errors(self) -> int:
        return sum(not r.result.ok for r in self.history)

    @property
    def errors_by_status(self) -> dict[str, int]:
        return dict(Counter(r.result.status.value for r in self.history if not r.result.ok))

    @property
    def best_measurements(self) -> int:
        """How many measurements of the best config (trials and confirmations) stand behind it."""
        if self.best is None:
            return 0
        i = self.best.config_index
        return sum(
            r.config_index == i and r.result.ok for r in [*self.history, *self.confirmations]
        )

    @property
    def best_gflops(self) -> float:
        return self.best.gflops if self.best else 0.0

    @property
    def model_share(self) -> float:
        """The cost model's share of this run's wall time (0 for a searcher without a model)."""
        return self.model_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def eta_s(self) -> float:
        """Seconds left at this run's pace if the whole budget is used (early stop may end sooner)."""
        if self.new_trials <= 0:
            return 0.0
        return self.wall_s / self.new_trials * max(0, self.total - self.trials)

    def add(self, batch: Sequence[rec.Record]) -> None:
        """Take a batch of records into the history, moving the best if one of them beats it.

        A time of the other timing mode than the best's (`MeasureResult.cold`: a run resumed
        with other `--caches`) is not compared with it: the newer mode takes over, as in
        `records.best`."""
        for r in batch:
            self.history.append(r)
            if r.result.ok and (
                self.best is None
                or r.result.cold != self.best.result.cold
                or r.result.median_s < self.best.result.median_s
            ):
                self.best = r
                self.best_at = len(self.history)


class TuningError(RuntimeError):
    """The run could not produce any working candidate."""


def target_name(target: str) -> str:
    """The name records carry for a builder's target: "host" resolves to this machine's class;
    "vta" names the accelerator spec the templates build for (`vta_records_name`); a GPU's
    ("cuda/sm=90") is its own name, which carries the compute capability."""
    if is_cuda_target(target):
        cuda_target_arch(target)  # a malformed one is refused here, not named in records
        return target
    if is_vta_target(target):
        return vta_records_name(vta_target_spec(target).key())
    try:
        return get_target(target).name
    except BuildError:
        return target  # not a compiler target (a test's fake builder): its name is what it is


def builder_records_target(builder: object) -> str:
    """The target records of `builder`'s candidates carry: its target's name (`target_name`)
    and the thread count it builds for (`threads`, 1 for a builder without one)."""
    threads = int(getattr(builder, "threads", 1))
    return rec.records_target(target_name(str(getattr(builder, "target", "host"))), threads)


def compiler_target(target: str) -> str:
    """`target` when the compiler knows it, else "host" (a test's fake builder)."""
    if is_cuda_target(target):
        return target
    try:
        get_target(target)
    except BuildError:
        return "host"
    return target


def _store(spec: RecordStore | str | os.PathLike[str] | None) -> RecordStore | None:
    if spec is None or not isinstance(spec, str | os.PathLike):
        return spec
    return open_store(spec) if isinstance(spec, str) else FileRecords(spec)


def _normal(knobs: dict[str, object]) -> object:
    return json.loads(json.dumps(knobs, sort_keys=True))


def resumable_records(task: Task, records: Sequence[rec.Record]) -> list[rec.Record]:
    """One record per config index of today's space, in first-seen order: the one standing for
    the config by `records.settled_time` (its only measurement, or the upper median of several).

    Records of a space of another size, or whose knobs are not today's knobs of their index, are
    dropped with a warning: the index would name another config now.
    """
    size = len(task.space)
    chosen: dict[int, list[rec.Record]] = {}
    stale = 0
    for r in records:
        i = r.config_index
        if r.space_size not in (0, size) or not 0 <= i < size:
            stale += 1
            continue
        if i not in chosen and _normal(r.knobs) != _normal(task.knobs(i)):
            stale += 1
            continue
        chosen.setdefault(i, []).append(r)
    if stale:
        _LOG.warning(
            "resume: %d records of %s were of another config space and are ignored",
            stale,
            task.workload,
        )
    return [_stands_for(rs) for rs in chosen.values()]


def _stands_for(records: list[rec.Record]) -> rec.Record:
    ok = [r for r in records if r.result.ok]
    return rec.settled_time(ok) if ok else records[0]


def timed_build(
    builder: Builder, task: Task, indices: Sequence[int], check: bool
) -> tuple[list[BuildResult], float]:
    """`builder.build` of `indices` (with references when `check`), and the seconds it took."""
    t0 = time.monotonic()
    built = builder.build(task.workload, indices, check=check)
    return built, time.monotonic() - t0


def measure_built(
    runner: Runner, built: Sequence[BuildResult], progress: TuneProgress
) -> list[MeasureResult]:
    """Measure what built; one result per build result (a failed build is a BUILD_ERROR
    result), with the time spent added to `progress`."""
    t0 = time.monotonic()
    artifacts = [b.artifact for b in built if b.artifact is not None]
    references = [b.reference for b in built if b.artifact is not None]
    measured = runner.run(artifacts, references) if artifacts else []
    progress.measure_s += time.monotonic() - t0
    if len(measured) != len(artifacts):
        _LOG.error("runner returned %d results for %d artifacts", len(measured), len(artifacts))
    it = iter(measured)
    results: list[MeasureResult] = []
    for b in built:
        if b.artifact is None:
            results.append(MeasureResult.failed(Status.BUILD_ERROR, b.error))
        else:
            results.append(
                next(it, None)
                or MeasureResult.failed(Status.RUNTIME_ERROR, "the runner returned no result")
            )
    return results


def start_build(
    builder: Builder, task: Task, indices: Sequence[int], check: bool, thread: ThreadPoolExecutor
) -> BuildStream:
    """Start building `indices`: `builder.submit` for a streaming builder, else the whole batch
    by `builder.build` on `thread` (one stream chunk when it is done)."""
    if isinstance(builder, StreamingBuilder):
        return builder.submit(task.workload, indices, check=check)
    batch = thread.submit(builder.build, task.workload, list(indices), check)
    return BuildStream([(indices, batch)], FuturesEngine())


def measure_stream(
    runner: Runner, indices: Sequence[int], stream: BuildStream, progress: TuneProgress
) -> list[MeasureResult]:
    """Measure each chunk of `stream` as it comes; one result per index, in order (a failed
    build is a BUILD_ERROR result), with the build and measure time added to `progress`."""
    by_index: dict[int, MeasureResult] = {}
    try:
        for chunk in stream.as_completed():
            for b, r in zip(chunk, measure_built(runner, chunk, progress), strict=True):
                by_index[b.config_index] = r
    finally:
        stream.cancel()  # what is left when the runner raised (Ctrl-C): its builds are dropped
    progress.build_s += stream.seconds
    missing = MeasureResult.failed(Status.BUILD_ERROR, "the builder returned no result")
    return [by_index.get(i, missing) for i in indices]


def run_batch(
    task: Task,
    builder: Builder,
    runner: Runner,
    indices: Sequence[int],
    progress: TuneProgress,
    check: bool,
    stream: bool = False,
) -> list[MeasureResult]:
    """Build and measure `indices`, each checked against its reference on the device when
    `check`; one result per index, in order (a failed build is a BUILD_ERROR result), with the
    time spent added to `progress`. Shared by `tune` and network tuning.

    With `stream` and a streaming builder, candidates are measured as their builds finish
    (`measure_stream`), so one slow build holds up only itself and a unit past the builder's
    `timeout_s` is a BUILD_ERROR; otherwise the whole batch is built, then measured."""
    if stream and isinstance(builder, StreamingBuilder):
        started = builder.submit(task.workload, indices, check=check)
        return measure_stream(runner, indices, started, progress)
    built, seconds = timed_build(builder, task, indices, check)
    progress.build_s += seconds
    return measure_built(runner, built, progress)


def confirm_candidates(progress: TuneProgress, top: int) -> list[int]:
    """The configs `confirm_best` measures again: the `top` fastest of `progress` by
    `records.best`'s rule; none when `top` < 2 or fewer than two configs worked."""
    if top < 2 or progress.best is None:
        return []
    by_config: dict[int, list[rec.Record]] = {}
    for r in [*progress.history, *progress.confirmations]:
        if r.result.ok:
            by_config.setdefault(r.config_index, []).append(r)
    if len(by_config) < 2:
        return []
    settled = sorted((rec.settled_time(rs) for rs in by_config.values()), key=_seconds)
    return [r.config_index for r in settled[:top]]


def confirm_best(
    task: Task,
    builder: Builder,
    runner: Runner,
    progress: TuneProgress,
    top: int,
    store: RecordStore | None = None,
    rounds: int = CONFIRM_ROUNDS,
    check: bool = True,
    built: BuildStream | None = None,
) -> list[rec.Record]:
    """Measure the `top` fastest configs of `progress` again, `rounds` times, and settle its best.

    The configs (`confirm_candidates`) are built once (or come from `built`, a stream started
    earlier for exactly them), measured together in each round (the order reversed every other
    round, so none always runs first), appended to `store` and kept in
    `progress.confirmations`; `progress.best` becomes the config with the fastest upper median
    over all its measurements. Nothing is measured when fewer than two configs worked.
    """
    indices = confirm_candidates(progress, top)
    if not indices or progress.best is None:
        if built is not None:
            built.cancel()
        return []
    best = progress.best
    if built is None:
        results_built, seconds = timed_build(builder, task, indices, check)
    else:
        results_built, seconds = built.results(), built.seconds
    progress.build_s += seconds
    by_index = {b.config_index: b for b in results_built}
    added: list[rec.Record] = []
    for round_ in range(rounds):
        order = indices if round_ % 2 == 0 else indices[::-1]
        results = measure_built(runner, [by_index[i] for i in order], progress)
        stamp = rec.now_iso()
        batch = [
            rec.Record(
                task.workload,
                best.target,
                i,
                task.knobs(i),
                r,
                task.flop,
                stamp,
                best.space_size,
                confirmation=True,
            )
            for i, r in zip(order, results, strict=True)
        ]
        if store is not None:
            store.append(batch)
        added.extend(batch)
    progress.confirmations.extend(added)
    every = [*progress.history, *progress.confirmations]
    progress.best = rec.best(every, task.workload, best.target) or best
    _LOG.info(
        "confirmed the %d fastest configs of %s: best is #%d at %.1f GFLOP/s",
        len(indices),
        task.workload,
        progress.best.config_index,
        progress.best.gflops,
    )
    return added


def _seconds(r: rec.Record) -> float:
    return r.result.median_s


def _failure_summary(history: Sequence[rec.Record]) -> str:
    causes = Counter(
        f"{r.result.status.value}: {(r.result.error.strip().splitlines() or ['(no message)'])[0]}"
        for r in history
        if not r.result.ok
    )
    return "; ".join(f"{n}x {cause}" for cause, n in causes.most_common(3)) or "none measured"


Callback = Callable[["TuneProgress", Sequence[rec.Record]], None]


def log_records(store: RecordStore) -> Callback:
    """A callback that appends every batch (and every confirmation batch) to `store`."""

    def append(progress: TuneProgress, batch: Sequence[rec.Record]) -> None:
        del progress
        if batch:
            store.append(batch)

    return append


def on_progress(call: Callable[[TuneProgress], None]) -> Callback:
    """A callback that hands the progress alone to `call` (a progress bar) after every batch."""

    def forward(progress: TuneProgress, batch: Sequence[rec.Record]) -> None:
        del batch
        call(progress)

    return forward


def tune(
    task: Task,
    builder: Builder,
    runner: Runner,
    options: TuneOptions | None = None,
    *,
    searcher: Searcher | None = None,
    records: RecordStore | str | os.PathLike[str] | None = None,
    callbacks: Sequence[Callback] = (),
) -> TuneProgress:
    """Tune `task` for up to `options.trials` candidates.

    Args:
        task: the workload to tune.
        builder: builds config indices into artifacts; its target names the records' target.
        runner: measures artifacts.
        options: budget, batch, searcher name, resume, early stop, confirmation, check.
        searcher: proposes configs (default: `searcher_for(options, ...)`, with a transfer
            model from `records` when `options.transfer`).
        records: a RecordStore, a path or a `redis://` URL: every batch is appended to it, and
            `options.resume` reads it first; None keeps records in memory only.
        callbacks: called after every batch (and once after resuming) with the progress and
            the batch's records.

    Returns:
        The progress at the end, with the best record, every record and the time accounting.

    Raises:
        TuningError: no candidate worked; the message names the most common causes.
        ValueError: bad options (resume without records, a budget or batch below 1).
    """
    options = options or TuneOptions()
    store = _store(records)
    if options.resume and store is None:
        raise ValueError("resume needs a records store to read")
    try:
        if searcher is None:
            searcher, _ = searcher_for(
                task,
                options,
                store,
                compiler_target(builder.target),
                builder_records_target(builder),
            )
        every = [log_records(store), *callbacks] if store is not None else list(callbacks)
        return _tune(task, builder, runner, options, searcher, store, every)
    finally:
        if store is not None and store is not records:
            store.close()  # opened here from a path or URL


def _tune(
    task: Task,
    builder: Builder,
    runner: Runner,
    options: TuneOptions,
    searcher: Searcher,
    store: RecordStore | None,
    callbacks: Sequence[Callback],
) -> TuneProgress:
    n_trials, batch_size, early_stop = options.trials, options.batch_size, options.early_stop
    model_s0 = float(getattr(searcher, "model_seconds", 0.0))
    progress = TuneProgress(total=n_trials)
    threads = int(getattr(builder, "threads", 1))
    if threads != task.threads:
        raise ValueError(
            f"the task is for {task.threads} thread(s), the builder builds for {threads}"
        )
    target = builder_records_target(builder)
    space_size = len(task.space)

    def tick() -> None:
        progress.wall_s = time.monotonic() - progress.started
        progress.model_s = float(getattr(searcher, "model_seconds", 0.0)) - model_s0

    if options.resume and store is not None:
        prior = resumable_records(task, store.load(task.workload, target))
        if prior:
            t0 = time.monotonic()
            searcher.tell([r.config_index for r in prior], [r.result for r in prior])
            progress.search_s += time.monotonic() - t0
            progress.add(prior)
            progress.resumed = len(prior)
            _LOG.info("resumed %d trials of %s on %s", len(prior), task.workload, target)
            tick()
            for callback in callbacks:
                callback(progress, [])

    measured = {r.config_index for r in progress.history}
    failed_batches = 0

    def ask(room: int, busy: Sequence[int] = ()) -> list[int]:
        t0 = time.monotonic()
        asked = searcher.ask(min(batch_size, room))
        progress.search_s += time.monotonic() - t0
        taken = measured.union(busy)
        indices = [i for i in dict.fromkeys(asked) if i not in taken]
        if len(indices) < len(asked):
            _LOG.warning("the searcher proposed %d measured configs", len(asked) - len(indices))
        return indices

    # Pipelined, a batch is started (and the next asked for and started) before it is measured.
    thread = ThreadPoolExecutor(1, thread_name_prefix="kiln-build") if options.pipeline else None
    ahead: tuple[list[int], BuildStream] | None = None
    try:
        while progress.trials < n_trials:
            if early_stop is not None and progress.trials - progress.best_at >= early_stop:
                progress.stop_reason = f"no better candidate in {early_stop} trials"
                break
            stream: BuildStream | None = None
            if ahead is None:
                indices = ask(n_trials - progress.trials)
                if not indices:
                    progress.stop_reason = "the config space is exhausted"
                    break
                if thread is not None:
                    stream = start_build(builder, task, indices, options.check, thread)
            else:
                indices, stream = ahead
                ahead = None
            if stream is None:
                results = run_batch(task, builder, runner, indices, progress, options.check)
            else:
                assert thread is not None
                room = n_trials - progress.trials - len(indices)
                following = ask(room, indices) if room > 0 else []
                if following:
                    ahead = (
                        following,
                        start_build(builder, task, following, options.check, thread),
                    )
                results = measure_stream(runner, indices, stream, progress)
            stamp = rec.now_iso()
            batch = [
                rec.Record(task.workload, target, i, task.knobs(i), r, task.flop, stamp, space_size)
                for i, r in zip(indices, results, strict=True)
            ]
            t0 = time.monotonic()
            searcher.tell(indices, results)
            progress.search_s += time.monotonic() - t0
            measured.update(indices)
            progress.add(batch)
            tick()
            for callback in callbacks:
                callback(progress, batch)
            if progress.best is None:
                failed_batches += 1
                if failed_batches >= options.give_up_after_batches:
                    raise TuningError(
                        f"no candidate of {task.workload} on {target} worked in the first "
                        f"{progress.trials} trials ({failed_batches} batches); giving up. "
                        f"Causes: {_failure_summary(progress.history)}"
                    )
        else:
            progress.stop_reason = "trial budget reached"
    finally:
        if ahead is not None:
            ahead[1].cancel()  # a batch built ahead is dropped
        if thread is not None:
            thread.shutdown(wait=True)  # a plain builder's batch in flight ends first
    tick()
    if progress.best is None:
        raise TuningError(
            f"no candidate of {task.workload} on {target} worked in {progress.trials} trials; "
            f"causes: {_failure_summary(progress.history)}"
        )
    if options.confirm:
        added = confirm_best(task, builder, runner, progress, options.confirm, check=options.check)
        for callback in callbacks:
            callback(progress, added)
        tick()
    return progress

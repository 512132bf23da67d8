"""Tune a whole model: its tasks share one trial budget, handed out by the task scheduler.

    result = tune_network("net.onnx", builder, runner, TuneOptions(trials=512), store=store)
    configs = configs_from_records(graph, store, "host")     # what build_model takes
    configs = configs_from_records(graph, store, "host", threads=4)  # of 4-thread records only

The graph is optimized and fused as `build_model` does, and cut into tasks (`extract_tasks`).
Specs without a template are reported in `ModelTuneResult.skipped` (with their reason) and built
with generic kernels. Every tunable task keeps one searcher for the whole run: the scheduler's
`tune_batch(n)` asks it for `n` more candidates, builds, measures, appends the batch to the store
and tells the searcher, so a task's search continues across its batches. A task's configs are
restricted to those keeping the graph's channel blocks (`ic_block`, `oc_block`, `c_block`): the
model builder refuses any other.

For a GPU builder (target "cuda/sm=90") the tasks are the GPU model build's template tasks
instead (`gpu_tasks`: `plan_model_cuda(...).tasks`, cuda_conv2d, cuda_dense, ... on NCHW, keyed
as `kiln tune-op` records them): one thread each, every config fitting, each seeded with the
config the untuned GPU build takes (`first_config`). Their records carry the target's own name,
and `build_gpu` (`kiln build --target cuda/sm=90`) builds the model from them.

With `TuneOptions.pipeline` and a streaming builder, a batch's candidates are measured as their
builds finish (`tuner.loop.run_batch` with `stream`, as `tune` does): one slow build holds up
only itself, and a unit past the builder's `timeout_s` is a BUILD_ERROR; and the batch the
scheduler expects next is asked for and started before this one is measured (`_TaskRun.prepare`),
so the builder works while the devices measure. The batch's records are still appended and told
in the order asked, once the whole batch is in, and every batch measures what it would without
the pipeline. Without it (the
default), a batch is built whole and then measured, so no build shares the cores with a
measurement. Confirmation rounds are never streamed: their measuring order is part of them.

Resume: each task's earlier records in the store (same workload and target, today's config
space) are told to its searcher before the run, never measured again, and count toward
`total_trials`. The scheduler starts from each resumed task's trials and best (its `prior`), so
a resumed task gets no second warm-up batch; the estimated latency, the per-task bests and trial
counts include the resumed records.

The estimated model latency is `sum(weight * best latency)` over the tunable tasks (infinite
while one has no working candidate); `ModelTuneResult.curve` holds it after every batch.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from compiler.build_cuda import is_cuda_target
from compiler.graph import passes as P
from compiler.graph.build_model import optimize
from compiler.graph.build_model_cuda import plan_model_cuda
from compiler.graph.ir import Graph, Node
from compiler.graph.model_kernels import default_config
from compiler.graph.model_kernels_cuda import first_config
from compiler.graph.tasks import TaskKey, TaskSpec, extract_tasks
from compiler.ops.base import PARALLEL_KNOB, OpTemplate
from compiler.ops.space import Config
from tuner import records as rec
from tuner.loop import (
    TuneProgress,
    builder_records_target,
    compiler_target,
    confirm_best,
    confirm_candidates,
    measure_stream,
    resumable_records,
    run_batch,
    start_build,
    target_name,
)
from tuner.measure import MeasureResult
from tuner.measure.build_stream import BuildStream
from tuner.measure.builder import Builder
from tuner.measure.runner import Runner
from tuner.network.scheduler import Allocation, SchedTask, ScheduleResult, TaskScheduler
from tuner.options import TuneOptions
from tuner.records import RecordStore
from tuner.search import Searcher, SeededSearch, searcher_for
from tuner.task import Task

_LOG = logging.getLogger(__name__)

# (task, valid) -> the searcher of one task; valid is False for configs never to propose.
SearcherFactory = Callable[[Task, Callable[[int], bool]], Searcher]


@dataclass(frozen=True)
class ModelTask:
    """One tunable task of a model: its spec, its tuner Task and the layout blocks it must keep."""

    spec: TaskSpec
    task: Task
    blocks: Mapping[str, int]

    @property
    def name(self) -> str:
        return str(self.task.workload)

    def fits(self, index: int) -> bool:
        """Whether config `index` can be built in this model: every config can, since the
        builder lays the graph out to the channel blocks a config picks (`config_blocks`)."""
        return 0 <= index < len(self.task.space)

    def default_index(self, target: str) -> int:
        """The config the untuned build of this task uses on compile target `target` (on a GPU:
        the GPU model build's, `first_config`)."""
        template = self.task.template
        assert isinstance(template, OpTemplate)  # a tunable task has a template
        shape, threads = self.task.workload.shape, self.task.threads
        if is_cuda_target(target):
            return first_config(template, shape, target).index
        return default_config(template, shape, target, self.blocks, threads).index


def model_tasks(
    graph: Graph, threads: int = 1, target: str = "host"
) -> tuple[list[ModelTask], list[TaskSpec]]:
    """The tunable tasks of `graph` for kernels on `threads` threads, and the specs that are not:
    as `build_model` cuts it, or for a cuda `target` as `build_model_cuda` does (`gpu_tasks`).

    `blocks` of a task are the default layout's (what the untuned build uses); a tuned config
    may pick others, and the builder lays the graph out to them.
    """
    if is_cuda_target(target):
        return gpu_tasks(graph, target), []
    fusion = P.fuse(optimize(graph))
    groups = {g.index: g for g in fusion.groups}
    tunable: list[ModelTask] = []
    skipped: list[TaskSpec] = []
    for spec in extract_tasks(fusion):
        if spec.template is None:
            skipped.append(spec)
            continue
        blocks = _blocks(fusion.graph, groups[spec.groups[0]].anchor, spec)
        task = Task(rec.Workload(spec.template, spec.workload), threads)
        tunable.append(ModelTask(spec, task, blocks))
    return tunable, skipped


def gpu_tasks(graph: Graph, target: str) -> list[ModelTask]:
    """The template tasks of `graph`'s GPU model build for cuda `target` (`plan_model_cuda`),
    one thread each (a GPU kernel has no `parallel` knob) and no layout blocks to keep: the GPU
    templates take NCHW as it is. Every other kernel of that build is untemplated, not a task.
    """
    specs = plan_model_cuda(graph, None, target).tasks
    return [
        ModelTask(spec, Task(rec.Workload(spec.template, spec.workload)), {})
        for spec in specs
        if spec.template is not None
    ]


def one_thread_seeds(mt: ModelTask, store: RecordStore | None, records_target: str) -> list[int]:
    """For a task of several threads: the best one-thread record's config (of the same target
    class in `store`) with each choice of its `parallel` knob, as first candidates to measure.

    A one-thread record never stands in for more threads; its config is only measured again
    on them, so the search starts from tiles already good on one core.
    """
    base, threads = rec.split_threads(records_target)
    if threads == 1 or store is None:
        return []
    one = Task(mt.task.workload)
    size = len(one.space)
    best = rec.apply_best(store.load(mt.task.workload, base), mt.task.workload, base, size)
    knob = next((k for k in mt.task.space.knobs if k.name == PARALLEL_KNOB), None)
    if best is None or knob is None:
        return []
    knobs = dict(one.space.get(best.index))
    return [mt.task.space.index_of({**knobs, PARALLEL_KNOB: c}) for c in knob.choices[1:]]


def _blocks(g: Graph, anchor: Node, spec: TaskSpec) -> dict[str, int]:
    """The block knobs the model builder pins for an anchor (see `model_kernels._Lowering.conv`)."""
    if spec.anchor_op != "conv2d_nchwc":
        return {}
    x = g.type_of(anchor.inputs[0]).shape
    if spec.template == "depthwise_conv2d_nchwc":
        return {"c_block": x[4]}
    return {"ic_block": x[4], "oc_block": g.type_of(anchor.outputs[0]).shape[4]}


@dataclass(frozen=True)
class TaskReport:
    """Where one task ended: trials (resumed included), its best record, the scheduler's status."""

    spec: TaskSpec
    name: str
    trials: int
    resumed: int
    best: rec.Record | None
    status: str
    error: str | None = None

    @property
    def weight(self) -> int:
        return self.spec.weight

    @property
    def best_gflops(self) -> float:
        return self.best.gflops if self.best else 0.0

    @property
    def estimated_s(self) -> float:
        """weight x best latency: this task's share of the model (inf without a working one)."""
        return self.spec.weight * self.best.result.median_s if self.best else math.inf


@dataclass(frozen=True)
class ModelTuneStep:
    """Handed to `on_batch` after every batch: the allocation and where the model stands.

    `trials` and `task_best_s` (the allocated task's best latency) count resumed records; the
    allocation's own figures are the scheduler's, which sees this run's batches only.
    """

    allocation: Allocation
    trials: int
    total_trials: int
    estimated_s: float
    task_best_s: float | None


@dataclass(frozen=True)
class ModelTuneResult:
    """What `tune_network` did: per-task reports, non-tunable specs, the estimated latency curve.

    `curve` holds `(trials, estimated model latency in seconds)`: first after resuming (when
    anything was resumed), then after every batch; trials count resumed records.
    """

    tasks: list[TaskReport]
    skipped: list[TaskSpec]
    curve: list[tuple[int, float]]
    schedule: ScheduleResult
    target: str
    transfer: dict[rec.Workload, str] = field(default_factory=dict)
    """The tasks whose searcher a transfer model started, with its note."""

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)

    @property
    def resumed(self) -> int:
        return sum(t.resumed for t in self.tasks)

    @property
    def estimated_s(self) -> float:
        """sum(weight x best latency) over the tunable tasks (inf if one has no working config)."""
        return math.fsum(t.estimated_s for t in self.tasks)


@dataclass
class _TaskRun:
    """One task's search across the batches the scheduler gives it."""

    mt: ModelTask
    searcher: Searcher
    builder: Builder
    runner: Runner
    store: RecordStore | None
    target: str
    check: bool
    stream: bool
    progress: TuneProgress = field(default_factory=TuneProgress)
    measured: set[int] = field(default_factory=set)
    # pipelined runs: where a batch built ahead (`prepare`) is started; and that batch
    thread: ThreadPoolExecutor | None = None
    ahead: tuple[list[int], BuildStream | None] | None = None

    def prepare(self, n: int) -> None:
        """Ask for the next `n` candidates and start building them (pipelined runs only; once
        until they are measured): the next `tune_batch` measures them. The searcher hears of
        nothing in between, so they are the candidates that batch would have asked for."""
        if self.thread is None or self.ahead is not None:
            return
        indices = self._ask(n)
        stream = (
            start_build(self.builder, self.mt.task, indices, self.check, self.thread)
            if indices
            else None
        )
        self.ahead = (indices, stream)

    def drop_ahead(self) -> None:
        """Cancel a batch built ahead that no allocation came for (the run ended first)."""
        if self.ahead is not None and self.ahead[1] is not None:
            self.ahead[1].cancel()
        self.ahead = None

    def _ask(self, n: int) -> list[int]:
        return [i for i in dict.fromkeys(self.searcher.ask(n)) if i not in self.measured]

    def resume(self) -> int:
        """Tell the searcher this task's earlier records; returns how many there were."""
        if self.store is None:
            return 0
        prior = resumable_records(self.mt.task, self.store.load(self.mt.task.workload, self.target))
        prior = [r for r in prior if self.mt.fits(r.config_index)]
        if prior:
            self.searcher.tell([r.config_index for r in prior], [r.result for r in prior])
            self.progress.add(prior)
            self.progress.resumed = len(prior)
            self.measured.update(r.config_index for r in prior)
        return len(prior)

    def tune_batch(self, n: int) -> list[float | None]:
        """Measure up to `n` new candidates; fewer when the searcher has no more to propose."""
        task = self.mt.task
        indices, stream = self.ahead if self.ahead is not None else (self._ask(n), None)
        self.ahead = None
        if stream is not None and len(indices) > n:  # more were built ahead than now fit
            stream.cancel()
            indices, stream = indices[:n], None
        if not indices:
            return []
        if stream is not None:
            results = measure_stream(self.runner, indices, stream, self.progress)
        else:
            results = run_batch(
                task, self.builder, self.runner, indices, self.progress, self.check, self.stream
            )
        stamp = rec.now_iso()
        size = len(task.space)
        batch = [
            rec.Record(task.workload, self.target, i, task.knobs(i), r, task.flop, stamp, size)
            for i, r in zip(indices, results, strict=True)
        ]
        if self.store is not None:
            self.store.append(batch)
        self.searcher.tell(indices, results)
        self.measured.update(indices)
        self.progress.add(batch)
        return [_latency(r) for r in results]


def _confirm_all(
    runs: list[_TaskRun],
    builder: Builder,
    runner: Runner,
    options: TuneOptions,
    store: RecordStore | None,
    thread: ThreadPoolExecutor | None,
) -> None:
    """`confirm_best` of every task with a best; pipelined (`thread`), each task's configs and
    the next task's are being built before its rounds are measured."""
    confirming = [run for run in runs if options.confirm and run.progress.best is not None]
    started: dict[int, BuildStream | None] = {}

    def start(k: int) -> None:
        if thread is None or k >= len(confirming) or k in started:
            return
        run = confirming[k]
        indices = confirm_candidates(run.progress, options.confirm)
        started[k] = (
            start_build(builder, run.mt.task, indices, options.check, thread) if indices else None
        )

    try:
        for k, run in enumerate(confirming):
            start(k)
            start(k + 1)
            confirm_best(
                run.mt.task,
                builder,
                runner,
                run.progress,
                options.confirm,
                store,
                check=options.check,
                built=started.pop(k, None),
            )
    finally:
        for stream in started.values():
            if stream is not None:
                stream.cancel()


def _latency(result: MeasureResult) -> float | None:
    return result.median_s if result.ok else None


def _estimate(runs: list[_TaskRun]) -> float:
    return math.fsum(
        r.mt.spec.weight * r.progress.best.result.median_s if r.progress.best else math.inf
        for r in runs
    )


def default_searcher_factory(
    options: TuneOptions,
    store: RecordStore | None,
    target: str,
    records_target: str,
    notes: dict[rec.Workload, str] | None = None,
) -> SearcherFactory:
    """Each task's searcher as `searcher_for` makes it, restricted to `valid` configs; the
    transfer model's note of each task that has one goes into `notes`."""

    def factory(task: Task, valid: Callable[[int], bool]) -> Searcher:
        searcher, note = searcher_for(task, options, store, target, records_target, valid)
        if note:
            _LOG.info("%s: %s", task.workload, note)
            if notes is not None:
                notes[task.workload] = note
        return searcher

    return factory


def tune_network(
    graph_or_path: Graph | str | os.PathLike[str],
    builder: Builder,
    runner: Runner,
    options: TuneOptions,
    *,
    store: RecordStore | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    searcher_factory: SearcherFactory | None = None,
    on_batch: Callable[[ModelTuneStep], None] | None = None,
) -> ModelTuneResult:
    """Tune every tunable task of a network within one trial budget (see the module docstring).

    Args:
        graph_or_path: the graph, or an ONNX file imported with `input_shapes`.
        builder, runner: build and measure candidates; records carry `builder.target`'s name.
        options: `trials` is the budget over all tasks (resumed records included), `batch_size`
            candidates per scheduler allocation, `early_stop` per task, `confirm` per task at
            the end, `seed` seeds the scheduler and every searcher, `check` the on-device check,
            `pipeline` streams each batch's builds into measurement.
        store: records are appended here per batch (None: kept in memory only).
        searcher_factory: makes each task's searcher (default: `options.tuner`).
        on_batch: called after every batch with a `ModelTuneStep`.

    Raises:
        ValueError: resume without a store.
    """
    total_trials, batch_size, seed = options.trials, options.batch_size, options.seed
    if options.resume and store is None:
        raise ValueError("resume needs a records store to read")
    if isinstance(graph_or_path, Graph):
        graph = graph_or_path
    else:
        from compiler.frontend.onnx import load_onnx  # onnx is only needed for a path

        graph = load_onnx(graph_or_path, input_shapes)
    target = compiler_target(builder.target)
    tunable, skipped = model_tasks(graph, int(getattr(builder, "threads", 1)), target)
    for spec in skipped:
        _LOG.info("not tuned: %s x%d: %s", spec.anchor_op, spec.weight, spec.note)
    # a GPU kernel is one thread's task whatever `threads` tag its device carries
    gpu = is_cuda_target(target)
    records_target = target_name(target) if gpu else builder_records_target(builder)
    transfer: dict[rec.Workload, str] = {}
    factory = searcher_factory or default_searcher_factory(
        options, store, target, records_target, transfer
    )
    runs = [
        _TaskRun(
            mt,
            # the untuned build's config first: a tuned build is never slower than the default
            SeededSearch(
                factory(mt.task, mt.fits),
                [mt.default_index(target), *one_thread_seeds(mt, store, records_target)],
            ),
            builder,
            runner,
            store,
            records_target,
            options.check,
            options.pipeline,
        )
        for mt in tunable
    ]
    resumed = sum(run.resume() for run in runs) if options.resume else 0
    curve: list[tuple[int, float]] = [(resumed, _estimate(runs))] if resumed else []

    by_name = {run.mt.name: run for run in runs}

    def step(allocation: Allocation) -> None:
        trials = resumed + allocation.total_trials
        curve.append((trials, _estimate(runs)))
        if on_batch is not None:
            best = by_name[allocation.task].progress.best
            task_best_s = best.result.median_s if best is not None else None
            on_batch(ModelTuneStep(allocation, trials, total_trials, curve[-1][1], task_best_s))

    # Pipelined, the batch the scheduler expects next is built while this one is measured.
    thread = ThreadPoolExecutor(1, thread_name_prefix="kiln-build") if options.pipeline else None
    for run in runs:
        run.thread = thread
    sched_tasks = [
        SchedTask(
            run.mt.name,
            run.mt.spec.weight,
            run.mt.task.flop,
            run.tune_batch,
            run.mt.task.workload.op,
            run.prepare if thread is not None else None,
        )
        for run in runs
    ]
    try:
        schedule = TaskScheduler(
            sched_tasks,
            max(0, total_trials - resumed),
            batch_size,
            seed=seed,
            early_stop_per_task=options.early_stop,
            on_batch=step,
            prior={
                run.mt.name: (
                    run.progress.resumed,
                    run.progress.best.result.median_s if run.progress.best is not None else None,
                )
                for run in runs
                if run.progress.resumed
            },
        ).run()
        for run in runs:
            run.drop_ahead()
        _confirm_all(runs, builder, runner, options, store, thread)
    finally:
        for run in runs:
            run.drop_ahead()
            run.thread = None
        if thread is not None:
            thread.shutdown(wait=True)  # a plain builder's batch in flight ends first
    outcomes = {o.name: o for o in schedule.tasks}
    reports = [
        TaskReport(
            run.mt.spec,
            run.mt.name,
            run.progress.trials,
            run.progress.resumed,
            run.progress.best,
            outcomes[run.mt.name].status,
            outcomes[run.mt.name].error,
        )
        for run in runs
    ]
    return ModelTuneResult(reports, skipped, curve, schedule, records_target, transfer)


# What converting data between channel blocks costs, per byte of the tensor converted (read and
# written once, in a gather the task's own timing does not see): about 10 GB/s measured here.
LAYOUT_SECONDS_PER_BYTE = 1e-10
# And the share of a block-keeping config's time a config with other blocks must save besides:
# its isolated timing overstates what it gains in the model. MobileNetV2 on Zen 3, the 1x1 convs'
# records (ic_block 32-64 timed 2-14% faster alone; the conversions 0.06 ms in all), 15
# interleaved rounds: blocks as the records chose 11.35 ms, default blocks kept 11.10 ms.
# ResNet-18 was even (34.8 vs 35.7 ms medians, 31.7 vs 31.2 fastest).
BLOCK_CHANGE_MARGIN = 0.15


def configs_from_records(
    graph: Graph, store: RecordStore, target: str, threads: int | None = None
) -> dict[TaskKey, Config]:
    """The best recorded config of each tunable task of `graph` on `target`, as `build_model` takes.

    Only records of today's config space (`space_size` checked) and of the build's thread count
    are used: `threads`, else the count `target` carries ("host/threads=4"), else one thread (so
    records without a count, all tuned on one thread, serve one-thread builds only). A task
    without one is left out, so the builder uses its default. A config with other channel blocks
    than the default layout's is taken only when it beats the best that keeps them by more than
    the conversions it brings cost (`layout_cost_s`) plus `BLOCK_CHANGE_MARGIN` of the
    block-keeping config's time, or none keeps them.

    Raises:
        ValueError: `threads` contradicts the count `target` carries, or is below 1.
    """
    configs: dict[TaskKey, Config] = {}
    base, carried = rec.split_threads(target)
    if threads is not None and rec.THREADS_MARK in target and threads != carried:
        raise ValueError(f"target {target!r} carries {carried} threads, the build asks {threads}")
    count = carried if threads is None else threads
    resolved = rec.records_target(target_name(base), count)
    tunable, _ = model_tasks(graph, count, base)
    for mt in tunable:
        size = len(mt.task.space)
        fitting = [
            r
            for r in store.load(mt.task.workload, resolved)
            if 0 <= r.config_index < size and mt.fits(r.config_index)
        ]
        best = rec.apply_best(fitting, mt.task.workload, resolved, size)
        if best is None:
            continue
        keeping = [r for r in fitting if _fits(mt.task.space.get(r.config_index), mt.blocks)]
        kept = rec.apply_best(keeping, mt.task.workload, resolved, size)
        if kept is not None:
            config = mt.task.space.get(best.index)
            cost = layout_cost_s(mt, config)
            if kept.median_s - best.median_s <= cost + BLOCK_CHANGE_MARGIN * kept.median_s:
                best = kept
            elif mt.spec.joined and _output_block(config) != _output_block(mt.blocks):
                best = kept  # another output block would take a concat out of its layout
        configs[mt.spec.key] = mt.task.space.get(best.index)
    return configs


def layout_cost_s(mt: ModelTask, config: Mapping[str, object]) -> float:
    """Seconds the block conversions of `config` are expected to cost around one conv of `mt`:
    its input converted when the input block differs from the default layout's, its output
    when the output block does (`LAYOUT_SECONDS_PER_BYTE`)."""
    shape = mt.task.workload.shape
    if mt.spec.anchor_op != "conv2d_nchwc" or len(shape) < 8:
        return 0.0
    if "c_block" in mt.blocks:  # depthwise (N, C, H, W, KH, KW, stride, pad)
        n, c, h, w, kh, kw, stride, pad = shape[:8]
        oc = c
        changed_in = changed_out = config.get("c_block") != mt.blocks["c_block"]
    else:  # (N, IC, H, W, OC, KH, KW, stride, pad, ...)
        n, c, h, w, oc, kh, kw, stride, pad = shape[:9]
        changed_in = config.get("ic_block", mt.blocks.get("ic_block")) != mt.blocks.get("ic_block")
        changed_out = config.get("oc_block") != mt.blocks.get("oc_block")
    oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    moved = changed_in * n * c * h * w + changed_out * n * oc * oh * ow
    return 4 * moved * LAYOUT_SECONDS_PER_BYTE


def _output_block(knobs: Mapping[str, object]) -> object:
    return knobs.get("oc_block", knobs.get("c_block"))


def _fits(config: Mapping[str, object], blocks: Mapping[str, int]) -> bool:
    return all(config[k] == v for k, v in blocks.items() if k in config)

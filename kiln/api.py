"""The Python API: tune an operator or a network on a pool, build it, run it, read the records.

    import kiln
    with kiln.Pool() as pool:                                   # local tracker + agent
        best = kiln.tune_op(pool, "dense", (256, 256, 256), trials=16).best
    print(best.gflops, best.knobs)

XGBoost-guided search and the on-device correctness check are on by default (`TuneOptions`).
Candidates build in local processes, or on a Dask cluster's workers with
`builder="dask://HOST:PORT"` (`tuner.measure.dask_builder`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from compiler import ops
from compiler.ops.injective import ELEMENTWISE_OPS
from kiln.pool import Pool, pipeline_fitted
from tuner.loop import Callback, TuneProgress, tune
from tuner.measure.builder import Builder
from tuner.measure.device_target import is_cuda_target, is_vta_target
from tuner.measure.result import EvaluatorConfig
from tuner.options import TuneOptions
from tuner.records import RecordStore, Workload, open_store
from tuner.task import Task

if TYPE_CHECKING:
    from compiler.graph.build_model import ModelArtifact
    from compiler.graph.build_model_cuda import CudaModelArtifact
    from compiler.graph.ir import Graph
    from compiler.graph.tasks import TaskKey
    from compiler.ops.space import Config
    from tuner.network.run import ModelRun
    from tuner.network.tune import ModelTuneResult, ModelTuneStep

# Short names for templates whose registered names carry their layout.
OP_ALIASES = {"conv2d": "conv2d_nchwc", "conv2d_1x1": "conv2d_1x1_nchwc"}

# The GPU template of a CPU op whose name is not "cuda_" + the op's without its layout suffix
# (`gpu_template_name`); the workload's fields are the same (a 1x1 conv is a GEMM on a GPU).
GPU_TEMPLATES = {
    "conv2d_1x1_nchwc": "cuda_conv2d_gemm",
    "conv2d_stem_nchwc": "cuda_conv2d",
    "conv2d_winograd_nchwc": "cuda_conv2d",
    **{op: f"cuda_elementwise_{op}" for op in ELEMENTWISE_OPS},
}
GPU_PREFIX = "cuda_"

_LOG = logging.getLogger(__name__)


def gpu_template_name(op: str) -> str:
    """The GPU template a CPU op's task runs as: `GPU_TEMPLATES`, else "cuda_" + the op's name
    without "_nchwc" (dense -> cuda_dense, conv2d_nchwc -> cuda_conv2d)."""
    if op.startswith(GPU_PREFIX):
        return op
    return GPU_TEMPLATES.get(op, GPU_PREFIX + op.removesuffix("_nchwc"))


def for_target(task: Task, target: str) -> Task:
    """`task` as the device of compile target `target` runs it: on an accelerator ("vta",
    "vta/spec=..."), a float `conv2d` or `dense` becomes its int8 template (`vta_conv2d`
    (C, H, W, O, K, stride, pad) or `vta_dense`, each with bias, ReLU and a requantising shift);
    on a GPU ("cuda/sm=90"), an op becomes its GPU template of the same workload fields
    (`gpu_template_name`: dense -> cuda_dense, conv2d -> cuda_conv2d, ...); any other task is
    returned as it is. (Its workload keeps the default dtype, as `tune-op vta_conv2d` writes it,
    so both spellings share records.)

    Raises:
        ValueError: an op the accelerator or GPU has no template for, or a conv it cannot take
            (on the accelerator: batch > 1, a non-square kernel, an epilogue other than 2: bias
            then ReLU; on a GPU: a workload its template refuses).
    """
    if is_cuda_target(target):
        return _for_gpu(task, target)
    if not is_vta_target(target):
        return task
    op, shape = task.workload.op, task.workload.shape
    if op.startswith("vta_"):
        return task
    if op == "conv2d_nchwc":
        n, ic, h, w, oc, kh, kw, stride, pad, epilogue = shape
        if n != 1 or kh != kw or epilogue != 2:
            raise ValueError(
                f"target {target} runs an int8 conv of batch 1, a square kernel and epilogue 2 "
                f"(bias, ReLU, requantised); got N={n} KH={kh} KW={kw} epilogue={epilogue}"
            )
        accel = Workload("vta_conv2d", (ic, h, w, oc, kh, stride, pad))
    elif op == "dense":
        accel = Workload("vta_dense", shape)
    else:
        raise ValueError(f"target {target} has no template for {op} (it runs conv2d and dense)")
    return dataclasses.replace(task, workload=accel)


def _for_gpu(task: Task, target: str) -> Task:
    name = gpu_template_name(task.workload.op)
    if name not in ops.template_names():
        known = ", ".join(n for n in ops.template_names() if n.startswith(GPU_PREFIX)) or "none"
        raise ValueError(
            f"target {target} has no GPU template for {task.workload.op} (it would be {name}; "
            f"GPU templates: {known})"
        )
    if name == task.workload.op:
        return task
    gpu = dataclasses.replace(task, workload=dataclasses.replace(task.workload, op=name))
    try:
        len(gpu.space)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"target {target}: {name} cannot take {task.workload}: {exc}") from None
    return gpu


def open_records(spec: str | os.PathLike[str]) -> RecordStore:
    """The records store at a JSON-lines path or a `redis://` / `rediss://` URL (close it)."""
    return open_store(spec)


def op_task(op: str, shape: Sequence[int], dtype: str = "float32") -> Task:
    """The tuning task of `op` (a template name or alias) at `shape`.

    Raises:
        ValueError: an unknown op, or a shape the template cannot take (the message says which).
    """
    name = OP_ALIASES.get(op, op)
    task = Task(Workload(name, tuple(int(d) for d in shape), dtype))
    try:
        len(task.space)
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    except ValueError as exc:
        alias = f" ({op} is {name})" if name != op else ""
        raise ValueError(f"{exc}{alias}") from None
    return task


def _options(options: TuneOptions | None, trials: int | None) -> TuneOptions:
    options = options or TuneOptions()
    return options if trials is None else dataclasses.replace(options, trials=trials)


def _pipeline_fits(pool: Pool, options: TuneOptions) -> TuneOptions:
    """`options` without `pipeline` where the pool's local devices hold every core
    (`kiln.pool.pipeline_fitted`: nothing may run beside their measurements)."""
    fitted = pipeline_fitted(options, pool.core_sets)
    if fitted is not options:
        _LOG.info("not pipelining: the local devices hold every core")
    return fitted


@contextmanager
def _builder(pool: Pool, given: Builder | str | None) -> Iterator[Builder]:
    """`given`, or the pool's builder of spec `given` ("local" when None), closed on leaving."""
    if given is not None and not isinstance(given, str):
        yield given
        return
    own = pool.builder(spec=given or "local")
    try:
        yield own
    finally:
        own.close()


def tune_op(
    pool: Pool,
    op: str,
    shape: Sequence[int],
    *,
    trials: int | None = None,
    records: RecordStore | str | os.PathLike[str] | None = None,
    options: TuneOptions | None = None,
    evaluator: EvaluatorConfig | None = None,
    builder: Builder | str | None = None,
    callbacks: Sequence[Callback] = (),
) -> TuneProgress:
    """Tune one operator on `pool`'s devices; the progress holds the best record.

    Args:
        trials: the budget (overrides `options.trials`).
        records: a store, a JSON-lines path or a Redis URL every batch is appended to.
        options: search, confirmation, resume and check settings (default `TuneOptions()`).
        evaluator: how the device times each candidate.
        builder: what builds candidates: a Builder, "local" (the default: a LocalBuilder for
            the pool's target) or "dask://HOST:PORT" (a DaskBuilder on that scheduler).
        callbacks: called after every batch with the progress and the batch's records.

    Raises:
        ValueError: an unknown op or bad shape; TuningError: no candidate worked.
    """
    opts = _pipeline_fits(pool, _options(options, trials))
    with _builder(pool, builder) as build, closing(pool.runner(evaluator)) as runner:
        # the space of the threads the builder builds for (the device's `threads` tag)
        task = dataclasses.replace(op_task(op, shape), threads=int(getattr(build, "threads", 1)))
        task = for_target(task, build.target)
        return tune(task, build, runner, opts, records=records, callbacks=callbacks)


def tune_network(
    pool: Pool,
    model: Graph | str | os.PathLike[str],
    *,
    trials: int | None = None,
    records: RecordStore | str | os.PathLike[str] | None = None,
    options: TuneOptions | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    evaluator: EvaluatorConfig | None = None,
    builder: Builder | str | None = None,
    on_batch: Callable[[ModelTuneStep], None] | None = None,
) -> ModelTuneResult:
    """Tune every task of a network (an ONNX file or an imported graph) within one budget.

    `trials` is the whole network's budget; `options.early_stop` retires a task after that
    many trials without a better candidate. On a pool of GPUs ("cuda/sm=90") the tasks are the
    GPU model build's template tasks, and `build_gpu` builds the model from the records.
    """
    from tuner.network.tune import tune_network as _tune_network

    opts = _pipeline_fits(pool, _options(options, trials))
    store = open_store(records) if isinstance(records, str | os.PathLike) else records
    try:
        with _builder(pool, builder) as build, closing(pool.runner(evaluator)) as runner:
            return _tune_network(
                model,
                build,
                runner,
                opts,
                store=store,
                input_shapes=input_shapes,
                on_batch=on_batch,
            )
    finally:
        if store is not None and store is not records:
            store.close()


def build(
    model: Graph | str | os.PathLike[str],
    records: RecordStore | str | os.PathLike[str] | None = None,
    *,
    target: str = "host",
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    threads: int = 1,
) -> ModelArtifact:
    """Compile a network with the best recorded config of each task (defaults without records),
    its kernels for `threads` threads: only records tuned on that many are used, and untuned
    kernels run their outer loops in parallel when `threads` > 1.

    Raises:
        ValueError: `target` is a GPU's: `build_gpu` builds for it.
    """
    from compiler.frontend.onnx import load_onnx
    from compiler.graph.build_model import build_model
    from compiler.graph.ir import Graph
    from tuner.network.tune import configs_from_records

    if is_cuda_target(target):
        raise ValueError(f"{target} is a GPU: build_gpu builds a model for it")
    graph = model if isinstance(model, Graph) else load_onnx(model, input_shapes)
    configs = None
    if records is not None:
        store = open_store(records) if isinstance(records, str | os.PathLike) else records
        try:
            configs = configs_from_records(graph, store, target, threads)
        finally:
            if store is not records:
                store.close()
    return build_model(graph, configs, target, threads)


def build_gpu(
    model: Graph | str | os.PathLike[str],
    records: RecordStore | str | os.PathLike[str] | None = None,
    *,
    target: str = "cuda/sm=90",
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> CudaModelArtifact:
    """Compile a network for a GPU: one CUDA container whose `kiln_model` entry launches every
    kernel (`build_model_cuda`), each template task with its best record on `target`
    (`gpu_model_configs`; defaults without records).

    Raises:
        ValueError: `target` is not a cuda target.
    """
    from compiler.frontend.onnx import load_onnx
    from compiler.graph.build_model_cuda import build_model_cuda
    from compiler.graph.ir import Graph

    if not is_cuda_target(target):
        raise ValueError(f"{target!r} is not a GPU target like cuda/sm=90")
    graph = model if isinstance(model, Graph) else load_onnx(model, input_shapes)
    configs = None
    if records is not None:
        store = open_store(records) if isinstance(records, str | os.PathLike) else records
        try:
            configs = gpu_model_configs(graph, store, target)
        finally:
            if store is not records:
                store.close()
    return build_model_cuda(graph, target, configs)


def gpu_model_configs(graph: Graph, store: RecordStore, target: str) -> dict[TaskKey, Config]:
    """The best recorded config of each GPU template task of `graph` on cuda target `target`
    (records of `kiln tune-op` on a GPU device: one thread, the target's own name); a task
    without one is left out, so the build takes its template's default."""
    from compiler.graph.build_model_cuda import plan_model_cuda
    from tuner.records import apply_best

    configs: dict[TaskKey, Config] = {}
    for task in plan_model_cuda(graph, None, target).tasks:
        if task.template is None:
            continue
        space = ops.get_template(task.template).config_space(task.workload)
        workload = Workload(task.template, task.workload)
        best = apply_best(store.load(workload, target), workload, target, len(space))
        if best is not None:
            configs[task.key] = space.get(best.index)
    return configs


def load_model(path: str | os.PathLike[str]) -> ModelArtifact | CudaModelArtifact:
    """The model `kiln build` (or `save`) wrote into directory `path`, for a CPU or a GPU."""
    from compiler.graph.build_model import ModelArtifact
    from compiler.graph.build_model_cuda import CudaModelArtifact, is_cuda_model

    where = Path(path)
    return CudaModelArtifact.load(where) if is_cuda_model(where) else ModelArtifact.load(where)


def run(
    pool: Pool,
    model: ModelArtifact | CudaModelArtifact | str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray],
    *,
    repeat: int = 5,
) -> ModelRun:
    """Run a built network on one of `pool`'s devices: its outputs and native latency (on a GPU
    model's device: CUDA events around its whole launch sequence).

    Raises:
        ValueError: the pool's devices run another thread count than a CPU model was built for
            (`ModelArtifact.threads`): it would not run as tuned, nor time as it will.
    """
    from compiler.graph.build_model import ModelArtifact
    from compiler.graph.build_model_cuda import CudaModelArtifact
    from tuner.network.run import run_model

    loaded = model if isinstance(model, ModelArtifact | CudaModelArtifact) else load_model(model)
    feeds = {s.name: np.asarray(inputs[s.name]).astype(s.dtype) for s in loaded.inputs}
    if isinstance(loaded, CudaModelArtifact):
        # run_model reads only the artifact, its `kiln_model` entry and the I/O specs, which a
        # GPU model has as a CPU one does
        with closing(pool.runner(EvaluatorConfig(repeat=repeat))) as runner:
            return run_model(loaded, feeds, runner)  # type: ignore[arg-type]
    artifact = loaded
    if pool.thread_counts and pool.thread_counts != (artifact.threads,):
        runs = " or ".join(map(str, pool.thread_counts))
        raise ValueError(
            f"the model was built for {artifact.threads} thread(s), the pool's devices run "
            f"{runs}: build it with threads={pool.thread_counts[0]}, or use a pool of "
            f"{artifact.threads}-thread devices"
        )
    with closing(pool.runner(EvaluatorConfig(repeat=repeat))) as runner:
        return run_model(artifact, feeds, runner)

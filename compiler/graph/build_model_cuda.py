"""Build a whole model for a GPU: one CUDA container whose entry `kiln_model` runs every kernel.

`build_model_cuda(graph, target, configs)`:
- runs the inference passes of `build_model.optimize` except the NCHW[x]c layout (the GPU
  templates take NCHW and OIHW as they are), then fuses;
- lowers every fused group to kernel steps (`model_kernels_cuda`): an anchored group through its
  GPU template (`cuda_conv2d`, `cuda_depthwise_conv2d`, `cuda_dense`, `cuda_batch_matmul`)
  with the group's bias, ReLU / ReLU6 and residual add folded into the template's epilogue
  where they match it, and the rest of the group as an injective tail kernel; a group of one
  softmax, layer norm, max pool or global average pool through its template (`cuda_softmax`,
  `cuda_layer_norm`, `cuda_max_pool2d`, `cuda_global_avg_pool2d`), and a layer norm of another
  epsilon or after injective nodes on the layer norm template's row schedule; every other
  group (and each tail) through `schedule_group_cuda`, one kernel per group output;
- plans one device workspace: the constants (weights, packed for their configs; bool as int32)
  first, each 256-byte aligned, then the intermediates at `plan_memory`'s offsets;
- compiles every kernel into one nvcc unit and wraps it in a `protos.cuda_program` container
  with one entry, `kiln_model`, whose args are the graph inputs then the graph outputs (roles
  "input" / "output", in `graph.inputs` / `graph.outputs` order) and whose program is one launch
  per step, in order, over those args and slices of the workspace; the constants are the
  program's, written into the workspace when a device loads the artifact.

A device's `cuda` backend runs and times the whole launch sequence. Here, with no GPU,
`interpret_model` runs the same program (the container's launches, arg mapping and constants)
with each kernel's lowered loop IR in the interpreter over numpy buffers.

Kernels without a template are scheduled simply (`group_kernel_cuda`): the output's leading
axes fused and spread over blocks of threads, one thread per output element (for a reduction
group: per output row, its row statistics in registers; a group whose statistics span more
than a row runs node by node); correct for any size, untuned, and not tuning tasks. The tasks of a
build (`CudaModelArtifact.tasks`) are its template anchors, keyed as `kiln tune-op` records
them ("cuda_conv2d", workload with the epilogue), and `configs` takes their tuned configs.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compiler.artifact import ArgSpec, Artifact, Entry
from compiler.build_cuda import ProgramCall, build_cuda_program
from compiler.graph import passes as P
from compiler.graph.build_model import TensorSpec, outputs_written
from compiler.graph.ir import Graph
from compiler.graph.model_kernels import Configs, Step, steps_graph
from compiler.graph.model_kernels_cuda import lower_model_cuda
from compiler.graph.passes.fuse import FusionPlan
from compiler.graph.passes.memory_plan import MemoryPlan
from compiler.graph.tasks import TaskSpec
from compiler.ir import interpreter
from compiler.ir.function import PrimFunc
from protos.cuda_program import LaunchArg, decode_module

MODEL_ENTRY = "kiln_model"
MODEL_FORMAT = "cuda"  # model.json's "format": a CPU model's has none
CONTAINER_FILE = "model.kcud"
CONSTANT_ALIGNMENT = 256  # bytes: cudaMalloc's alignment, so a constant is as aligned as a buffer


@dataclass(frozen=True)
class CudaModelArtifact:
    """A model built for a GPU: the one-entry container, its I/O, its workspace (constants
    included), the tasks its templates would tune, and each kernel's lowered loop IR (for
    `interpret_model`; not part of the artifact)."""

    artifact: Artifact
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    workspace_bytes: int
    constant_bytes: int
    launches: int
    tasks: tuple[TaskSpec, ...]
    summary: str
    functions: Mapping[str, PrimFunc] = field(default_factory=dict, repr=False)
    entry: str = MODEL_ENTRY

    def save(self, path: str | Path) -> Path:
        """Write `model.kcud` (the container) and `model.json` into directory `path` (the
        lowered functions are not saved: `interpret_model` needs a fresh build)."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / CONTAINER_FILE).write_bytes(self.artifact.data)
        (entry,) = self.artifact.entries
        meta = {
            "format": MODEL_FORMAT,
            "entry": self.entry,
            "target": self.artifact.target,
            "image": self.artifact.format,
            "sha256": self.artifact.sha256,
            "flop": entry.flop,
            "workspace_bytes": self.workspace_bytes,
            "constant_bytes": self.constant_bytes,
            "launches": self.launches,
            "inputs": [[s.name, list(s.shape), s.dtype] for s in self.inputs],
            "outputs": [[s.name, list(s.shape), s.dtype] for s in self.outputs],
            "tasks": [
                [t.template, list(t.workload), t.weight, t.anchor_op, list(t.groups)]
                for t in self.tasks
            ],
            "summary": self.summary,
        }
        (out / "model.json").write_text(json.dumps(meta, indent=1))
        return out

    @classmethod
    def load(cls, path: str | Path) -> CudaModelArtifact:
        """The model `save` wrote into directory `path`.

        Raises:
            ValueError: the directory holds another kind of model, or its container does not
                match the hash `model.json` records.
        """
        src = Path(path)
        meta = json.loads((src / "model.json").read_text())
        if meta.get("format") != MODEL_FORMAT:
            raise ValueError(f"{src}: not a GPU model (format {meta.get('format')!r})")
        data = (src / CONTAINER_FILE).read_bytes()
        inputs = tuple(TensorSpec(n, tuple(s), d) for n, s, d in meta["inputs"])
        outputs = tuple(TensorSpec(n, tuple(s), d) for n, s, d in meta["outputs"])
        entry = Entry(
            meta["entry"], meta["entry"], _entry_args(inputs, outputs), float(meta["flop"])
        )
        artifact = Artifact(
            data, meta["sha256"], meta["image"], meta["target"], (entry,), meta["workspace_bytes"]
        )
        tasks = tuple(
            TaskSpec(t, tuple(w), weight, op, groups=tuple(g))
            for t, w, weight, op, g in meta["tasks"]
        )
        return cls(
            artifact,
            inputs,
            outputs,
            int(meta["workspace_bytes"]),
            int(meta["constant_bytes"]),
            int(meta["launches"]),
            tasks,
            meta["summary"],
            entry=meta["entry"],
        )


def is_cuda_model(path: str | Path) -> bool:
    """Whether directory `path` holds a model `CudaModelArtifact.save` wrote."""
    try:
        meta = json.loads((Path(path) / "model.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == MODEL_FORMAT


@dataclass(frozen=True)
class CudaModelPlan:
    """Everything `build_model_cuda` compiles: the steps, their values and the workspace."""

    graph: Graph
    fusion: FusionPlan
    steps: list[Step]
    values: Graph
    memory: MemoryPlan
    constants: dict[str, int]  # constant value -> byte offset in the workspace
    constant_bytes: int  # where the planned intermediates start
    tasks: list[TaskSpec]

    @property
    def workspace_bytes(self) -> int:
        return self.constant_bytes + self.memory.total


def optimize_cuda(graph: Graph) -> Graph:
    """The inference pass pipeline without the NCHW[x]c layout: BN folded, constants folded,
    common subexpressions and dead code gone, channel shuffles as gathers."""
    g = P.fold_scale_into_conv(P.fold_batch_norm(graph))
    g = P.fold_constants(P.eliminate_dead_code(P.eliminate_common_subexpressions(g)))
    return outputs_written(P.shuffles_to_gathers(g))


# -- planning and building --------------------------------------------------------------------------


def _nbytes(g: Graph, value: str) -> int:
    t = g.type_of(value)
    return t.size * (4 if t.dtype == "bool" else np.dtype(t.dtype).itemsize)


def _as_constant(value: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(value.astype(np.int32) if value.dtype == bool else value)


def plan_model_cuda(
    graph: Graph, configs: Configs | None = None, target: str = "cuda/sm=90"
) -> CudaModelPlan:
    """Optimize, fuse, lower to GPU kernel steps and plan the workspace (no compiling)."""
    optimized = optimize_cuda(graph)
    fusion = P.fuse(optimized)
    steps, values, tasks = lower_model_cuda(fusion, configs, target)
    memory = P.plan_memory(steps_graph(optimized, values, steps))
    memory.check()
    constants: dict[str, int] = {}
    end = 0
    for step in steps:
        for v in step.reads:
            if v in values.constants and v not in constants:
                end = -(-end // CONSTANT_ALIGNMENT) * CONSTANT_ALIGNMENT
                constants[v] = end
                end += _nbytes(values, v)
    base = -(-end // CONSTANT_ALIGNMENT) * CONSTANT_ALIGNMENT
    return CudaModelPlan(optimized, fusion, steps, values, memory, constants, base, tasks)


def _launch_arg(plan: CudaModelPlan, value: str) -> LaunchArg:
    g = plan.graph
    if value in g.inputs:
        return LaunchArg.entry(g.inputs.index(value))
    if value in g.outputs:
        return LaunchArg.entry(len(g.inputs) + g.outputs.index(value))
    nbytes = _nbytes(plan.values, value)
    if value in plan.constants:
        return LaunchArg.workspace(plan.constants[value], nbytes)
    return LaunchArg.workspace(plan.constant_bytes + plan.memory.offset(value), nbytes)


def _specs(g: Graph, names: Sequence[str]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(v, g.type_of(v).shape, g.type_of(v).dtype) for v in names)


def _c_dtype(dtype: str) -> str:
    return "int32" if dtype == "bool" else dtype


def _entry_args(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> tuple[ArgSpec, ...]:
    """The model entry's args: the graph inputs, then its outputs (bool as int32)."""
    return (
        *(ArgSpec(s.name, s.shape, _c_dtype(s.dtype), "input") for s in inputs),
        *(ArgSpec(s.name, s.shape, _c_dtype(s.dtype), "output") for s in outputs),
    )


def build_model_cuda(
    graph: Graph,
    target: str = "cuda/sm=90",
    configs: Configs | None = None,
    image: str = "cubin",
) -> CudaModelArtifact:
    """Compile `graph` for a GPU into one container with the `kiln_model` entry (module doc).

    `configs` maps (template, workload) to a Config of a GPU template; anchors without one take
    the first config of their template worth measuring.

    Raises:
        GraphError: an op or group has no GPU kernel (naming the group and op), or a config
            does not fit its workload.
        CompilerError: lowering, code generation or nvcc failed, naming the kernel.
    """
    started = time.monotonic()
    plan = plan_model_cuda(graph, configs, target)
    g = plan.graph
    inputs, outputs = _specs(g, g.inputs), _specs(g, g.outputs)
    kernels = [s.kernel for s in plan.steps]
    entry = Entry(
        MODEL_ENTRY, MODEL_ENTRY, _entry_args(inputs, outputs), float(sum(k.flop for k in kernels))
    )
    calls = [
        ProgramCall(s.kernel.symbol, tuple(_launch_arg(plan, v) for v in (*s.reads, *s.writes)))
        for s in plan.steps
    ]
    constants = tuple(
        (offset, _as_constant(plan.values.constants[v]).tobytes())
        for v, offset in plan.constants.items()
    )
    built = build_cuda_program(
        kernels, calls, entry, plan.workspace_bytes, constants, target, image
    )
    weight_digest = hashlib.sha256(b"".join(c for _, c in constants)).hexdigest()[:12]
    summary = (
        f"model {g.name} for {target}: {len(calls)} launches for {len(plan.fusion.groups)} "
        f"groups; {len(plan.tasks)} template tasks; workspace {plan.workspace_bytes} bytes "
        f"({plan.constant_bytes} of constants, {len(constants)} arrays, {weight_digest}); "
        f"built in {time.monotonic() - started:.1f} s"
    )
    return CudaModelArtifact(
        built.artifact,
        inputs,
        outputs,
        plan.workspace_bytes,
        plan.constant_bytes,
        len(calls),
        tuple(plan.tasks),
        summary,
        built.functions,
    )


# -- running without a GPU --------------------------------------------------------------------------

_POISON = 0xFF  # a workspace byte before any write: float32 0xFFFFFFFF is a NaN


def _view(buffer: np.ndarray, func: PrimFunc, index: int, what: str) -> np.ndarray:
    param = func.params[index]
    dtype = np.dtype(param.dtype)
    want = int(np.prod(param.shape)) * dtype.itemsize
    if buffer.nbytes != want:
        raise ValueError(
            f"{func.name} argument {index} ({param.name}): {what} has {buffer.nbytes} bytes, "
            f"the kernel takes {want}"
        )
    return buffer.view(dtype).reshape(param.shape)


def interpret_model(model: CudaModelArtifact, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The graph outputs of running `model`'s container program in the loop-IR interpreter:
    its launches in order, each kernel's lowered function over the entry's args and slices of
    one workspace holding the program's constants (every other byte starts as a NaN pattern).

    Raises:
        ValueError: an input does not match its spec, a launch's buffers do not match its
            kernel's parameters, or the model has no lowered functions (one `load` read).
    """
    module = decode_module(model.artifact.data)
    program = module.programs[model.entry]
    missing = sorted({launch.kernel for launch in program.launches} - set(model.functions))
    if missing:
        raise ValueError(f"no lowered function for {missing[0]}: interpret a model built here")
    if len(inputs) != len(model.inputs):
        raise ValueError(f"{len(model.inputs)} inputs wanted, got {len(inputs)}")
    args: list[np.ndarray] = []
    for spec, x in zip(model.inputs, inputs, strict=True):
        dtype = _c_dtype(spec.dtype)
        if tuple(np.shape(x)) != spec.shape:
            raise ValueError(f"input {spec.name}: shape {np.shape(x)}, wanted {spec.shape}")
        args.append(np.ascontiguousarray(x, dtype))
    for spec in model.outputs:
        args.append(
            np.full(
                spec.shape, np.nan if spec.dtype.startswith("float") else 0, _c_dtype(spec.dtype)
            )
        )
    workspace = np.full(program.workspace_bytes, _POISON, np.uint8)
    for offset, data in program.constants:
        workspace[offset : offset + len(data)] = np.frombuffer(data, np.uint8)
    raw = [a.reshape(-1).view(np.uint8) for a in args]
    for n, launch in enumerate(program.launches):
        func = model.functions[launch.kernel]
        arrays = []
        for i, a in enumerate(launch.args):
            if a.kind == "arg":
                arrays.append(_view(raw[a.index], func, i, f"entry arg {a.index}"))
            else:
                piece = workspace[a.offset : a.offset + a.nbytes]
                arrays.append(_view(piece, func, i, f"launch {n} workspace slice"))
        interpreter.run(func, *arrays)
    return [
        a.astype(bool) if s.dtype == "bool" else a
        for a, s in zip(args[len(inputs) :], model.outputs, strict=True)
    ]

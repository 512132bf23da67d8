"""Build a whole model into one shared object: its kernels plus an ahead-of-time C entry.

`build_model(graph)` runs the inference pass pipeline, fuses, lowers every group to kernel
steps (`model_kernels`), plans one workspace over the steps (pad buffers and anchor outputs
included), and compiles every kernel (one translation unit for a small model; a big one's
kernels in units of about `build.UNIT_CHARS` of C, compiled in parallel while the rest are
lowered, each cached by its content, then linked: `build.compile_kernels`) and

    int32_t kiln_model_run(void **inputs, void **outputs, void *workspace, void **params);

which calls the kernels in order, each with pointers to graph inputs (`inputs[i]`, in
`graph.inputs` order), graph outputs (`outputs[i]`), constants (`params[i]`, in
`ModelArtifact.params` order, weights already packed for their configs) and intermediate buffers
(`workspace + offset`). It returns 0, or the first nonzero code a kernel returned. The caller
owns every buffer: `workspace_bytes` bytes, 64-byte aligned. Bool values are C ints (int32).

The params are also embedded in the shared object (one read-only blob, each param 64-byte
aligned, pulled in with `.incbin` from a content-named file in the build cache directory; its
addresses from `kiln_model_param(i)`), and a packed entry makes the model an ordinary kernel that
an agent runs and times like any other:

    int32_t kiln_model(void **args);   /* + kiln_model__time, the native timing entry */

with args = the graph inputs, the graph outputs, then one uint8 scratch buffer of
`workspace_bytes + 63` bytes (role "workspace"; any alignment: the entry aligns it up to 64).
It is the last entry of `ModelArtifact.artifact`, after one entry per kernel. The compiler never
runs the artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler.artifact import ArgSpec, Artifact, Entry, manifest_source
from compiler.build import compile_kernels, kernel_entry
from compiler.codegen.timing import TIMING_PRELUDE, render_timing, timing_symbol
from compiler.gc_pause import without_gc
from compiler.graph import passes as P
from compiler.graph.ir import Graph, GraphError, Node
from compiler.graph.model_kernels import Configs, Step, lower_model, steps_graph
from compiler.graph.passes.memory_plan import MemoryPlan
from compiler.graph.tasks import TaskSpec, anchor_workload, extract_tasks
from compiler.toolchain import cache_dir, get_target

ENTRY = "kiln_model_run"
MODEL_ENTRY = "kiln_model"
PARAMS_SYMBOL = "kiln_model_params"
# `const void *kiln_model_param(int32_t i)`: param i's address in the embedded blob (NULL past
# the last); an in-process caller passes these to kiln_model_run, so it reads the weights where
# the packed entry (what an agent runs) does
PARAM_ADDRESS = "kiln_model_param"
PARAM_ALIGNMENT = 64  # bytes: each param's offset in the blob, and the workspace's base


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output of the model: name, shape and dtype (bool is passed as int32)."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ModelArtifact:
    """A compiled model: the shared object, its params in entry order, its I/O and workspace,
    and the threads its kernels were built for (`threads`: their configs and parallel loops are
    for that many; a model saved before the count was recorded reads as one thread, as records
    without a count do)."""

    artifact: Artifact
    params: list[np.ndarray]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    workspace_bytes: int
    tasks: tuple[TaskSpec, ...]
    summary: str
    entry: str = ENTRY
    threads: int = 1

    def save(self, path: str | Path) -> Path:
        """Write `model.so`, `params.npz` and `model.json` into directory `path`."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.so").write_bytes(self.artifact.data)
        np.savez(out / "params.npz", *self.params)
        meta = {
            "entry": self.entry,
            "target": self.artifact.target,
            "sha256": self.artifact.sha256,
            "workspace_bytes": self.workspace_bytes,
            "threads": self.threads,
            "inputs": [_spec_json(s) for s in self.inputs],
            "outputs": [_spec_json(s) for s in self.outputs],
            "kernels": [
                {
                    "symbol": e.symbol,
                    "flop": e.flop,
                    "args": [[a.name, list(a.shape), a.dtype, a.role] for a in e.args],
                }
                for e in self.artifact.entries
            ],
            "tasks": [
                {
                    "template": t.template,
                    "workload": list(t.workload),
                    "weight": t.weight,
                    "anchor_op": t.anchor_op,
                    "note": t.note,
                    "groups": list(t.groups),
                }
                for t in self.tasks
            ],
            "summary": self.summary,
        }
        (out / "model.json").write_text(json.dumps(meta, indent=1))
        return out

    @classmethod
    def load(cls, path: str | Path) -> ModelArtifact:
        """The model `save` wrote into directory `path`."""
        src = Path(path)
        meta = json.loads((src / "model.json").read_text())
        with np.load(src / "params.npz") as npz:
            params = [npz[f"arr_{i}"] for i in range(len(npz.files))]
        entries = tuple(
            Entry(
                k["symbol"],
                timing_symbol(k["symbol"]),
                tuple(ArgSpec(a[0], tuple(a[1]), a[2], a[3]) for a in k["args"]),
                float(k["flop"]),
            )
            for k in meta["kernels"]
        )
        data = (src / "model.so").read_bytes()
        artifact = Artifact(
            data, meta["sha256"], "shared_object", meta["target"], entries, meta["workspace_bytes"]
        )
        tasks = tuple(
            TaskSpec(
                t["template"],
                tuple(t["workload"]),
                t["weight"],
                t["anchor_op"],
                t["note"],
                tuple(t["groups"]),
            )
            for t in meta["tasks"]
        )
        return cls(
            artifact,
            params,
            tuple(_spec_of(s) for s in meta["inputs"]),
            tuple(_spec_of(s) for s in meta["outputs"]),
            int(meta["workspace_bytes"]),
            tasks,
            meta["summary"],
            meta["entry"],
            int(meta.get("threads", 1)),
        )


def _spec_json(s: TensorSpec) -> list:
    return [s.name, list(s.shape), s.dtype]


def _spec_of(v: list) -> TensorSpec:
    return TensorSpec(v[0], tuple(v[1]), v[2])


def optimize(graph: Graph, conv_blocks: Mapping[str, tuple[int, int]] | None = None) -> Graph:
    """The inference pass pipeline up to the NCHW[x]c layout (`conv_blocks`: see `to_nchwc`)."""
    g = P.fold_scale_into_conv(P.fold_batch_norm(graph))
    g = P.fold_constants(P.eliminate_dead_code(P.eliminate_common_subexpressions(g)))
    return P.to_nchwc(P.shuffles_to_gathers(g), conv_blocks=conv_blocks)


def config_blocks(fusion: P.FusionPlan, configs: Configs) -> dict[str, tuple[int, int]]:
    """The (input, output) channel blocks the configs of `fusion`'s convolutions ask for.

    Keyed by conv node name, for `optimize`: a tuned config picks its channel blocks, and the
    graph is laid out to them (a conv without a name or a config keeps the default blocks).

    A task's config is chosen for the default blocks of its first conv (`extract_tasks`' order,
    what tuning keeps to); another conv of the same workload laid out in other blocks keeps its
    own, and takes its layout's default config. Inception-style nets run one 1x1 workload both
    as a reduce conv (wide output blocks, into a 3x3) and as a branch joining a concat (the
    concat's blocks): the reduce conv's config had forced its blocks on the branch, the concat
    and the pool after it ran NCHW, and the tuned build ran at 7.6 ms against 6.4 untuned.
    """
    out: dict[str, tuple[int, int]] = {}
    names = Counter(n.name for n in fusion.graph.nodes if n.op == "conv2d_nchwc")
    first: dict[tuple[str, tuple[int, ...]], tuple[int, int]] = {}
    for group in fusion.groups:
        anchor = group.anchor
        if anchor.op != "conv2d_nchwc" or group.nodes[0] is not anchor:
            continue
        aw = anchor_workload(fusion.graph, group)
        own = _blocks_of_node(fusion.graph, anchor)
        if aw.template is None or first.setdefault((aw.template, aw.workload), own) != own:
            continue  # another layout than the conv the task's config was chosen for
        if not anchor.name or names[anchor.name] > 1:
            continue  # not named, or not uniquely: it keeps the default blocks
        config = configs.get((aw.template, aw.workload))
        if config is None:
            continue
        if "c_block" in config:
            out[anchor.name] = (int(config["c_block"]), int(config["c_block"]))
        elif "ic_block" in config and "oc_block" in config:
            out[anchor.name] = (int(config["ic_block"]), int(config["oc_block"]))
    return out


@dataclass(frozen=True)
class ModelPlan:
    """Everything `build_model` compiles: steps, their values, the workspace, params, tasks."""

    graph: Graph
    fusion: P.FusionPlan
    steps: list[Step]
    values: Graph
    memory: MemoryPlan
    params: list[str]
    tasks: list[TaskSpec]


@without_gc
def plan_model(
    graph: Graph, configs: Configs | None = None, target: str = "host", threads: int = 1
) -> ModelPlan:
    """Optimize, fuse, lower to kernel steps and plan the workspace of `graph` (no compiling);
    anchors without a config take the default for `threads` threads.

    With configs, the graph is laid out a second time with the channel blocks the configs chose
    (`config_blocks`), when they differ from the default layout's.
    """
    optimized = outputs_written(optimize(graph))
    fusion = P.fuse(optimized)
    if configs:
        blocks = config_blocks(fusion, configs)
        if any(_blocks_of(fusion, name) != b for name, b in blocks.items()):
            optimized = outputs_written(optimize(graph, blocks))
            fusion = P.fuse(optimized)
    steps, values = lower_model(fusion, configs, target, threads)
    kernels = steps_graph(optimized, values, steps)
    memory = P.plan_memory(kernels)
    memory.check()
    params = list(kernels.constants)
    return ModelPlan(optimized, fusion, steps, values, memory, params, extract_tasks(fusion))


def outputs_written(g: Graph) -> Graph:
    """`g` with a copy (an identity node) for each output that no node writes: a graph input, a
    constant (a folded Shape, a Constant), or an output listed twice. The model entry writes each
    output into a buffer of its own, so each needs a kernel that writes it; an output with no
    elements needs none (and is always a constant or an input: `fold_constants`)."""
    seen: set[str] = set()
    outputs = []
    for i, v in enumerate(g.outputs):
        unwritten = v in g.inputs or v in g.constants or v in seen
        if unwritten and g.type_of(v).size > 0:
            v = g.add_node("identity", [v], [g.type_of(v)], name=f"output_copy_{i}")[0]
        seen.add(v)
        outputs.append(v)
    if outputs != g.outputs:
        g.set_outputs(outputs)
    return g


def _blocks_of(fusion: P.FusionPlan, conv: str) -> tuple[int, int]:
    """The (input, output) blocks of conv node `conv` in a laid-out graph."""
    g = fusion.graph
    node = next(n for n in g.nodes if n.name == conv and n.op == "conv2d_nchwc")
    return _blocks_of_node(g, node)


def _blocks_of_node(g: Graph, node: Node) -> tuple[int, int]:
    return g.type_of(node.inputs[0]).shape[4], g.type_of(node.outputs[0]).shape[4]


def _arg_pointer(plan: ModelPlan, value: str) -> str:
    g = plan.graph
    if value in g.inputs:
        return f"inputs[{g.inputs.index(value)}]"
    if value in g.outputs:
        return f"outputs[{g.outputs.index(value)}]"
    if value in plan.values.constants:
        return f"params[{plan.params.index(value)}]"
    return f"(void *)(ws + {plan.memory.offset(value)})"


def entry_source(plan: ModelPlan) -> str:
    """The C text of `kiln_model_run` calling every step's kernel in order."""
    lines = [
        f"int32_t {ENTRY}(void **inputs, void **outputs, void *workspace, void **params) {{",
        "  char *ws = (char *)workspace;",
        "  int32_t rc;",
        "  (void)ws; (void)inputs; (void)params;",
    ]
    for step in plan.steps:
        pointers = ", ".join(_arg_pointer(plan, v) for v in (*step.reads, *step.writes))
        lines += [
            f"  {{ /* group {step.group} {step.role} */",
            f"    void *a[] = {{{pointers}}};",
            f"    if ((rc = {step.kernel.symbol}(a)) != 0) return rc;",
            "  }",
        ]
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


def param_offsets(params: Sequence[np.ndarray]) -> list[int]:
    """Each param's byte offset in the embedded blob: packed in order, each 64-byte aligned."""
    offsets, end = [], 0
    for p in params:
        end = -(-end // PARAM_ALIGNMENT) * PARAM_ALIGNMENT
        offsets.append(end)
        end += p.nbytes
    return offsets


def params_blob(params: Sequence[np.ndarray]) -> bytes:
    """The bytes `.incbin` embeds: every param at its `param_offsets` offset, zeros between."""
    offsets = param_offsets(params)
    size = offsets[-1] + params[-1].nbytes if params else 0
    blob = bytearray(size)
    for off, p in zip(offsets, params, strict=True):
        blob[off : off + p.nbytes] = np.ascontiguousarray(p).tobytes()
    return bytes(blob)


def _blob_file(blob: bytes) -> Path:
    """`blob` in the build cache directory, named by its hash (so the source names its content)."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"params-{hashlib.sha256(blob).hexdigest()}.bin"
    if not path.exists() or path.stat().st_size != len(blob):
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(blob)
        os.replace(tmp, path)  # atomic: a concurrent build sees the whole file or none
    resolved = path.resolve()
    if any(c in str(resolved) for c in '"\\\n'):
        raise GraphError(f"cannot embed params from {resolved}: the path has a quote or backslash")
    return resolved


def packed_entry_source(
    plan: ModelPlan, params: Sequence[np.ndarray], blob_path: Path | None
) -> str:
    """The C text of the params blob and of `kiln_model(void **args)` over `kiln_model_run`."""
    n_in, n_out = len(plan.graph.inputs), len(plan.graph.outputs)
    lines: list[str] = []
    pointers = "0"
    if blob_path is not None:
        lines += [
            "__asm__(",
            '  ".section .rodata.kiln_model_params,\\"a\\"\\n"',
            f'  ".balign {PARAM_ALIGNMENT}\\n"',
            f'  ".globl {PARAMS_SYMBOL}\\n"',
            f'  ".hidden {PARAMS_SYMBOL}\\n"',
            f'  "{PARAMS_SYMBOL}:\\n"',
            f'  ".incbin \\"{blob_path}\\"\\n"',
            '  ".previous\\n");',
            f"extern const unsigned char {PARAMS_SYMBOL}[]",
            '    __attribute__((visibility("hidden"), aligned(64)));',
        ]
        pointers = ", ".join(f"(void *)({PARAMS_SYMBOL} + {off})" for off in param_offsets(params))
    lines += [
        f"static void *const kiln_param_table[] = {{{pointers}}};",
        f"const void *{PARAM_ADDRESS}(int32_t i) {{",
        f"  return i >= 0 && i < {len(params)} ? kiln_param_table[i] : 0;",
        "}",
        f"int32_t {MODEL_ENTRY}(void **args) {{",
        f"  uintptr_t ws = (uintptr_t)args[{n_in + n_out}];",
        f"  ws = (ws + {PARAM_ALIGNMENT - 1}) & ~(uintptr_t){PARAM_ALIGNMENT - 1};",
        f"  return {ENTRY}(args, args + {n_in}, (void *)ws, (void **)kiln_param_table);",
        "}",
        "",
    ]
    return "\n".join(lines)


def _summary(plan: ModelPlan) -> str:
    mem = plan.memory
    group_plan = P.plan_memory(plan.fusion)
    tuned = sum(t.weight for t in plan.tasks if t.template)
    return (
        f"model {plan.graph.name}: {len(plan.steps)} kernels for {len(plan.fusion.groups)} groups; "
        f"{len(plan.tasks)} tasks ({tuned} anchors with templates); {len(plan.params)} params; "
        f"workspace {mem.total} bytes (lower bound {mem.lower_bound}; groups alone "
        f"{group_plan.total})"
    )


def _as_param(value: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(value.astype(np.int32) if value.dtype == bool else value)


def build_model(
    graph: Graph, configs: Configs | None = None, target: str = "host", threads: int = 1
) -> ModelArtifact:
    """Compile `graph` into one shared object with the `kiln_model_run` entry (see module doc).

    `configs` maps (template, workload) to a Config; anchors without one take the first config
    worth measuring that keeps the graph's channel blocks, for `threads` threads (above 1:
    their outer loops run on OpenMP's threads, `model_kernels.default_config`). The thread
    count at run time is OpenMP's (OMP_NUM_THREADS or omp_set_num_threads in the caller);
    its threads persist between calls, so every kernel of every call shares one pool.

    Raises:
        GraphError: an op has no kernel (naming the group and op), or a config does not fit.
        CompilerError: lowering, code generation or the C compiler failed.
    """
    plan = plan_model(graph, configs, target, threads)
    tgt = get_target(target)
    kernels = [s.kernel for s in plan.steps]
    params = [_as_param(plan.values.constants[v]) for v in plan.params]
    blob = params_blob(params)
    # The prelude is in the kernels' unit already; only the model's own timing entry is added.
    model_timing = render_timing([MODEL_ENTRY]).removeprefix(TIMING_PRELUDE)
    entries = tuple(kernel_entry(k) for k in kernels)
    g = plan.graph
    inputs, outputs = _specs(g, g.inputs), _specs(g, g.outputs)
    model_entry = Entry(
        MODEL_ENTRY,
        timing_symbol(MODEL_ENTRY),
        (
            *(ArgSpec(s.name, s.shape, _c_dtype(s.dtype), "input") for s in inputs),
            *(ArgSpec(s.name, s.shape, _c_dtype(s.dtype), "output") for s in outputs),
            ArgSpec("workspace", (plan.memory.total + PARAM_ALIGNMENT - 1,), "uint8", "workspace"),
        ),
        sum(e.flop for e in entries),
    )
    tail = [
        entry_source(plan),
        packed_entry_source(plan, params, _blob_file(blob) if blob else None),
        model_timing,
        manifest_source((*entries, model_entry)),
    ]
    shared = compile_kernels(kernels, tail, tgt)
    digest = hashlib.sha256(shared.data).hexdigest()
    artifact = Artifact(
        shared.data, digest, "shared_object", tgt.name, (*entries, model_entry), plan.memory.total
    )
    return ModelArtifact(
        artifact,
        params,
        inputs,
        outputs,
        plan.memory.total,
        tuple(plan.tasks),
        _summary(plan),
        threads=threads,
    )


def _c_dtype(dtype: str) -> str:
    """Bool values cross the C ABI as int32."""
    return "int32" if dtype == "bool" else dtype


def _specs(g: Graph, names: Sequence[str]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(v, g.type_of(v).shape, g.type_of(v).dtype) for v in names)

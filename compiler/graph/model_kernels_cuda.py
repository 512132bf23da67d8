"""A fused graph as GPU kernel steps: `build_model_cuda`'s plan (the CPU's is `model_kernels`).

`lower_model_cuda(fusion, configs, target)` turns every group into one or more `Step`s:
- an anchored group (conv2d, dense, matmul) through its GPU template, the group's bias, ReLU /
  ReLU6 and residual add folded into the template's epilogue where they match it
  (`_CudaLowering.epilogue`), the rest of the group as an injective tail kernel; weights
  re-packed for the template's config as new constants;
- a group of one softmax, layer norm, max pool or global average pool through its template; a
  layer norm of another epsilon, or after injective nodes, on the layer norm's row schedule;
- a gather by computed indices: a one-node kernel;
- every other group: `schedule_group_cuda`, one kernel per output, or one per node where a
  group's statistics span more than an output row.
It returns the steps, the graph of every value they pass (`values`: new constants included),
and the template tasks (`TaskSpec`, keyed as `kiln tune-op` records them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler import te
from compiler.build import Kernel
from compiler.graph.group_kernel import group_tensors
from compiler.graph.group_kernel_cuda import (
    ROW_THREADS,
    as_rows,
    attach_depth,
    layer_norm_rows,
    placeholders_of,
    schedule_group_cuda,
)
from compiler.graph.ir import Graph, GraphError, Node
from compiler.graph.model_kernels import Configs, Step
from compiler.graph.ops import node_category
from compiler.graph.passes.fuse import FusedGroup, FusionPlan
from compiler.graph.registry import Category
from compiler.graph.tasks import TaskKey, TaskSpec, is_relu6
from compiler.graph.te_ops import TE_COMPUTES
from compiler.ops import op_templates
from compiler.ops.base import OpTemplate
from compiler.ops.cuda.gemm import Epilogue
from compiler.ops.cuda.norm import row_space, schedule_rows_cuda
from compiler.ops.normalization import LAYER_NORM_EPS
from compiler.ops.space import Config


@dataclass(frozen=True)
class _Epilogue:
    """What of an anchored group's tail a GPU template applies as it stores its output."""

    kind: Epilogue
    bias: str | None  # a constant value, or None
    residual: str | None  # a computed value, or None
    out: str  # the value the template writes
    consumed: tuple[Node, ...]


def first_config(template: OpTemplate, workload: tuple[int, ...], target: str) -> Config:
    """The first config of the template's space worth measuring on `target` (else the first)."""
    space = template.config_space(workload)
    for i in range(len(space)):
        config = space.get(i)
        if template.worth_measuring(workload, config, target):
            return config
    return space.get(0)


class _CudaLowering:
    def __init__(self, fusion: FusionPlan, configs: Configs, target: str) -> None:
        self.graph = fusion.graph
        self.fusion = fusion
        self.configs = configs
        self.target = target
        self.values = fusion.graph.copy()
        self.steps: list[Step] = []
        self.tasks: dict[TaskKey, TaskSpec] = {}
        self._defaults: dict[TaskKey, Config] = {}

    def constant(self, hint: str, value: np.ndarray) -> str:
        return self.values.add_constant(self.values.fresh_name(hint), value)

    def lower(self) -> list[Step]:
        for group in self.fusion.groups:
            if group.category <= Category.REDUCTION:
                if not self.reduction_template(group):
                    self.group(group, "group")
            elif group.anchor.op == "gather" and len(group.nodes) == 1:
                self.gather(group)
            elif group.category == Category.COMPLEX_OUT_FUSABLE:
                self.anchored(group)
            else:
                ops = ", ".join(group.ops)
                raise GraphError(f"group #{group.index} ({ops}): no GPU kernel for an opaque op")
        return self.steps

    # -- untemplated ---------------------------------------------------------------------------

    def group(self, group: FusedGroup, role: str, part: str = "") -> None:
        """One kernel per output of an injective or reduction group (`schedule_group_cuda`);
        a group of several nodes whose reductions would leave some of an output's leading axes
        to each thread (or cannot be computed inside its loops at all) runs node by node
        instead, its intermediates in the workspace, so that each reduction is a kernel's
        output, one thread per element."""
        inputs, outputs = group_tensors(self.values, group)
        if len(group.nodes) > 1 and any(
            attach_depth(o) < max(len(o.shape) - 1, 1) for o in outputs
        ):
            self.nodes_apart(group, role)
            return
        base = f"m_g{group.index}" + ("" if role == "group" else f"_{role}") + part
        for i, (value, out) in enumerate(zip(group.outputs, outputs, strict=True)):
            used = placeholders_of(out)
            reads = tuple(v for v, p in zip(group.inputs, inputs, strict=True) if p in used)
            args = [p for p in inputs if p in used]
            symbol = base if len(outputs) == 1 else f"{base}_o{i}"
            try:
                sch = schedule_group_cuda(out)
            except GraphError as exc:
                raise GraphError(f"group #{group.index} ({', '.join(group.ops)}): {exc}") from exc
            kernel = Kernel(sch, [*args, out], symbol)
            self.steps.append(Step(kernel, group.index, role, reads, (value,)))

    def nodes_apart(self, group: FusedGroup, role: str) -> None:
        """A kernel per node of `group` (`group`), in order."""
        nodes = list(group.nodes)
        for i, node in enumerate(nodes):
            later = {v for n in nodes[i + 1 :] for v in n.inputs}
            outputs = tuple(v for v in node.outputs if v in later or v in group.outputs)
            if not outputs:
                continue
            inputs = tuple(dict.fromkeys(node.inputs))
            category = node_category(self.values, node)
            one = FusedGroup(group.index, (node,), node, category, inputs, outputs)
            self.group(one, role, f"_n{i}")

    def gather(self, group: FusedGroup) -> None:
        (node,) = group.nodes
        ins = [
            te.placeholder(self.values.type_of(v).shape, self.values.type_of(v).dtype, name=v)
            for v in node.inputs
        ]
        types = [self.values.type_of(o) for o in node.outputs]
        (out,) = TE_COMPUTES["gather"](ins, node.attrs, types, name=node.outputs[0])
        kernel = Kernel(schedule_group_cuda(out), [*ins, out], f"m_g{group.index}")
        self.steps.append(Step(kernel, group.index, "group", tuple(node.inputs), group.outputs))

    # -- templated -----------------------------------------------------------------------------

    def reduction_template(self, group: FusedGroup) -> bool:
        """Lower a group of one softmax (last axis), layer norm (last axis, the template's
        epsilon, constant scale and bias), max pool, or global average pool through its GPU
        template (the view of the data as the template's rows or NCHW is the same bytes);
        False when the group is not one of those, or a template does not take its attributes."""
        g = self.graph
        *prologue, node = group.nodes
        if prologue:
            injective = all(node_category(g, n) == Category.INJECTIVE for n in prologue)
            if injective and group.outputs == tuple(node.outputs) and self.rows_norm(node):
                self.layer_norm_rows(group, node, float(node.attrs.get("epsilon", 1e-5)))
                return True
            return False
        xt = g.type_of(node.inputs[0])
        if xt.dtype != "float32" or not xt.shape:
            return False
        last = int(node.attrs.get("axis", -1)) % len(xt.shape) == len(xt.shape) - 1
        rows, cols = int(np.prod(xt.shape[:-1])), xt.shape[-1]
        logical: list[np.ndarray | None] = [None]
        workload: tuple[int, ...]
        if node.op == "softmax" and last:
            name, workload = "cuda_softmax", (rows, cols)
        elif node.op == "layer_norm" and last:
            eps = np.float32(node.attrs.get("epsilon", 1e-5))  # ONNX's attribute is a float32
            params = [g.constants.get(v) for v in node.inputs[1:]]
            if any(p is None or p.size != cols for p in params):
                return False
            if eps != np.float32(LAYER_NORM_EPS):  # the template's is fixed: its schedule
                self.layer_norm_rows(group, node, float(eps))
                return True
            name, workload = "cuda_layer_norm", (rows, cols)
            logical += [np.asarray(p, np.float32).reshape(cols) for p in params if p is not None]
        elif node.op == "global_avg_pool2d" and len(xt.shape) == 4:
            name, workload = "cuda_global_avg_pool2d", tuple(xt.shape)
        elif node.op == "max_pool2d" and len(xt.shape) == 4:
            kernel = tuple(int(k) for k in node.attrs["kernel"])
            strides = tuple(int(v) for v in node.attrs.get("strides", (1, 1)))
            pads = tuple(int(v) for v in node.attrs.get("pads", (0, 0, 0, 0)))
            dilations = tuple(int(v) for v in node.attrs.get("dilations", (1, 1)))
            square = len(set(kernel)) == len(set(strides)) == len(set(pads)) == 1
            if not square or dilations != (1, 1):
                return False
            n, c, h, w = xt.shape
            k, stride, pad = kernel[0], strides[0], pads[0]
            out = (n, c, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
            if g.type_of(node.outputs[0]).shape != out:  # ceil_mode's extra window
                return False
            name, workload = "cuda_max_pool2d", (n, c, h, w, k, stride, pad)
        else:
            return False
        reads = tuple(node.inputs[: len(logical)])
        self.template_step(group, node, name, workload, reads, logical, node.outputs[0])
        return True

    def anchored(self, group: FusedGroup) -> None:
        anchor = group.anchor
        if group.nodes[0] is not anchor:
            raise GraphError(f"group #{group.index}: anchor {anchor.op} is not its first node")
        if anchor.op == "conv2d":
            epilogue = self.conv(group, anchor)
        elif anchor.op in ("dense", "matmul"):
            epilogue = self.gemm(group, anchor)
        else:
            raise GraphError(f"group #{group.index}: no GPU template for anchor {anchor.op}")
        tail = [n for n in group.nodes[1:] if n not in epilogue.consumed]
        if tail:
            defined = {v for n in tail for v in n.outputs}
            inside = tuple(dict.fromkeys(v for n in tail for v in n.inputs if v not in defined))
            outputs = tuple(v for v in group.outputs if v in defined)
            sub = FusedGroup(
                group.index, tuple(tail), tail[-1], Category.INJECTIVE, inside, outputs
            )
            self.group(sub, "tail")

    def epilogue(self, group: FusedGroup, anchor: Node, bias: str | None) -> _Epilogue:
        """The longest chain after `anchor` that a template epilogue applies: [+ bias], then a
        ReLU, a ReLU6, or + residual then ReLU; `bias` is the anchor's own bias input."""
        nodes = list(group.nodes)
        value = anchor.outputs[0]
        channels = self.graph.type_of(value).shape[-1 if anchor.op != "conv2d" else 1]

        def next_reader(v: str) -> Node | None:
            readers = [n for n in nodes if v in n.inputs]
            if v in group.outputs or len(readers) != 1 or readers[0] is anchor:
                return None
            return readers[0]

        consumed: list[Node] = []
        node = next_reader(value)
        if bias is None and anchor.op != "conv2d" and node is not None and node.op == "add":
            other = next(iter(v for v in node.inputs if v != value), None)
            if (
                other is not None
                and other in self.graph.constants
                and node.inputs.count(value) == 1
                and self.graph.type_of(node.outputs[0]) == self.graph.type_of(value)
                and self.graph.constants[other].size == channels
                and self.graph.constants[other].shape[-1:] == (channels,)
            ):
                bias, value = other, node.outputs[0]
                consumed.append(node)
                node = next_reader(value)
        kind = Epilogue.BIAS if bias is not None else Epilogue.NONE
        residual = None
        if node is not None and (node.op == "relu" or is_relu6(node)):
            kind = Epilogue.BIAS_RELU if node.op == "relu" else Epilogue.BIAS_RELU6
            value = node.outputs[0]
            consumed.append(node)
        elif node is not None and node.op == "add" and node.inputs.count(value) == 1:
            other = next(v for v in node.inputs if v != value)
            relu = next_reader(node.outputs[0])
            same = self.graph.type_of(other) == self.graph.type_of(value)
            # the residual must exist before the kernel runs: computed by another group
            outside = other in group.inputs and other not in self.graph.constants
            if same and outside and relu is not None and relu.op == "relu":
                kind, residual, value = Epilogue.BIAS_ADD_RELU, other, relu.outputs[0]
                consumed += [node, relu]
        return _Epilogue(kind, bias, residual, value, tuple(consumed))

    def rows_norm(self, node: Node) -> bool:
        """Whether `node` is a float32 layer norm over its last axis with constant scale and
        bias of that axis's length (what `layer_norm_rows` takes)."""
        if node.op != "layer_norm":
            return False
        xt = self.graph.type_of(node.inputs[0])
        if xt.dtype != "float32" or not xt.shape:
            return False
        if int(node.attrs.get("axis", -1)) % len(xt.shape) != len(xt.shape) - 1:
            return False
        params = [self.graph.constants.get(v) for v in node.inputs[1:]]
        return all(p is not None and p.size == xt.shape[-1] for p in params)

    def layer_norm_rows(self, group: FusedGroup, node: Node, eps: float) -> None:
        """A layer norm over the last axis, after the group's injective nodes (BERT's embedding
        sums) or with another epsilon than `cuda_layer_norm`'s, on that template's schedule
        (`schedule_rows_cuda`: a block of threads a row, cross-thread mean and variance, the
        injective nodes inlined); untuned, so not a task."""
        x = node.inputs[0]
        prologue = [n for n in group.nodes if n is not node]
        if prologue:
            defined = {v for n in prologue for v in n.outputs}
            inside = tuple(dict.fromkeys(v for n in prologue for v in n.inputs if v not in defined))
            sub = FusedGroup(
                group.index, tuple(prologue), prologue[-1], Category.INJECTIVE, inside, (x,)
            )
            inputs, (data,) = group_tensors(self.values, sub)
            reads: tuple[str, ...] = inside
        else:
            xt = self.values.type_of(x)
            data = te.placeholder(xt.shape, xt.dtype, name=x)
            inputs, reads = [data], (x,)
        rows_view = as_rows(data)
        rows, cols = rows_view.shape
        gamma, beta, out = layer_norm_rows(rows_view, eps)
        space = row_space("cuda_layer_norm", (rows, cols))
        threads = max(t for t in ROW_THREADS if t <= max(ROW_THREADS[0], min(cols, 256)))
        config = space.get(
            space.index_of(
                {"rows": "block", "threads": threads, "unroll": False, "cache_row": False}
            )
        )
        scale, bias = (
            self.constant(f"{v}_gpu", np.asarray(self.graph.constants[v], np.float32).reshape(cols))
            for v in node.inputs[1:]
        )
        kernel = Kernel(
            schedule_rows_cuda(out, rows_view, config),
            [*inputs, gamma, beta, out],
            f"m_g{group.index}",
            8.0 * rows * cols,
        )
        step = Step(kernel, group.index, "group", (*reads, scale, bias), (node.outputs[0],), config)
        self.steps.append(step)

    def config_for(self, name: str, workload: tuple[int, ...]) -> Config:
        key = (name, workload)
        config = self.configs.get(key)
        if config is None:
            if key not in self._defaults:
                self._defaults[key] = first_config(op_templates()[name], workload, self.target)
            config = self._defaults[key]
        return config

    def template_step(
        self,
        group: FusedGroup,
        anchor: Node,
        name: str,
        workload: tuple[int, ...],
        reads: tuple[str, ...],
        logical: list[np.ndarray | None],
        out: str,
    ) -> None:
        """The template's kernel over `reads` (a None in `logical` is a runtime value, an array
        a constant packed for the config), writing `out`."""
        template = op_templates()[name]
        config = self.config_for(name, workload)
        shapes = template.logical_shapes(workload)
        filled = [
            np.zeros(s, np.float32) if a is None else a
            for a, s in zip(logical, shapes, strict=True)
        ]
        packed = template.pack_inputs(workload, config, filled)
        values = tuple(
            v if a is None else self.constant(f"{v}_gpu", p)
            for v, a, p in zip(reads, logical, packed, strict=True)
        )
        sch, args = template.instantiate(workload, config)
        for value, arg in zip([*values, out], args, strict=True):
            have = self.values.type_of(value).nbytes
            want = int(np.prod(arg.shape)) * np.dtype(arg.dtype).itemsize
            if have != want:
                raise GraphError(
                    f"group #{group.index}: {name}{workload} argument {arg.name} "
                    f"{list(arg.shape)} does not match value {value!r} "
                    f"({self.values.type_of(value)})"
                )
        kernel = Kernel(sch, args, f"m_g{group.index}_anchor", template.flop(workload))
        self.steps.append(Step(kernel, group.index, "anchor", values, (out,), config))
        key = (name, workload)
        old = self.tasks.get(key)
        self.tasks[key] = TaskSpec(
            name,
            workload,
            (old.weight if old else 0) + 1,
            anchor.op,
            groups=(*(old.groups if old else ()), group.index),
        )

    def conv(self, group: FusedGroup, node: Node) -> _Epilogue:
        g = self.graph
        x, w = node.inputs[0], node.inputs[1]
        if w not in g.constants:
            raise GraphError(f"group #{group.index}: conv2d of a computed weight has no GPU kernel")
        n, c, h, wd = g.type_of(x).shape
        o, cg, kh, kw = g.type_of(w).shape
        strides = tuple(int(s) for s in node.attrs.get("strides", (1, 1)))
        pads = tuple(int(p) for p in node.attrs.get("pads", (0, 0, 0, 0)))
        dilations = tuple(int(d) for d in node.attrs.get("dilations", (1, 1)))
        groups = int(node.attrs.get("groups", 1))
        if len(set(strides)) != 1 or len(set(pads)) != 1 or dilations != (1, 1):
            raise GraphError(
                f"group #{group.index}: conv2d with strides {strides}, pads {pads}, dilations "
                f"{dilations}: the GPU templates take one stride, one pad and no dilation"
            )
        has_bias = len(node.inputs) > 2
        bias = node.inputs[2] if has_bias else None
        epi = self.epilogue(group, node, bias)
        weight = g.constants[w].astype(np.float32)
        if groups == 1:
            name = "cuda_conv2d"
            workload: tuple[int, ...] = (n, c, h, wd, o, kh, kw, strides[0], pads[0], epi.kind)
        elif groups == c == o and cg == 1 and kh == kw and epi.residual is None:
            name = "cuda_depthwise_conv2d"
            workload = (n, c, h, wd, kh, kw, strides[0], pads[0], epi.kind)
        else:
            raise GraphError(
                f"group #{group.index}: conv2d with {groups} groups ({c} -> {o} channels) has "
                "no GPU template"
            )
        reads: list[str] = [x, w]
        logical: list[np.ndarray | None] = [None, weight]
        if epi.kind is not Epilogue.NONE:
            b = g.constants[bias] if bias is not None else np.zeros(o, np.float32)
            reads.append(bias or f"{w}_zero_bias")  # a constant's name is its hint only
            logical.append(np.asarray(b, np.float32).reshape(-1))
        if epi.residual is not None:
            reads.append(epi.residual)
            logical.append(None)
        self.template_step(group, node, name, workload, tuple(reads), logical, epi.out)
        return epi

    def gemm(self, group: FusedGroup, node: Node) -> _Epilogue:
        g = self.graph
        a, b = node.inputs[0], node.inputs[1]
        at, bt = g.type_of(a), g.type_of(b)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is not None and g.constants.get(bias) is None:
            raise GraphError(f"group #{group.index}: {node.op} with a computed bias")
        if b in g.constants and len(bt.shape) == 2 and len(at.shape) >= 2:
            epi = self.epilogue(group, node, bias)
            k, n = bt.shape
            m = int(np.prod(at.shape[:-1]))
            workload: tuple[int, ...] = (m, n, k, int(epi.kind))
            reads: list[str] = [a, b]
            logical: list[np.ndarray | None] = [None, np.ascontiguousarray(g.constants[b].T)]
            name = "cuda_dense"
        elif (
            len(at.shape) >= 2
            and len(bt.shape) == len(at.shape)
            and at.shape[:-2] == bt.shape[:-2]
            and at.dtype == bt.dtype == "float32"
        ):
            epi = self.epilogue(group, node, bias)
            m, k = at.shape[-2:]
            n = bt.shape[-1]
            batch = int(np.prod(at.shape[:-2]))
            workload = (batch, m, n, k, int(epi.kind))
            reads, logical, name = [a, b], [None, None], "cuda_batch_matmul"
        else:
            raise GraphError(
                f"group #{group.index}: {node.op} of {at} by {bt} has no GPU template "
                "(broadcast batch axes, or a 1-D operand)"
            )
        if epi.kind is not Epilogue.NONE:
            n_out = g.type_of(node.outputs[0]).shape[-1]
            array = g.constants[epi.bias] if epi.bias else np.zeros(n_out, np.float32)
            reads.append(epi.bias or f"{b}_zero_bias")  # a constant's name is its hint only
            logical.append(np.asarray(array, np.float32).reshape(-1))
        if epi.residual is not None:
            reads.append(epi.residual)
            logical.append(None)
        self.template_step(group, node, name, workload, tuple(reads), logical, epi.out)
        return epi


def lower_model_cuda(
    fusion: FusionPlan, configs: Configs | None = None, target: str = "cuda/sm=90"
) -> tuple[list[Step], Graph, list[TaskSpec]]:
    """The steps of `fusion` in launch order, the graph holding every value they pass, and the
    template tasks; anchors without a config take their template's `first_config`."""
    lowering = _CudaLowering(fusion, configs or {}, target)
    steps = lowering.lower()
    return steps, lowering.values, list(lowering.tasks.values())

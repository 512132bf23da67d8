"""Whole models built into one shared object (kernels + `kiln_model_run`), run, checked vs onnxruntime.

Each model is an ONNX graph (small nets made here with `onnx.helper`, ResNet-18 and BERT-tiny from
`compiler.zoo`), imported, built with `build_model`, and run once through the ctypes runner
(`model_runtime`) on seeded random inputs; outputs must be within 1e-4 relative of onnxruntime's.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_runtime import ModelRunner
from onnx import TensorProto, helper, numpy_helper

from compiler import toolchain, zoo
from compiler.codegen.timing import HARNESS_SOURCE
from compiler.frontend.onnx import from_onnx
from compiler.graph import Category, GraphError, get_op, registry
from compiler.graph import passes as P
from compiler.graph.build_model import (
    MODEL_ENTRY,
    ModelArtifact,
    build_model,
    optimize,
    plan_model,
)
from compiler.graph.tasks import extract_tasks
from compiler.ops import get_template

pytestmark = pytest.mark.usefixtures("build_cache")

RTOL = 1e-4


# -- helpers --------------------------------------------------------------------------------------


class Net:
    """A small ONNX graph under construction with seeded random initializers."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def param(self, shape: Sequence[int], low: float | None = None) -> str:
        self.count += 1
        name = f"p{self.count}"
        if low is None:
            value = self.rng.standard_normal(shape) * 0.3
        else:
            value = self.rng.uniform(low, low + 1.0, shape)
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def node(self, op: str, inputs: Sequence[str], **attrs: Any) -> str:
        self.count += 1
        out = f"v{self.count}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pads: Sequence[int] = ()):
        pads = list(pads) or [k // 2] * 4
        w = self.param((cout, cin, k, k))
        return self.node("Conv", [x, w], kernel_shape=[k, k], strides=[stride] * 2, pads=pads)

    def bn(self, x: str, c: int) -> str:
        params = [self.param((c,)), self.param((c,)), self.param((c,)), self.param((c,), 0.5)]
        return self.node("BatchNormalization", [x, *params], epsilon=1e-5)

    def model(self, inputs: dict[str, tuple[int, ...]], outputs: Sequence[str]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "net",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits,
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = zoo.IR_VERSION
        return m


def feeds_for(sess: ort.InferenceSession, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in sess.get_inputs():
        if "int" in inp.type:
            feeds[inp.name] = rng.integers(0, 30_000, size=inp.shape).astype(np.int64)
        else:
            feeds[inp.name] = rng.standard_normal(inp.shape).astype(np.float32)
    return feeds


def check_model(model: onnx.ModelProto, seed: int = 0) -> ModelArtifact:
    """Build `model`, run it once, compare every output with onnxruntime's; the artifact."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    feeds = feeds_for(sess, seed)
    expected = sess.run(None, feeds)
    graph = from_onnx(model)
    built = build_model(graph)
    got = ModelRunner(built).run(feeds)  # the packed entry, params embedded in the .so
    unpacked = ModelRunner(built, packed=False).run(feeds)  # kiln_model_run, params passed in
    for a, b in zip(got, unpacked, strict=True):
        np.testing.assert_array_equal(a, b)
    model_entry = built.artifact.entries[-1]
    assert model_entry.symbol == MODEL_ENTRY and model_entry.timing_symbol == "kiln_model__time"
    assert [a.role for a in model_entry.args] == (
        ["input"] * len(built.inputs) + ["output"] * len(built.outputs) + ["workspace"]
    )
    assert [a.shape for a in model_entry.args[:-1]] == [s.shape for s in built.inputs] + [
        s.shape for s in built.outputs
    ]
    assert model_entry.args[-1].shape == (built.workspace_bytes + 63,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=RTOL * np.abs(e).max())
    plan = plan_model(graph)
    assert built.workspace_bytes == plan.memory.total == built.artifact.workspace_bytes
    assert plan.memory.lower_bound <= plan.memory.total
    return built


# -- small nets -----------------------------------------------------------------------------------


def test_conv_bn_relu() -> None:
    n = Net(1)
    y = n.node("Relu", [n.bn(n.conv("x", 3, 16, 3), 16)])
    built = check_model(n.model({"x": (1, 3, 12, 12)}, [y]))
    (task,) = built.tasks
    assert task.template == "conv2d_stem_nchwc" and task.workload[-1] == 2  # bias + relu fused
    assert "kernels" in built.summary


def test_relu6_after_a_conv_is_the_templates_epilogue() -> None:
    n = Net(11)
    n.inits.append(numpy_helper.from_array(np.array(6.0, np.float32), "six"))
    n.inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
    x = n.node("Clip", [n.bn(n.conv("x", 16, 32, 1, pads=(0, 0, 0, 0)), 32), "zero", "six"])
    y = n.node("Clip", [n.bn(n.conv(x, 32, 32, 3), 32), "zero", "six"])
    built = check_model(n.model({"x": (1, 16, 9, 9)}, [n.node("Mul", [y, x])]), seed=4)
    assert sorted(t.workload[-1] for t in built.tasks) == [3, 3]  # bias + ReLU6 fused


def test_residual_block_with_asymmetric_pads_and_strides() -> None:
    n = Net(2)
    x = n.node("Relu", [n.bn(n.conv("x", 8, 16, 3), 16)])
    y = n.node("Relu", [n.bn(n.conv(x, 16, 16, 3), 16)])
    y = n.bn(n.conv(y, 16, 16, 3), 16)
    y = n.node("Relu", [n.node("Add", [y, x])])
    z = n.conv(y, 16, 32, 3, stride=2, pads=(0, 0, 1, 1))  # TF "SAME": pads after only
    down = n.conv(y, 16, 32, 1, stride=2, pads=(0, 0, 0, 0))
    out = n.node("Relu", [n.node("Add", [z, down])])
    built = check_model(n.model({"x": (1, 8, 10, 10)}, [out]))
    notes = [t for t in built.tasks if "asymmetric" in t.note]
    assert len(notes) == 1 and notes[0].workload == (1, 16, 11, 11, 32, 3, 3, 2, 0, 0)
    # the two 16 -> 16 convs with the fused relu are one task of weight 1, the others apart
    weights = {t.workload: t.weight for t in built.tasks}
    assert weights[(1, 16, 10, 10, 16, 3, 3, 1, 1, 1)] == 1
    assert weights[(1, 16, 10, 10, 16, 3, 3, 1, 1, 2)] == 1


def test_a_model_split_into_translation_units_builds_and_matches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past UNIT_CHARS of kernel C a build is several units compiled apart and linked; the
    model (packed and unpacked entries, the kernels' timing entries) works as one unit does."""
    import compiler.build

    commands: list[list[str]] = []
    real_run = toolchain._run

    def spy(cmd: list[str]) -> Any:
        if Path(cmd[-1]).read_bytes() != HARNESS_SOURCE.encode():  # the harness: once per cache
            commands.append(cmd)
        return real_run(cmd)

    monkeypatch.setattr(toolchain, "_run", spy)
    monkeypatch.setattr(compiler.build, "UNIT_CHARS", 1)  # every kernel a unit of its own
    n = Net(2)
    x = n.node("Relu", [n.bn(n.conv("x", 8, 16, 3), 16)])
    y = n.conv(x, 16, 16, 1)
    out = n.node("Relu", [n.node("Add", [y, x])])
    built = check_model(n.model({"x": (1, 8, 10, 10)}, [out]))
    units = [c for c in commands if "-c" in c]
    kernels = [e for e in built.artifact.entries if e.symbol != MODEL_ENTRY]
    assert len(units) == len(kernels) + 1  # a unit per kernel, and the model's own entries
    assert len(commands) == len(units) + 1  # then one link
    so = tmp_path / "model.so"
    so.write_bytes(built.artifact.data)
    lib = ctypes.CDLL(str(so))
    for entry in kernels:  # every kernel and its timing entry is exported from its unit
        assert getattr(lib, entry.symbol) and getattr(lib, entry.timing_symbol)


def test_3x3_stride_1_convs_run_by_winograd_over_inputs_padded_to_whole_tiles() -> None:
    """A 10x10 image is three F(4x4) tiles a side: the pad step writes the rows and columns the
    last tile reads past the image, for symmetric and asymmetric pads alike, under either tile
    size."""
    n = Net(5)
    x = n.node("Relu", [n.bn(n.conv("x", 16, 16, 3), 16)])
    y = n.conv(x, 16, 32, 3, pads=(1, 0, 1, 2))  # asymmetric: a workload of pad 0 over 9x9
    model = n.model({"x": (1, 16, 10, 10)}, [y])
    built = check_model(model, seed=3)
    assert [t.template for t in built.tasks] == ["conv2d_winograd_nchwc"] * 2
    assert sorted(t.workload for t in built.tasks) == [
        (1, 16, 10, 10, 16, 3, 3, 1, 1, 2),
        (1, 16, 12, 12, 32, 3, 3, 1, 0, 0),
    ]
    graph = from_onnx(model)
    template = get_template("conv2d_winograd_nchwc")
    configs = {}
    for task in built.tasks:
        space = template.config_space(task.workload)
        configs[task.key] = next(
            c for c in (space.get(i) for i in range(len(space))) if c["tile"] == 2
        )
    tuned = build_model(graph, configs)
    assert tuned.artifact.sha256 != built.artifact.sha256
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 16, 10, 10)).astype(np.float32)}
    want = np.asarray(ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0])
    got = ModelRunner(tuned).run(feeds)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())


def test_pools_and_dense_head_with_two_outputs() -> None:
    n = Net(3)
    x = n.node("Relu", [n.conv("x", 4, 16, 3)])
    a = n.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b = n.node("AveragePool", [a], kernel_shape=[2, 2], strides=[1, 1])
    g = n.node("Flatten", [n.node("GlobalAveragePool", [b])])
    logits = n.node("Gemm", [g, n.param((16, 10)), n.param((10,))])
    probs = n.node("Softmax", [logits], axis=-1)
    built = check_model(n.model({"x": (2, 4, 9, 9)}, [probs, logits]))
    assert ("dense", (2, 10, 16)) in [t.key for t in built.tasks]


@pytest.mark.parametrize(("act", "epilogue"), [("Relu", 2), ("Clip", 3), (None, 1)])
def test_depthwise_bias_and_activation_are_its_epilogue(act: str | None, epilogue: int) -> None:
    """A depthwise conv's bias (its folded BatchNorm) and ReLU / ReLU6 run in its own kernel's
    epilogue, and it pads its input itself: the group is one kernel, with no pad step before it
    and no tail pass over the output."""
    n = Net(4)
    x = n.node("Relu", [n.bn(n.conv("x", 3, 16, 3), 16)])
    w = n.param((16, 1, 3, 3))
    d = n.node("Conv", [x, w], kernel_shape=[3, 3], group=16, pads=[1, 1, 1, 1], strides=[2, 2])
    y = n.bn(d, 16)
    if act == "Clip":
        n.inits.append(numpy_helper.from_array(np.array(6.0, np.float32), "six"))
        n.inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
        y = n.node("Clip", [y, "zero", "six"])
    elif act is not None:
        y = n.node(act, [y])
    y = n.conv(y, 16, 8, 1, pads=(0, 0, 0, 0))  # MobileNetV2's projection: y is not an output
    model = n.model({"x": (1, 3, 8, 8)}, [y])
    built = check_model(model)
    (task,) = [t for t in built.tasks if t.template == "depthwise_conv2d_nchwc"]
    assert task.workload[-1] == epilogue
    plan = plan_model(from_onnx(model))
    (group,) = [s.group for s in plan.steps if s.config and "c_block" in s.config]
    assert [s.role for s in plan.steps if s.group == group] == ["anchor"]


def test_transformer_block() -> None:
    n = Net(5)
    seq, hidden = 8, 32
    q = n.node("Add", [n.node("MatMul", ["x", n.param((hidden, hidden))]), n.param((hidden,))])
    k = n.node("MatMul", ["x", n.param((hidden, hidden))])
    scores = n.node("MatMul", [q, n.node("Transpose", [k], perm=[0, 2, 1])])
    att = n.node("Softmax", [n.node("Mul", [scores, n.param(())])], axis=-1)
    mixed = n.node("MatMul", [att, "x"])
    res = n.node("Add", [mixed, "x"])
    out = n.node(
        "LayerNormalization", [res, n.param((hidden,)), n.param((hidden,))], axis=-1, epsilon=1e-5
    )
    built = check_model(n.model({"x": (1, seq, hidden)}, [out]))
    keys = [t.key for t in built.tasks if t.template]
    assert keys == [("dense", (seq, hidden, hidden))]
    assert built.tasks[0].weight == 2
    assert sum(1 for t in built.tasks if t.template is None) == 2  # the batched matmuls


# -- whole models ---------------------------------------------------------------------------------


def test_resnet18() -> None:
    built = check_model(zoo.build("resnet18", image=32), seed=1)
    graph = from_onnx(zoo.build("resnet18", image=32))
    fusion = P.fuse(plan_model(graph).graph)
    anchors = [g for g in fusion.groups if g.anchor.op in ("conv2d_nchwc", "dense")]
    assert sum(t.weight for t in built.tasks) == len(anchors) == 21
    assert len({t.key for t in built.tasks}) == len(built.tasks) < len(anchors)
    assert all(t.template for t in built.tasks)


def test_bert_tiny_and_save_load(tmp_path: Path) -> None:
    model = zoo.build("bert_tiny", seq=16)
    built = check_model(model, seed=2)
    assert {t.key for t in built.tasks if t.template} == {
        ("dense", (16, 128, 128)),
        ("dense", (16, 512, 128)),
        ("dense", (16, 128, 512)),
    }
    loaded = ModelArtifact.load(built.save(tmp_path / "bert"))
    assert loaded.artifact.sha256 == built.artifact.sha256
    assert loaded.tasks == built.tasks and loaded.inputs == built.inputs
    assert all(np.array_equal(a, b) for a, b in zip(loaded.params, built.params, strict=True))
    ids = {"input_ids": np.arange(16, dtype=np.int64).reshape(1, 16) * 7}
    np.testing.assert_array_equal(ModelRunner(loaded).run(ids)[0], ModelRunner(built).run(ids)[0])


# -- configs, tasks and errors --------------------------------------------------------------------


def dense_net() -> onnx.ModelProto:
    n = Net(6)
    y = n.node("Relu", [n.node("Gemm", ["x", n.param((24, 40)), n.param((40,))])])
    return n.model({"x": (5, 24)}, [y])


def test_configs_choose_the_kernel_and_repack_the_weights() -> None:
    model = dense_net()
    graph = from_onnx(model)
    default = build_model(graph)
    (task,) = default.tasks
    space = get_template("dense").config_space(task.workload)
    config = next(space.get(i) for i in range(len(space)) if space.get(i)["nr"] == 48)
    tuned = build_model(graph, {task.key: config})
    assert tuned.artifact.sha256 != default.artifact.sha256
    assert any(p.shape[-1] == 48 for p in tuned.params)  # B packed in panels of 48
    x = np.random.default_rng(0).standard_normal((5, 24)).astype(np.float32)
    want = np.asarray(ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0])
    got = ModelRunner(tuned).run({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())


def residual_net() -> onnx.ModelProto:
    n = Net(7)
    x = n.node("Relu", [n.conv("x", 32, 32, 3)])
    y = n.node("Relu", [n.conv(x, 32, 32, 3)])
    y = n.node("Relu", [n.node("Add", [n.conv(y, 32, 32, 3), x])])
    return n.model({"x": (1, 32, 6, 6)}, [n.conv(y, 32, 16, 1)])


def test_configs_with_other_channel_blocks_lay_the_graph_out_to_them() -> None:
    model = residual_net()
    graph = from_onnx(model)
    default = plan_model(graph)
    assert {
        default.graph.type_of(v).shape[-1]
        for v in default.graph.types
        if len(default.graph.type_of(v).shape) == 5
    } == {16}
    picks = {}  # each task's first config whose blocks are not the default 16s
    for task in extract_tasks(P.fuse(default.graph)):
        assert task.template is not None
        space = get_template(task.template).config_space(task.workload)
        picks[task.key] = next(
            space.get(i)
            for i in range(len(space))
            if (space.get(i)["ic_block"], space.get(i)["oc_block"]) not in ((16, 16),)
        )
    plan = plan_model(graph, picks)
    chosen = {(s.config["ic_block"], s.config["oc_block"]) for s in plan.steps if s.config}
    assert chosen == {(c["ic_block"], c["oc_block"]) for c in picks.values()}
    assert chosen - {(16, 16)}
    built = build_model(graph, picks)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = feeds_for(sess, 3)
    want = sess.run(None, feeds)[0]
    got = ModelRunner(built).run(feeds)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())


def test_convs_that_share_a_name_keep_the_default_blocks() -> None:
    model = residual_net()
    for node in model.graph.node:
        node.name = "same"
    graph = from_onnx(model)
    (task, *_) = extract_tasks(P.fuse(plan_model(graph).graph))
    assert task.template is not None
    space = get_template(task.template).config_space(task.workload)
    config = next(space.get(i) for i in range(len(space)) if space.get(i)["ic_block"] == 32)
    plan = plan_model(graph, {task.key: config})  # the config is not applied: its blocks differ
    assert all(
        s.config["ic_block"] != 32 for s in plan.steps if s.config and "ic_block" in s.config
    )
    (x,) = graph.inputs
    feeds = {x: np.random.default_rng(4).standard_normal(graph.type_of(x).shape).astype(np.float32)}
    want = ModelRunner(build_model(graph)).run(feeds)[0]  # onnxruntime refuses repeated names
    got = ModelRunner(build_model(graph, {task.key: config})).run(feeds)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())


def test_a_config_keeps_its_blocks_off_a_conv_of_its_workload_laid_out_otherwise() -> None:
    """One 1x1 workload twice: a reduce conv into a 3x3 (wide output blocks) and a branch
    joining a concat (the concat's blocks). A config tuned with the reduce conv's blocks is not
    forced on the branch: the concat and the pool after it stay blocked."""
    net = Net(5)
    x = "x"
    relu = net.node("Relu", [net.conv(x, 64, 64, 1, pads=[0] * 4)])  # reduce conv ...
    mid = net.node("Relu", [net.conv(relu, 64, 16, 3)])  # ... into a 3x3
    branch = net.node("Relu", [net.conv(x, 64, 64, 1, pads=[0] * 4)])  # same workload, a branch
    cat = net.node("Concat", [mid, branch], axis=1)
    pool = net.node("MaxPool", [cat], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    model = net.model({x: (1, 64, 14, 14)}, [pool])
    graph = from_onnx(model)
    default = plan_model(graph)
    blocks = [
        (default.graph.type_of(n.inputs[0]).shape[4], default.graph.type_of(n.outputs[0]).shape[4])
        for n in default.graph.nodes
        if n.op == "conv2d_nchwc" and n.attrs["template"] == "conv2d_1x1_nchwc"
    ]
    assert blocks == [(16, 32), (16, 16)]  # one workload, two layouts
    (task,) = [t for t in extract_tasks(P.fuse(default.graph)) if t.template == "conv2d_1x1_nchwc"]
    space = get_template("conv2d_1x1_nchwc").config_space(task.workload)
    config = next(
        space.get(i)
        for i in range(len(space) - 1, -1, -1)
        if (space.get(i)["ic_block"], space.get(i)["oc_block"]) == (16, 32)
    )
    plan = plan_model(graph, {task.key: config})
    ops = plan.graph.op_counts()
    assert "max_pool2d" not in ops and ops["max_pool2d_nchwc"] == 1 and ops["layout_transform"] == 2
    used = [s.config for s in plan.steps if s.config and s.config.get("oc_block") == 32]
    assert used == [config]  # the reduce conv takes the tuned config, the branch its default
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = feeds_for(sess, 5)
    want = sess.run(None, feeds)[0]
    got = ModelRunner(build_model(graph, {task.key: config})).run(feeds)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())


def test_convs_no_template_covers_run_with_generic_kernels() -> None:
    n = Net(8)
    w = n.param((16, 16, 3, 3))
    y = n.node(
        "Conv", ["x", w, n.param((16,))], kernel_shape=[3, 3], strides=[1, 2], pads=[1, 0, 1, 2]
    )
    y = n.node("Relu", [y])
    d = n.param((16, 1, 3, 3))
    z = n.node("Conv", [y, d], kernel_shape=[3, 3], group=16, dilations=[2, 2], pads=[2, 2, 2, 2])
    model = n.model({"x": (1, 16, 7, 7)}, [z])
    tasks = extract_tasks(P.fuse(optimize(from_onnx(model))))
    assert [t.template for t in tasks] == [None, None]
    assert "strides (1, 2)" in tasks[0].note and "dilations (2, 2)" in tasks[1].note
    check_model(model)


def test_an_opaque_op_without_a_kernel_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # conv_transpose2d has a te compute (a REDUCTION); made OPAQUE here, it has no kernel
    opaque = dataclasses.replace(get_op("conv_transpose2d"), category=Category.OPAQUE)
    monkeypatch.setitem(registry._REGISTRY, "conv_transpose2d", opaque)
    n = Net(9)
    w = n.param((4, 8, 3, 3))
    # dilated: a conv_transpose2d node (the undilated ones import as a conv2d)
    y = n.node("ConvTranspose", ["x", w], kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2])
    graph = from_onnx(n.model({"x": (1, 4, 5, 5)}, [y]))
    with pytest.raises(GraphError, match=r"conv_transpose2d.*no kernel for an opaque op"):
        build_model(graph)

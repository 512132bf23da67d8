"""Whole models built for a GPU (compiler/graph/build_model_cuda.py): the one-entry CUDA
container's launch sequence, run in the loop-IR interpreter over one workspace, against
onnxruntime at tiny sizes; ResNet-18 and BERT-tiny built and compiled by nvcc for sm_90.
Nothing here runs on a GPU; every build runs nvcc (skipped without it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import te, zoo
from compiler.artifact import ArgSpec, Artifact, Entry
from compiler.build import Kernel
from compiler.build_cuda import ProgramCall, build_cuda_program
from compiler.frontend.onnx import from_onnx
from compiler.graph.build_model_cuda import (
    CONSTANT_ALIGNMENT,
    MODEL_ENTRY,
    CudaModelArtifact,
    build_model_cuda,
    interpret_model,
    plan_model_cuda,
)
from compiler.graph.group_kernel_cuda import schedule_group_cuda
from compiler.graph.ir import GraphError
from compiler.ops.cuda.gemm import Epilogue
from compiler.toolchain import find_nvcc
from protos.cuda_program import LaunchArg, decode_module, encode_module

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")


def _const(name: str, value: object, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _model(
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def small_cnn() -> onnx.ModelProto:
    """conv + bias + ReLU, max pool, a residual conv (+ bias + add + ReLU), a strided residual
    block with a strided 1x1 shortcut conv, a depthwise conv, global average pool, flatten,
    Gemm, softmax."""
    rng = np.random.default_rng(1)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return _const(name, rng.standard_normal(shape) * 0.3)

    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        n("Add", ["c2", "p1"], ["s2"]),
        n("Relu", ["s2"], ["r2"]),
        # a strided block whose shortcut is a strided 1x1 conv, as ResNet's downsampling ones
        n("Conv", ["r2", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("Conv", ["r2", "wds", "bds"], ["ds"], strides=[2, 2]),
        n("Add", ["c4", "ds"], ["s4"]),
        n("Relu", ["s4"], ["r4"]),
        n("Conv", ["r4", "wdw", "bdw"], ["c3"], pads=[1, 1, 1, 1], group=4),
        n("Relu", ["c3"], ["r3"]),
        n("GlobalAveragePool", ["r3"], ["g"]),
        n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "wd", "bd"], ["d"], transB=1),
        n("Softmax", ["d"], ["y"], axis=-1),
    ]
    inits = [
        w("w1", 4, 3, 3, 3),
        w("b1", 4),
        w("w2", 4, 4, 3, 3),
        w("b2", 4),
        w("w4", 4, 4, 3, 3),
        w("b4", 4),
        w("wds", 4, 4, 1, 1),
        w("bds", 4),
        w("wdw", 4, 1, 3, 3),
        w("bdw", 4),
        w("wd", 5, 4),
        w("bd", 5),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])
    return _model(nodes, inits, [x], [y])


def transformer_block(
    seq: int = 4, hidden: int = 8, heads: int = 2, ffn: int = 12
) -> onnx.ModelProto:
    """Self-attention (Q/K/V MatMul + Add, Reshape, Transpose, Q.K^T, Div, Softmax, P.V), the
    output projection and a residual Add, LayerNormalization, a Gelu of Div/Erf/Add/Mul, and a
    second layer norm decomposed into ReduceMean, Sub, Pow, Sqrt, Div, Mul, Add."""
    rng = np.random.default_rng(2)
    dh = hidden // heads

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return _const(name, rng.standard_normal(shape) * 0.3)

    inits = [
        *(w(f"w{p}", hidden, hidden) for p in "qkvo"),
        *(w(f"b{p}", hidden) for p in "qkvo"),
        w("w1", hidden, ffn),
        w("b1", ffn),
        w("w2", ffn, hidden),
        w("b2", hidden),
        _const("g1", 1 + 0.1 * rng.standard_normal(hidden)),
        w("be1", hidden),
        _const("g2", 1 + 0.1 * rng.standard_normal(hidden)),
        w("be2", hidden),
        _const("heads", [1, seq, heads, dh], np.int64),
        _const("merged", [1, seq, hidden], np.int64),
        _const("scale", math.sqrt(dh)),
        _const("root2", math.sqrt(2.0)),
        _const("one", 1.0),
        _const("half", 0.5),
        _const("two", 2.0),
        _const("eps", 1e-5),
    ]
    n = helper.make_node
    nodes = []
    for p in "qkv":
        perm = [0, 2, 3, 1] if p == "k" else [0, 2, 1, 3]
        nodes += [
            n("MatMul", ["x", f"w{p}"], [f"{p}m"]),
            n("Add", [f"{p}m", f"b{p}"], [f"{p}a"]),
            n("Reshape", [f"{p}a", "heads"], [f"{p}r"]),
            n("Transpose", [f"{p}r"], [f"{p}t"], perm=perm),
        ]
    nodes += [
        n("MatMul", ["qt", "kt"], ["scores"]),
        n("Div", ["scores", "scale"], ["scaled"]),
        n("Softmax", ["scaled"], ["probs"], axis=-1),
        n("MatMul", ["probs", "vt"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "merged"], ["ctx_m"]),
        n("MatMul", ["ctx_m", "wo"], ["om"]),
        n("Add", ["om", "bo"], ["oa"]),
        n("Add", ["oa", "x"], ["res1"]),
        n("LayerNormalization", ["res1", "g1", "be1"], ["ln1"], axis=-1, epsilon=1e-5),
        n("MatMul", ["ln1", "w1"], ["f1"]),
        n("Add", ["f1", "b1"], ["f1b"]),
        n("Div", ["f1b", "root2"], ["gd"]),
        n("Erf", ["gd"], ["ge"]),
        n("Add", ["ge", "one"], ["ga"]),
        n("Mul", ["f1b", "ga"], ["gm"]),
        n("Mul", ["gm", "half"], ["gh"]),
        n("MatMul", ["gh", "w2"], ["f2"]),
        n("Add", ["f2", "b2"], ["f2b"]),
        n("Add", ["f2b", "ln1"], ["res2"]),
        n("ReduceMean", ["res2"], ["mu"], axes=[-1]),
        n("Sub", ["res2", "mu"], ["centred"]),
        n("Pow", ["centred", "two"], ["squares"]),
        n("ReduceMean", ["squares"], ["var"], axes=[-1]),
        n("Add", ["var", "eps"], ["var_eps"]),
        n("Sqrt", ["var_eps"], ["std"]),
        n("Div", ["centred", "std"], ["normed"]),
        n("Mul", ["normed", "g2"], ["scaled_ln"]),
        n("Add", ["scaled_ln", "be2"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])
    return _model(nodes, inits, [x], [y])


def check_against_onnxruntime(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], tol: float = 1e-4
) -> CudaModelArtifact:
    built = build_model_cuda(from_onnx(model))
    got = interpret_model(built, [feeds[s.name] for s in built.inputs])
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert not np.isnan(g).any()
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    return built


def test_small_cnn_matches_onnxruntime_through_the_container_program() -> None:
    x = np.random.default_rng(3).standard_normal((1, 3, 9, 9)).astype(np.float32)
    built = check_against_onnxruntime(small_cnn(), {"x": x})
    # one launch per fused group: the bias, ReLU and residual add went into the templates
    assert built.launches == 10
    epilogues: dict[str | None, list[int]] = {t.template: [] for t in built.tasks}
    for t in built.tasks:
        epilogues[t.template] += [t.workload[-1]] * t.weight
    assert sorted(epilogues["cuda_conv2d"]) == [
        Epilogue.BIAS,  # the shortcut
        Epilogue.BIAS_RELU,
        Epilogue.BIAS_ADD_RELU,
        Epilogue.BIAS_ADD_RELU,
    ]
    assert epilogues["cuda_depthwise_conv2d"] == [Epilogue.BIAS_RELU]
    assert epilogues["cuda_dense"] == [Epilogue.BIAS]
    # the pools and the softmax through their templates; only the flatten is untemplated
    assert {"cuda_max_pool2d", "cuda_global_avg_pool2d", "cuda_softmax"} <= set(epilogues)
    assert sum(t.weight for t in built.tasks) == 9


def test_transformer_block_matches_onnxruntime() -> None:
    x = np.random.default_rng(4).standard_normal((1, 4, 8)).astype(np.float32)
    built = check_against_onnxruntime(transformer_block(), {"x": x})
    anchors: dict[str | None, int] = {}
    for t in built.tasks:
        anchors[t.template] = anchors.get(t.template, 0) + t.weight
    # Q, K, V, the output projection and two FFN layers; Q.K^T and P.V
    # and the softmax and the first layer norm through their templates (the decomposed second
    # one is untemplated reductions)
    assert anchors == {
        "cuda_dense": 6,
        "cuda_batch_matmul": 2,
        "cuda_softmax": 1,
        "cuda_layer_norm": 1,
    }


def test_reduced_bert_tiny_matches_onnxruntime() -> None:
    model = zoo.bert_tiny(seq=4, layers=1, hidden=16, heads=2, intermediate=32, pooled=True)
    ids = np.random.default_rng(5).integers(0, zoo.BERT_VOCAB, (1, 4)).astype(np.int64)
    built = check_against_onnxruntime(model, {"input_ids": ids})
    assert [s.name for s in built.outputs] == ["last_hidden_state", "pooler_output"]
    # BERT's layer norms (epsilon 1e-12, not the template's; the embeddings' one after two
    # adds) run on the template's row schedule, with cross-thread statistics
    plan = plan_model_cuda(from_onnx(model))
    rows = [s for s in plan.steps if s.role == "group" and s.config and "rows" in s.config]
    assert len(rows) == 3
    assert rows[0].reads[:3] == ("embeddings.word", "embeddings.token_type", "embeddings.position")


def test_statistics_over_the_channels_run_node_by_node() -> None:
    """A layer norm over C, H and W after an add: one thread per image would compute it all,
    so the group runs a kernel per node (the add's result in the workspace)."""
    rng = np.random.default_rng(7)
    shape = (2, 4, 3, 5)
    n = helper.make_node
    nodes = [
        n("Add", ["x", "b"], ["xb"]),
        n("LayerNormalization", ["xb", "g", "be"], ["y"], axis=1, epsilon=1e-5),
    ]
    inits = [_const(name, rng.standard_normal(shape[1:])) for name in ("b", "g", "be")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    model = _model(nodes, inits, [x], [y])
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    built = check_against_onnxruntime(model, feeds)
    assert built.launches == 2
    plan = plan_model_cuda(from_onnx(model))
    assert len(plan.fusion.groups) == 1
    assert [s.kernel.symbol for s in plan.steps] == ["m_g0_n0", "m_g0_n1"]


def test_a_scalar_sum_and_what_follows_it() -> None:
    n = helper.make_node
    nodes = [
        n("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
        n("Mul", ["s", "two"], ["y"]),
        n("Sub", ["x", "y"], ["z"]),
    ]
    inits = [_const("axes", [0, 1], np.int64), _const("two", 2.0)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4])
    model = _model(nodes, inits, [x], [y, z])
    feeds = {"x": np.random.default_rng(8).standard_normal((3, 4)).astype(np.float32)}
    check_against_onnxruntime(model, feeds)


def test_the_container_is_one_entry_over_args_and_one_workspace() -> None:
    built = build_model_cuda(from_onnx(small_cnn()))
    art = built.artifact
    assert art.format == "cubin" and art.target == "cuda/sm=90"
    (entry,) = art.entries
    assert entry.symbol == entry.timing_symbol == MODEL_ENTRY
    assert [(a.name, a.role) for a in entry.args] == [("x", "input"), ("y", "output")]
    module = decode_module(art.data)
    assert module.arch == "sm_90" and module.image[:4] == b"\x7fELF"
    program = module.programs[MODEL_ENTRY]
    assert len(program.launches) == built.launches
    assert program.workspace_bytes == built.workspace_bytes
    program.check(len(entry.args))
    # the weights are the program's constants, below the planned intermediates
    assert program.constants and all(o % CONSTANT_ALIGNMENT == 0 for o, _ in program.constants)
    assert max(o + len(d) for o, d in program.constants) <= built.constant_bytes
    first, last = program.launches[0], program.launches[-1]
    assert first.args[0] == LaunchArg.entry(0)  # the graph input
    assert last.args[-1] == LaunchArg.entry(1)  # the graph output
    assert all(a.kind == "ws" for launch in program.launches[1:-1] for a in launch.args[-1:])
    # every kernel the program launches is in the image
    for launch in program.launches:
        assert f"{launch.kernel}".encode() in module.image


def test_the_interpreter_reads_the_weights_from_the_container() -> None:
    built = build_model_cuda(from_onnx(transformer_block()))
    x = np.random.default_rng(6).standard_normal((1, 4, 8)).astype(np.float32)
    (good,) = interpret_model(built, [x])
    module = decode_module(built.artifact.data)
    program = module.programs[MODEL_ENTRY]
    (offset, data), *rest = program.constants
    flipped = bytes(b ^ 0x40 for b in data[:4]) + data[4:]  # the first weight's sign and more
    changed = dataclasses.replace(program, constants=((offset, flipped), *rest))
    data = encode_module(dataclasses.replace(module, programs={MODEL_ENTRY: changed}))
    art = built.artifact
    corrupt = Artifact(data, hashlib.sha256(data).hexdigest(), art.format, art.target, art.entries)
    (bad,) = interpret_model(dataclasses.replace(built, artifact=corrupt), [x])
    assert not np.allclose(good, bad)


@pytest.mark.parametrize(
    ("name", "launches"),
    [("resnet18", 24), ("bert_tiny", 40)],
)
def test_zoo_models_build_and_compile_for_sm90(name: str, launches: int) -> None:
    model = zoo.resnet18(image=32) if name == "resnet18" else zoo.bert_tiny(seq=8)
    built = build_model_cuda(from_onnx(model))
    assert built.launches == launches
    assert decode_module(built.artifact.data).image[:4] == b"\x7fELF"


def test_group_schedule_refuses_a_reduction_read_across_rows() -> None:
    x = te.placeholder((4, 8), name="x")
    k = te.reduce_axis((0, 8), name="k")
    total = te.compute((4,), lambda i: te.sum(x[i, k.var], axis=k), name="total")
    # every row reads row 0's sum: not along the output's leading axis
    out = te.compute((4, 8), lambda i, j: x[i, j] - total[0], name="out")
    with pytest.raises(GraphError, match="leading axes"):
        schedule_group_cuda(out)


def test_program_build_checks_its_calls() -> None:
    x = te.placeholder((64,), name="x")
    y = te.compute((64,), lambda i: x[i] * 2.0, name="y")
    kernel = Kernel(schedule_group_cuda(y), [x, y], "twice")
    entry = Entry(
        MODEL_ENTRY,
        MODEL_ENTRY,
        (ArgSpec("x", (64,), "float32", "input"), ArgSpec("y", (64,), "float32", "output")),
        0.0,
    )
    with pytest.raises(ValueError, match="no kernel"):
        build_cuda_program([kernel], [ProgramCall("thrice", ())], entry)
    with pytest.raises(ValueError, match="1 arguments for 2"):
        build_cuda_program([kernel], [ProgramCall("twice", (LaunchArg.entry(0),))], entry)
    with pytest.raises(ValueError, match="outside the workspace"):
        build_cuda_program(
            [kernel],
            [ProgramCall("twice", (LaunchArg.entry(0), LaunchArg.workspace(0, 256)))],
            entry,
            workspace_bytes=128,
        )
    built = build_cuda_program(
        [kernel],
        [
            ProgramCall("twice", (LaunchArg.entry(0), LaunchArg.workspace(0, 256))),
            ProgramCall("twice", (LaunchArg.workspace(0, 256), LaunchArg.entry(1))),
        ],
        entry,
        workspace_bytes=256,
    )
    program = decode_module(built.artifact.data).programs[MODEL_ENTRY]
    assert [launch.kernel for launch in program.launches] == ["twice", "twice"]
    assert set(built.functions) == {"twice"}


def test_plan_places_constants_before_the_intermediates() -> None:
    plan = plan_model_cuda(from_onnx(transformer_block()))
    assert plan.constants and plan.constant_bytes % CONSTANT_ALIGNMENT == 0
    assert plan.workspace_bytes == plan.constant_bytes + plan.memory.total
    read = {v for s in plan.steps for v in s.reads}
    assert set(plan.constants) <= read

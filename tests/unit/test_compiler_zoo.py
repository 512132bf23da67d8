"""compiler.zoo: the reference models are valid ONNX, shaped like the real networks, and run.

Parameter counts are the real models' own: torchvision's resnet18 (11,689,512) and mobilenet_v2
(3,504,872), HF's google/bert_uncased_L-2_H-128_A-2 (4,385,920 with the pooler). BatchNorm
running statistics are buffers there, so they are left out of the count here too.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler import zoo
from tuner.network.timing import OrtPeer

BN_STATS = (".running_mean", ".running_var")


def op_counts(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node)


def weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of onnx's own (slow, numpy) evaluator of the ONNX semantics."""
    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]


def image_feed(batch: int, image: int, seed: int = 1) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((batch, 3, image, image))
    return {"input": x.astype(np.float32)}


def ids_feed(seq: int, seed: int = 1) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, zoo.BERT_VOCAB, (1, seq))
    return {"input_ids": ids.astype(np.int64)}


@pytest.fixture(scope="module")
def resnet() -> onnx.ModelProto:
    return zoo.resnet18()


@pytest.fixture(scope="module")
def mobilenet() -> onnx.ModelProto:
    return zoo.mobilenet_v2()


@pytest.fixture(scope="module")
def bert() -> onnx.ModelProto:
    return zoo.bert_tiny(pooled=True)


def test_every_model_passes_the_full_checker(
    resnet: onnx.ModelProto, mobilenet: onnx.ModelProto, bert: onnx.ModelProto
) -> None:
    for model in (resnet, mobilenet, bert):
        onnx.checker.check_model(model, full_check=True)
        assert model.opset_import[0].version == zoo.OPSET == 17


def test_resnet18_has_the_torchvision_layers(resnet: onnx.ModelProto) -> None:
    assert op_counts(resnet) == {
        "Conv": 20,
        "BatchNormalization": 20,
        "Relu": 17,
        "MaxPool": 1,
        "Add": 8,
        "GlobalAveragePool": 1,
        "Flatten": 1,
        "Gemm": 1,
    }
    w = weights(resnet)
    assert w["conv1.weight"].shape == (64, 3, 7, 7)
    assert w["layer2.0.conv1.weight"].shape == (128, 64, 3, 3)
    assert w["layer4.0.downsample.0.weight"].shape == (512, 256, 1, 1)
    assert w["layer4.1.conv2.weight"].shape == (512, 512, 3, 3)
    assert w["fc.weight"].shape == (1000, 512)
    assert all(v.min() > 0 for k, v in w.items() if k.endswith(".running_var"))
    convs = [n for n in resnet.graph.node if n.op_type == "Conv"]
    assert all(len(n.input) == 2 for n in convs)  # no bias: BatchNorm follows every conv
    gemm = next(n for n in resnet.graph.node if n.op_type == "Gemm")
    assert {a.name: a.i for a in gemm.attribute}["transB"] == 1
    assert zoo.parameter_count(resnet, BN_STATS) == 11_689_512
    assert zoo.parameter_count(resnet) == 11_689_512 + 2 * 4800  # 4800 BatchNorm channels


def test_mobilenet_v2_has_the_torchvision_layers(mobilenet: onnx.ModelProto) -> None:
    counts = op_counts(mobilenet)
    assert counts["Conv"] == 52
    assert counts["BatchNormalization"] == 52
    assert counts["Clip"] == 35  # stem, 16 expansions, 17 depthwise, final 1x1
    assert counts["Add"] == 10
    assert counts["Gemm"] == 1 and counts["GlobalAveragePool"] == 1
    w = weights(mobilenet)
    depthwise = []
    for node in mobilenet.graph.node:
        if node.op_type == "Conv":
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            shape = w[node.input[1]].shape
            if group > 1:
                assert shape[1] == 1 and shape[0] == group and shape[2:] == (3, 3), node.name
                depthwise.append(group)
    # the hidden width (input channels x expansion) of each of the 17 inverted residual blocks
    hidden = [32, 96, 144, 144, 192, 192, 192, 384, 384, 384, 384, 576, 576, 576, 960, 960, 960]
    assert depthwise == hidden
    clips = [n for n in mobilenet.graph.node if n.op_type == "Clip"]
    assert {(float(w[n.input[1]]), float(w[n.input[2]])) for n in clips} == {(0.0, 6.0)}
    assert w["features.18.0.weight"].shape == (1280, 320, 1, 1)
    assert w["fc.weight"].shape == (1000, 1280)
    assert zoo.parameter_count(mobilenet, BN_STATS) == 3_504_872


def test_bert_tiny_has_the_hf_layers(bert: onnx.ModelProto) -> None:
    counts = op_counts(bert)
    assert counts["Softmax"] == 2
    assert counts["LayerNormalization"] == 5
    assert counts["Erf"] == 2
    assert counts["MatMul"] == 2 * (6 + 2)  # Q, K, V, out, FFN in/out + 2 attention products
    assert counts["Gather"] == 4  # word, token type, position, pooler's first token
    assert counts["Reshape"] == counts["Transpose"] == 8
    w = weights(bert)
    assert w["embeddings.word_embeddings.weight"].shape == (30522, 128)
    assert w["encoder.layer.1.intermediate.dense.weight"].shape == (128, 512)
    assert zoo.parameter_count(bert) == 4_385_920
    no_pooler = zoo.parameter_count(zoo.bert_tiny(seq=8))
    assert no_pooler == 4_385_920 - (128 * 128 + 128)
    assert [o.name for o in bert.graph.output] == ["last_hidden_state", "pooler_output"]


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_cnns_agree_with_the_reference_evaluator(name: str) -> None:
    model = zoo.build(name, image=64, batch=2, seed=3)
    feeds = image_feed(2, 64)
    (got,) = OrtPeer(model, feeds).run()
    (want,) = run_reference(model, feeds)
    assert got.shape == (2, 1000)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_bert_tiny_agrees_with_the_reference_evaluator(bert: onnx.ModelProto) -> None:
    feeds = ids_feed(128)
    got = OrtPeer(bert, feeds).run()
    want = run_reference(bert, feeds)
    assert [g.shape for g in got] == [(1, 128, 128), (1, 128)]
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())


def _layer_norm(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-12) * w[f"{name}.weight"] + w[f"{name}.bias"]


def _dense(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    return x @ w[f"{name}.weight"] + w[f"{name}.bias"]


def bert_numpy(ids: np.ndarray, w: dict[str, np.ndarray], heads: int = 2) -> np.ndarray:
    """BERT's encoder written from the paper's equations, in float64, from the model's weights."""
    seq = ids.shape[1]
    e = "embeddings"
    x = w[f"{e}.word_embeddings.weight"][ids[0]] + w[f"{e}.position_embeddings.weight"][:seq]
    x = _layer_norm(x + w[f"{e}.token_type_embeddings.weight"][0], w, f"{e}.LayerNorm")
    hidden = x.shape[-1]
    dh = hidden // heads
    for i in range(2):
        p = f"encoder.layer.{i}"
        a = f"{p}.attention"
        q, k, v = (
            _dense(x, w, f"{a}.self.{n}").reshape(seq, heads, dh).transpose(1, 0, 2)
            for n in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(seq, hidden)
        x = _layer_norm(_dense(ctx, w, f"{a}.output.dense") + x, w, f"{a}.output.LayerNorm")
        h = _dense(x, w, f"{p}.intermediate.dense")
        h = np.array([0.5 * t * (1 + math.erf(t / math.sqrt(2))) for t in h.ravel()])
        h = h.reshape(seq, -1)
        x = _layer_norm(_dense(h, w, f"{p}.output.dense") + x, w, f"{p}.output.LayerNorm")
    return x[None]


def test_bert_tiny_computes_bert() -> None:
    model = zoo.bert_tiny(seq=16, seed=5)
    feeds = ids_feed(16, seed=2)
    w = {k: v.astype(np.float64) for k, v in weights(model).items()}
    (got,) = OrtPeer(model, feeds).run()
    np.testing.assert_allclose(got, bert_numpy(feeds["input_ids"], w), rtol=1e-4, atol=1e-4)


def test_bert_attention_mixes_positions() -> None:
    model = zoo.bert_tiny(seq=16)
    feeds = ids_feed(16)
    (before,) = OrtPeer(model, feeds).run()
    feeds["input_ids"][0, 3] = (feeds["input_ids"][0, 3] + 1) % zoo.BERT_VOCAB
    (after,) = OrtPeer(model, feeds).run()
    changed = np.abs(after - before).max(axis=-1)[0] > 1e-6
    assert changed.all()  # every position attends to the changed token


def test_activations_stay_order_one_at_full_size(
    resnet: onnx.ModelProto, mobilenet: onnx.ModelProto, bert: onnx.ModelProto
) -> None:
    for model, feeds in (
        (resnet, image_feed(1, 224)),
        (mobilenet, image_feed(1, 224)),
        (bert, ids_feed(128)),
    ):
        for out in OrtPeer(model, feeds).run():
            assert np.isfinite(out).all()
            assert 1e-2 < float(out.std()) < 1e2, (model.graph.name, out.std())


def test_weights_are_deterministic_per_seed_and_differ_across_seeds() -> None:
    for name, kw in (
        ("resnet18", {"image": 32}),
        ("mobilenet_v2", {"image": 32}),
        ("bert_tiny", {}),
    ):
        a, b = zoo.build(name, seed=7, **kw), zoo.build(name, seed=7, **kw)
        assert a.SerializeToString() == b.SerializeToString(), name
        c = zoo.build(name, seed=8, **kw)
        assert [n.op_type for n in c.graph.node] == [n.op_type for n in a.graph.node]
        wa, wc = weights(a), weights(c)
        trained = [k for k in wa if not k.startswith("const_")]
        assert all(not np.array_equal(wa[k], wc[k]) for k in trained), name


def test_sizes_follow_the_arguments() -> None:
    model = zoo.resnet18(batch=3, image=96)
    (out,) = OrtPeer(model, image_feed(3, 96)).run()
    assert out.shape == (3, 1000)
    bert = zoo.bert_tiny(seq=40)
    (hidden,) = OrtPeer(bert, ids_feed(40)).run()
    assert hidden.shape == (1, 40, 128)


def test_export_writes_a_loadable_model(tmp_path: Path) -> None:
    path = zoo.export("mobilenet_v2", tmp_path / "m.onnx", image=32, seed=4)
    loaded = onnx.load(str(path))
    onnx.checker.check_model(loaded, full_check=True)
    assert loaded.SerializeToString() == zoo.mobilenet_v2(image=32, seed=4).SerializeToString()


@pytest.mark.parametrize(
    ("name", "kw", "message"),
    [
        ("vgg16", {}, "unknown model 'vgg16'; known: resnet18, mobilenet_v2, bert_tiny"),
        ("bert_tiny", {"image": 64}, "takes no argument image"),
        ("resnet18", {"image": 16}, "image must be >= 32"),
        ("resnet18", {"batch": 0}, "batch must be a positive int, got 0"),
        ("mobilenet_v2", {"seed": -1}, "seed must be a non-negative int, got -1"),
        ("bert_tiny", {"seq": 513}, "seq must be <= 512, got 513"),
        ("bert_tiny", {"hidden": 130, "heads": 4}, "hidden 130 is not divisible by heads 4"),
    ],
)
def test_bad_arguments_are_named(name: str, kw: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        zoo.build(name, **kw)

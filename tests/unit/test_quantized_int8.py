"""The quantised ResNet-18's integer pieces against direct definitions, the network against its
float model, and the accelerator programs' rewrites (signed epilogue, baked weights) by structure.
(The programs against the simulator: tests/integration/test_quantized_accel.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen.vta import GemmTiling, gemm_program
from compiler.quantized import int8_ops as q
from compiler.quantized.accel import (
    LOWERING,
    bake,
    entry_symbol,
    network_artifact,
    signed_epilogue,
)
from compiler.quantized.resnet import (
    INPUT_FRAC,
    Int8ResNet,
    QConv,
    calibration_image,
    forward,
    int8_resnet18,
    reference,
    reference_conv,
)
from protos.vta import Alu, AluOp, VtaSpec
from protos.vta_program import decode_programs


@pytest.fixture(scope="module")
def small() -> Int8ResNet:
    return int8_resnet18(image=32, width=16, classes=10, seed=0)


def direct_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """int64 convolution by its definition: x [H, W, C], w [O, KH, KW, C] -> [HO, WO, O]."""
    o, k, _, _ = w.shape
    h, wd, _ = x.shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    xp = np.pad(x.astype(np.int64), ((pad, pad), (pad, pad), (0, 0)))
    out = np.zeros((ho, wo, o), np.int64)
    for i in range(ho):
        for j in range(wo):
            patch = xp[i * stride : i * stride + k, j * stride : j * stride + k, :]
            out[i, j] = np.tensordot(w.astype(np.int64), patch, axes=([1, 2, 3], [0, 1, 2]))
    return out


@pytest.mark.parametrize(("k", "stride"), [(3, 1), (3, 2), (7, 2), (1, 2)])
def test_im2col_gemm_is_the_convolution(k: int, stride: int) -> None:
    rng = np.random.default_rng(k * 10 + stride)
    x = rng.integers(-128, 128, (9, 7, 5), dtype=np.int8)
    w = rng.integers(-128, 128, (6, k, k, 5), dtype=np.int8)
    cols = q.im2col(x, k, stride, k // 2)
    acc = q.gemm_accumulate(cols, w.reshape(6, -1), np.zeros(6, np.int32))
    expected = direct_conv(x, w, stride, k // 2)
    assert acc.reshape(expected.shape).tolist() == expected.tolist()


def test_the_gemm_is_exact_at_the_int8_extremes() -> None:
    # 4608 products of -128 * -128 (ResNet-18's deepest K): 75.5 M, past float32's exact range
    cols = np.full((2, 4608), -128, np.int8)
    w = np.full((3, 4608), -128, np.int8)
    bias = np.array([1, -1, 7], np.int32)
    acc = q.gemm_accumulate(cols, w, bias)
    assert acc.dtype == np.int32
    assert acc.tolist() == [[4608 * 16384 + b for b in (1, -1, 7)]] * 2


def test_requantise_shifts_floor_and_clips() -> None:
    acc = np.array([-5000, -300, -17, -1, 0, 15, 16, 2047, 2048, 100000], np.int32)
    assert q.requantise(acc, 4, relu=True).tolist() == [0, 0, 0, 0, 0, 0, 1, 127, 127, 127]
    # arithmetic shift floors: -17 >> 4 = -2, -1 >> 4 = -1
    assert q.requantise(acc, 4, relu=False).tolist() == [-128, -19, -2, -1, 0, 0, 1, 127, 127,
                                                         127]  # fmt: skip


def test_residual_add_aligns_the_scales() -> None:
    a = np.array([3, -100, 127], np.int8)  # 2 fractional bits
    b = np.array([1, 1, 127], np.int8)  # 0 fractional bits: shifted up by 2 onto a's scale
    out = q.add_requantise(a, 0, b, 2, shift=1)
    assert out.tolist() == [(3 + 4) >> 1, 0, 127]  # (-100 + 4) >> 1 < 0: the ReLU


def test_max_pool_pads_with_int8_min() -> None:
    x = np.full((4, 4, 2), -100, np.int8)
    x[0, 0, 1] = 5
    out = q.max_pool(x)
    assert out.shape == (2, 2, 2)
    assert out[..., 0].tolist() == [[-100, -100], [-100, -100]]  # zero padding would give 0
    assert out[0, 0, 1] == 5 and out[1, 1, 1] == -100


def test_global_avg_pool_rounds_half_up() -> None:
    x = np.array([[[1, -3], [2, -2]], [[2, -2], [2, -2]]], np.int8)  # sums 7 and -9 over 4
    assert q.global_avg_pool(x).tolist() == [[2, -2]]  # 1.75 -> 2, -2.25 -> -2


def test_shift_for_brings_the_percentile_into_int8() -> None:
    values = np.arange(0, 1000, dtype=np.int32)
    s = q.shift_for(values, relu=True, percentile=100)
    assert (999 >> s) <= 127 < (999 >> (s - 1))
    assert q.shift_for(np.array([-5, 3], np.int32), relu=False) == 0


def test_the_network_is_seeded_and_resnet18_shaped(small: Int8ResNet) -> None:
    again = int8_resnet18(image=32, width=16, classes=10, seed=0)
    for a, b in zip(small.convs(), again.convs(), strict=True):
        assert a.name == b.name and a.shift == b.shift
        assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
    other = int8_resnet18(image=32, width=16, classes=10, seed=1)
    assert not np.array_equal(other.stem.weight, small.stem.weight)
    names = [c.name for c in small.convs()]
    assert len(names) == 1 + 16 + 3 + 1  # stem, 8 blocks x 2, 3 downsamples, head
    assert names[0] == "conv1" and names[-1] == "fc"
    full = {c.gemm_shape() for c in int8_resnet18(image=224).convs()}
    assert {(12544, 64, 147), (3136, 64, 576), (784, 128, 64), (49, 512, 4608)} <= full
    assert (1, 1000, 512) in full
    # int8 weights and int32 biases; ReLU after every first conv, none before a residual add
    for block in small.blocks:
        assert block.conv1.relu and not block.conv2.relu
        assert block.downsample is None or not block.downsample.relu
    assert all(c.weight.dtype == np.int8 and c.bias.dtype == np.int32 for c in small.convs())


def float_forward(net: Int8ResNet, image: np.ndarray) -> np.ndarray:
    """The float network the int8 one quantises: the same (dequantised) weights, no rounding."""

    def conv(layer: QConv, x: np.ndarray) -> np.ndarray:
        w = layer.weight * 2.0**-layer.w_frac
        b = layer.bias * 2.0 ** -(layer.in_frac + layer.w_frac)
        y = q.im2col(x, layer.kernel, layer.stride, layer.pad) @ w.T + b
        return (np.maximum(y, 0) if layer.relu else y).reshape(*layer.out_hw, layer.cout)

    x = conv(net.stem, image)
    pad = np.pad(x, ((1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    x = np.max([pad[i : i + x.shape[0] : 2, j : j + x.shape[1] : 2] for i in range(3)
                for j in range(3)], axis=0)  # fmt: skip
    for block in net.blocks:
        y = conv(block.conv2, conv(block.conv1, x))
        x = np.maximum(y + (x if block.downsample is None else conv(block.downsample, x)), 0)
    return conv(net.fc, x.mean(axis=(0, 1)).reshape(1, 1, -1)).reshape(-1)


def test_the_int8_network_tracks_its_float_model(small: Int8ResNet) -> None:
    image = calibration_image(32, seed=7)  # not the calibration image
    logits = reference(small, image) * 2.0**-small.fc.out_frac
    real = float_forward(small, image * 2.0**-INPUT_FRAC)
    cosine = float(logits @ real / np.linalg.norm(logits) / np.linalg.norm(real))
    assert cosine > 0.99
    assert np.argmax(logits) == np.argmax(real)


def test_forward_runs_every_conv_through_the_given_function(small: Int8ResNet) -> None:
    seen = []

    def conv(layer: QConv, x: np.ndarray) -> np.ndarray:
        seen.append(layer.name)
        return reference_conv(layer, x)

    image = calibration_image(32, seed=2)
    assert np.array_equal(forward(small, image, conv), reference(small, image))
    assert seen == [c.name for c in small.convs()]
    with pytest.raises(ValueError, match="takes int8"):
        forward(small, image.astype(np.int16))


def test_signed_epilogue_swaps_relu_for_a_clip_at_minus_128() -> None:
    program = gemm_program(40, 32, 48, GemmTiling(16, 1, 2, 2), 5, VtaSpec())
    signed = signed_epilogue(program, 5)
    assert len(signed.insns) == len(program.insns)
    changed = [(a, b) for a, b in zip(program.insns, signed.insns, strict=True) if a != b]
    assert changed and len(changed) % 2 == 0
    for before, after in changed:
        assert isinstance(before, Alu) and isinstance(after, Alu) and before.deps == after.deps
    ops = [(b.op, b.imm, a.op, a.imm) for b, a in changed]  # type: ignore[union-attr]
    assert set(ops) == {(AluOp.MAX, 0, AluOp.SHR, 5), (AluOp.SHR, 5, AluOp.MAX, -128)}
    with pytest.raises(ValueError, match="no ReLU"):
        signed_epilogue(signed, 5)


def test_bake_moves_weights_into_constants() -> None:
    program = gemm_program(8, 20, 24, GemmTiling(8, 2, 2), 3, VtaSpec())
    w = np.arange(20 * 24, dtype=np.int64).astype(np.int8).reshape(20, 24)
    bias = np.arange(20, dtype=np.int32)
    baked = bake(program, {"w": w, "bias": bias})
    assert [a.name for a in baked.args] == ["x", "y"]
    w_layout = next(a for a in program.args if a.name == "w")
    (offset, blob), (_, b_blob) = baked.constants[-2:]
    assert offset == w_layout.offset and len(blob) == w_layout.nbytes()
    assert np.frombuffer(b_blob, "<i4")[:20].tolist() == list(range(20))
    # the weights' DRAM layout is blocked [nb][kb][16][16]: block (0, 1) starts at column 16
    assert np.frombuffer(blob, np.int8)[256 : 256 + 8].tolist() == w[0, 16:24].tolist()
    with pytest.raises(ValueError, match="no arg"):
        bake(program, {"weights": w})
    with pytest.raises(ValueError, match="int8"):
        bake(program, {"w": w.astype(np.int16)})


def test_one_artifact_holds_a_program_per_layer(small: Int8ResNet) -> None:
    configs = {c.name: {"tile_m": 16, "tile_n": 1, "tile_k": 1, "vthreads": 2}
               for c in small.convs()}  # fmt: skip
    art = network_artifact(small, configs)
    programs = decode_programs(art.data)
    assert list(programs) == [entry_symbol(c) for c in small.convs()]
    assert art.target == "vta" and art.format == "accel_program"
    for layer, entry in zip(small.convs(), art.entries, strict=True):
        m, n, k = LOWERING.workload(layer)
        assert [(a.name, a.shape, a.role) for a in entry.args] == [
            ("x", (m, k), "input"), ("y", (m, n), "output")
        ]  # fmt: skip
        assert entry.flop == 2.0 * m * n * k
    with pytest.raises(KeyError):
        network_artifact(small, {})

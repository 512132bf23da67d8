"""Every op template vs its numpy reference: built with gcc (several configs per shape, odd sizes
included) and, on tiny shapes, run through the loop-IR interpreter."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from compiler import ops, toolchain
from compiler.codegen.c import render_c
from compiler.codegen.timing import render_timing
from compiler.ir import interpreter
from compiler.lower import lower
from compiler.ops import layout
from compiler.ops.base import (
    MAX_ACCUMULATORS,
    NO_PARALLEL,
    PARALLEL_KNOB,
    OpTemplate,
    RegisterFile,
    output_arrays,
    register_file,
    threaded_space,
)
from compiler.ops.dense import block_tiles
from compiler.ops.space import Config
from compiler.te.tensor import ComputeOp

pytestmark = pytest.mark.usefixtures("build_cache")

# (template, shapes built with gcc, a tiny shape for the interpreter)
CASES: dict[str, tuple[list[tuple[int, ...]], tuple[int, ...]]] = {
    "vta_dense": ([(64, 48, 80), (33, 17, 19), (1, 16, 16)], (5, 7, 20)),  # its host reference
    "vta_conv2d": ([(20, 7, 9, 24, 3, 2, 1), (16, 5, 5, 16, 1, 1, 0)], (3, 4, 4, 5, 3, 1, 1)),
    "dense": ([(64, 96, 80), (7, 33, 19), (1, 16, 300), (16, 32, 256)], (3, 20, 5)),
    "conv2d_nchwc": (
        [
            (1, 32, 9, 9, 32, 3, 3, 1, 1, 0),
            (1, 16, 7, 11, 48, 3, 3, 2, 1, 2),
            (2, 3, 6, 5, 5, 3, 3, 1, 0, 1),
            (1, 16, 6, 6, 16, 3, 3, 1, 1, 3),  # ReLU6: sums of 144 products pass 6
        ],
        (1, 2, 4, 3, 2, 3, 3, 1, 1, 2),
    ),
    "conv2d_1x1_nchwc": (
        [
            (1, 32, 9, 9, 64, 1, 1, 2, 0, 0),
            (1, 16, 5, 7, 16, 1, 1, 1, 0, 1),
            (1, 64, 4, 4, 32, 1, 1, 1, 0, 3),
        ],
        (1, 4, 3, 3, 2, 1, 1, 2, 0, 0),
    ),
    "grouped_conv2d_1x1_nchwc": (
        [
            (1, 24, 7, 9, 60, 1, 1, 1, 0, 2, 3),  # ShuffleNet's 8 -> 20 channels per group
            (1, 32, 5, 5, 64, 1, 1, 1, 0, 0, 2),
            (2, 48, 4, 3, 96, 1, 1, 1, 0, 3, 4),
        ],
        (1, 4, 3, 3, 6, 1, 1, 1, 0, 1, 2),
    ),
    "conv2d_stem_nchwc": (
        [(1, 3, 21, 19, 32, 7, 7, 2, 3, 2), (1, 3, 10, 10, 16, 3, 3, 1, 1, 0)],
        (1, 3, 5, 5, 2, 3, 3, 2, 1, 1),
    ),
    "conv2d_winograd_nchwc": (
        [
            (1, 32, 8, 8, 32, 3, 3, 1, 1, 2),
            (1, 16, 7, 9, 48, 3, 3, 1, 1, 1),  # tiles past the image's edge
            (2, 16, 6, 5, 16, 3, 3, 1, 0, 3),
        ],
        (1, 2, 5, 3, 2, 3, 3, 1, 1, 2),
    ),
    "depthwise_conv2d_nchwc": (
        [
            (1, 32, 9, 9, 3, 3, 1, 1, 0),
            (2, 16, 8, 7, 3, 3, 2, 1, 3),  # ReLU6: MobileNetV2's bias and clip
            (1, 5, 6, 6, 5, 5, 1, 2, 1),
            (1, 16, 7, 7, 3, 3, 1, 1, 2),
        ],
        (1, 2, 4, 4, 3, 3, 1, 1, 3),
    ),
    "max_pool2d_nchwc": ([(1, 32, 11, 11, 3, 2, 1), (1, 5, 6, 7, 2, 2, 0)], (1, 2, 4, 4, 3, 2, 1)),
    "avg_pool2d_nchwc": ([(1, 16, 9, 8, 3, 1, 1), (2, 3, 5, 5, 2, 1, 0)], (1, 2, 4, 4, 2, 2, 1)),
    "global_avg_pool2d_nchwc": ([(1, 32, 7, 7), (2, 5, 3, 4)], (1, 2, 2, 3)),
    "reduce_sum": ([(37, 65, 0), (37, 65, 1), (8, 128, 1)], (3, 5, 1)),
    "softmax": ([(4, 100), (3, 128), (1, 7)], (2, 5)),
    "layer_norm": ([(4, 100), (3, 128), (2, 7)], (2, 5)),
    "add": ([(5, 67), (16, 128)], (2, 5)),
    "multiply": ([(3, 33)], (2, 3)),
    "relu": ([(4, 100)], (2, 3)),
    "add_relu": ([(9, 96), (1, 7)], (2, 5)),
}
AVX512 = "x86_64-avx512"  # register-budget tests name their target: any host gives the same answer
CONFIGS_PER_SHAPE = 2


def template(name: str) -> OpTemplate:
    t = ops.get_template(name)
    assert isinstance(t, OpTemplate)
    return t


def pick_configs(t: OpTemplate, shape: tuple[int, ...], count: int, seed: int) -> list[Config]:
    """The first and last config and random others: the extremes of every knob get built."""
    space = t.config_space(shape)
    rng = np.random.default_rng(seed)
    picks = {0, len(space) - 1, *(int(i) for i in rng.integers(0, len(space), count))}
    return [space.get(i) for i in sorted(picks)][: count + 2]


def run_built(
    t: OpTemplate, cases: Sequence[tuple[tuple[int, ...], Config]], seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Build every (shape, config) into one shared object, run each once; (ours, reference) pairs."""
    funcs, symbols, arg_lists = [], [], []
    for n, (shape, config) in enumerate(cases):
        sch, args = t.instantiate(shape, config)
        symbol = f"op{n}"
        funcs.append((lower(sch, args, symbol), symbol))
        symbols.append(symbol)
        arg_lists.append(args)
    source = render_c(funcs, extra=[render_timing(symbols)])
    lib = ctypes.CDLL(str(toolchain.compile_shared(source).path))
    results = []
    rng = np.random.default_rng(seed)
    for (shape, config), symbol, args in zip(cases, symbols, arg_lists, strict=True):
        logical = t.random_inputs(shape, rng)
        arrays = [*t.pack_inputs(shape, config, logical), *output_arrays(args)]
        for array, tensor in zip(arrays, args, strict=True):
            assert array.size == int(np.prod(tensor.shape)), f"{tensor.name} of {shape} {config}"
        fn = lib[symbol]
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = ctypes.c_int32
        pointers = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
        assert fn(pointers) == 0
        ours = t.unpack_output(shape, config, arrays[-1].reshape(args[-1].shape))
        results.append((ours, t.reference_for(shape, *logical)))
    return results


def check_close(ours: np.ndarray, ref: np.ndarray, what: str, reduction: int) -> None:
    assert ours.shape == ref.shape, what
    atol = 2e-5 * max(1.0, float(np.sqrt(reduction)))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=atol, err_msg=what)


def reduction_length(t: OpTemplate, shape: tuple[int, ...], out_size: int) -> int:
    return max(1, round(t.flop(shape) / max(out_size, 1)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_built_kernels_match_numpy(name: str) -> None:
    t = template(name)
    shapes, _ = CASES[name]
    cases = [
        (shape, config)
        for s, shape in enumerate(shapes)
        for config in pick_configs(t, shape, CONFIGS_PER_SHAPE, seed=s)
    ]
    assert len(cases) >= 3
    for (shape, config), (ours, ref) in zip(cases, run_built(t, cases), strict=True):
        check_close(
            ours, ref, f"{name} {shape} {dict(config)}", reduction_length(t, shape, ref.size)
        )


@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreted_kernels_match_numpy(name: str) -> None:
    t = template(name)
    shape = CASES[name][1]
    space = t.config_space(shape)
    rng = np.random.default_rng(1)
    for index in sorted({0, len(space) - 1}):
        config = space.get(index)
        sch, args = t.instantiate(shape, config)
        func = lower(sch, args, "op")
        logical = t.random_inputs(shape, rng)
        arrays = [*t.pack_inputs(shape, config, logical), *output_arrays(args)]
        interpreter.run(func, *[a.reshape(t_.shape) for a, t_ in zip(arrays, args, strict=True)])
        ours = t.unpack_output(shape, config, arrays[-1].reshape(args[-1].shape))
        ref = t.reference_for(shape, *logical)
        check_close(
            ours, ref, f"{name} {shape} {dict(config)}", reduction_length(t, shape, ref.size)
        )


def test_every_library_template_is_covered() -> None:
    # GPU templates render CUDA, not C: tests/integration/test_cuda_templates_*.py and
    # test_cuda_tensorcore.py check them in the interpreter and with nvcc.
    cpu = {name for name in ops.op_templates() if not name.startswith("cuda_")}
    assert cpu == set(CASES)


def test_registry_keeps_matmul_and_names_the_known_templates() -> None:
    assert ops.get_template("matmul").name == "matmul"
    with pytest.raises(KeyError, match="known: add, add_relu"):
        ops.get_template("conv9d")


@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        ("dense", (4, 4), r"\(M, N, K\) of positive ints"),
        ("dense", (4, 0, 4), "positive ints"),
        ("conv2d_nchwc", (1, 3, 4, 4, 8, 3, 3, 1, -1, 0), "pad, epilogue may be 0"),
        ("conv2d_nchwc", (1, 3, 4, 4, 8, 3, 3, 1, 0, 4), "epilogue must be one of"),
        ("conv2d_nchwc", (1, 3, 2, 2, 8, 5, 5, 1, 1, 0), "does not fit"),
        ("conv2d_1x1_nchwc", (1, 3, 4, 4, 8, 3, 3, 1, 1, 0), "kernel must be 1x1"),
        ("conv2d_winograd_nchwc", (1, 3, 9, 9, 8, 3, 3, 2, 1, 0), "3x3 kernel of stride 1"),
        ("grouped_conv2d_1x1_nchwc", (1, 6, 4, 4, 8, 1, 1, 1, 0, 0, 3), "divide IC=6 and OC=8"),
        ("grouped_conv2d_1x1_nchwc", (1, 6, 4, 4, 6, 1, 1, 1, 0, 0, 1), "must be >= 2"),
        ("grouped_conv2d_1x1_nchwc", (1, 6, 4, 4, 6, 1, 1, 2, 0, 0, 3), "1x1 kernels at stride 1"),
        ("grouped_conv2d_1x1_nchwc", (1, 6, 4, 4, 6, 1, 1, 1, 0, 0), "workload must be"),
        ("conv2d_winograd_nchwc", (1, 3, 9, 9, 8, 5, 5, 1, 2, 0), "3x3 kernel of stride 1"),
        ("max_pool2d_nchwc", (1, 3, 4, 4, 2, 1, 2), "pad 2 must be smaller"),
        ("reduce_sum", (3, 4, 2), "axis must be 0 or 1"),
    ],
)
def test_bad_workloads_name_their_cause(name: str, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ops.get_template(name).config_space(shape)


def test_configs_round_trip_through_their_index() -> None:
    for name, (shapes, _) in CASES.items():
        space = template(name).config_space(shapes[0])
        for index in {0, len(space) // 2, len(space) - 1}:
            config: Any = space.get(index)
            assert space.index_of(config) == index == config.index


def test_layout_packings_round_trip_and_match_their_tensor_expressions() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 3, 5)).astype(np.float32)
    packed = layout.pack_nchwc(x, 3)
    assert packed.shape == (2, 2, 3, 5, 3)
    assert packed[1, 1, 2, 4, 2] == x[1, 5, 2, 4]
    np.testing.assert_array_equal(layout.unpack_nchwc(packed), x)

    from compiler import te
    from compiler.schedule import create_schedule

    src = te.placeholder(x.shape, name="src")
    pk = layout.compute_pack_nchwc(src, 3)
    got = np.zeros(pk.shape, np.float32)
    interpreter.run(lower(create_schedule(pk), [src, pk], "pack"), x, got)
    np.testing.assert_array_equal(got, packed)
    blocked = te.placeholder(packed.shape, name="blocked")
    up = layout.compute_unpack_nchwc(blocked)
    back = np.zeros(up.shape, np.float32)
    interpreter.run(lower(create_schedule(up), [blocked, up], "unpack"), packed, back)
    np.testing.assert_array_equal(back, x)


def test_weight_packings_put_each_value_where_the_kernels_read_it() -> None:
    rng = np.random.default_rng(8)
    w = rng.standard_normal((8, 6, 3, 2)).astype(np.float32)  # OIHW
    wp = layout.pack_conv_weight(w, ic_block=3, oc_block=4)
    assert wp.shape == (2, 2, 3, 2, 3, 4)
    assert wp[1, 0, 2, 1, 2, 3] == w[1 * 4 + 3, 0 * 3 + 2, 2, 1]
    dw = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    assert layout.pack_depthwise_weight(dw, 3)[1, 2, 0, 1] == dw[4, 0, 2, 0]
    b = rng.standard_normal((5, 7)).astype(np.float32)  # [K][N], N not a multiple of nr
    bp = layout.pack_dense_weight(b, 4)
    assert bp.shape == (2, 5, 4)
    assert bp[1, 3, 2] == b[3, 6] and bp[1, 3, 3] == 0.0  # the padded column is zero
    # k blocks of 2: [K/kc][N/nr][kc][nr], one k block's panels contiguous
    bk = layout.pack_dense_weight(b[:4], 4, kc=2)
    assert bk.shape == (2, 2, 2, 4)
    assert bk[1, 1, 0, 2] == b[2, 6] and bk[0, 1, 1, 1] == b[1, 5] and bk[1, 1, 1, 3] == 0.0
    assert layout.pack_dense_weight(b, 4, kc=5).shape == (2, 5, 4)  # kc = K: no k blocks
    with pytest.raises(ValueError, match="k block 2 does not divide K=5"):
        layout.pack_dense_weight(b, 4, kc=2)
    with pytest.raises(ValueError, match="block 4 does not divide 6"):
        layout.pack_nchwc(x_of((1, 6, 2, 2)), 4)
    padded = layout.pad_spatial(x_of((1, 1, 2, 2)), 1, -np.inf)
    assert padded.shape == (1, 1, 4, 4) and padded[0, 0, 0, 0] == -np.inf


def x_of(shape: tuple[int, ...]) -> np.ndarray:
    return np.ones(shape, np.float32)


def test_register_budget_prunes_spilling_tiles_but_keeps_some() -> None:
    dense = template("dense")
    shape = (512, 512, 512)
    space = dense.config_space(shape)
    kept = [c for c in map(space.get, range(len(space))) if dense.worth_measuring(shape, c, AVX512)]
    assert kept and len(kept) < len(space)
    for c in kept:
        assert c["mr"] * c["nr"] // 16 <= MAX_ACCUMULATORS
    spill = space.index_of(
        {
            "nr": 64,
            "mr": 12,
            "m_tiles": 0,
            "kc": 512,
            "unroll_k": 1,
            "order": "panel",
            "pack_a": False,
        }
    )
    assert not dense.worth_measuring(shape, space.get(spill), AVX512)
    tiny = (1, 16, 2, 2, 16, 1, 1, 1, 0, 0)  # a 2x2 image has no room for 8 accumulators
    conv = template("conv2d_1x1_nchwc")
    tiny_space = conv.config_space(tiny)
    assert any(
        conv.worth_measuring(tiny, tiny_space.get(i), AVX512) for i in range(len(tiny_space))
    )


def test_register_budget_follows_the_target_register_file() -> None:
    """A 6x16 tile is 6 zmm (too few to hide FMA latency) but 12 ymm (the AVX2 sweet spot)."""
    assert register_file(AVX512) == RegisterFile(lanes=16, registers=32)
    assert register_file("x86_64-avx2") == RegisterFile(lanes=8, registers=16)
    assert register_file("aarch64-neon") == RegisterFile(lanes=4, registers=32)
    dense = template("dense")
    shape = (512, 512, 512)
    space = dense.config_space(shape)
    base = {"m_tiles": 0, "kc": 512, "unroll_k": 1, "order": "panel", "pack_a": False}
    six_by_16 = space.get(space.index_of({"nr": 16, "mr": 6, **base}))
    four_by_64 = space.get(space.index_of({"nr": 64, "mr": 4, **base}))
    assert dense.worth_measuring(shape, six_by_16, "x86_64-avx2")
    assert not dense.worth_measuring(shape, six_by_16, AVX512)
    assert dense.worth_measuring(shape, four_by_64, AVX512)
    assert not dense.worth_measuring(shape, four_by_64, "x86_64-avx2")  # 32 ymm: spills
    for c in map(space.get, range(len(space))):
        if dense.worth_measuring(shape, c, "x86_64-avx2"):
            assert 8 <= c["mr"] * -(-c["nr"] // 8) <= 12
    conv = template("conv2d_nchwc")
    wl = (1, 64, 56, 56, 64, 3, 3, 1, 1, 0)
    cspace = conv.config_space(wl)
    for c in map(cspace.get, range(len(cspace))):
        if conv.worth_measuring(wl, c, "x86_64-avx2"):
            vectors = c["reg_n"] * c.get("oh_tile", 1) * -(-c["oc_block"] // 8)
            assert vectors <= 12


@pytest.mark.parametrize("shape", [(24, 48, 256), (9, 40, 256)])
def test_dense_k_blocks_accumulate_into_c(shape: tuple[int, int, int]) -> None:
    dense = template("dense")
    space = dense.config_space(shape)
    knobs = ("nr", "mr", "m_tiles", "kc", "unroll_k", "order", "pack_a")
    blocked = [
        space.get(space.index_of(dict(zip(knobs, values, strict=True))))
        for values in (
            (16, 4, 0, 128, 1, "panel", False),
            (32, 6, 4, 128, 2, "panel", False),
            (16, 5, 0, 128, 8, "row", False),
            (32, 3, 2, 128, 4, "row", False),
            # A packed per block ([row tile][k][mr]); 9 and 24 rows leave partial tiles/blocks
            (16, 4, 0, 128, 1, "panel", True),
            (32, 5, 2, 128, 2, "row", True),
            (16, 6, 4, shape[2], 4, "panel", True),  # no k blocks: packed per row block
            (16, 2, 0, shape[2], 1, "row", True),  # neither: all of A packed up front
        )
    ]
    for config, (ours, ref) in zip(
        blocked, run_built(dense, [(shape, c) for c in blocked]), strict=True
    ):
        check_close(ours, ref, f"dense {shape} {dict(config)}", shape[2])
    small = (2, 16, 256)
    config = dense.config_space(small).get(
        dense.config_space(small).index_of(
            {
                "nr": 16,
                "mr": 2,
                "m_tiles": 0,
                "kc": 128,
                "unroll_k": 2,
                "order": "row",
                "pack_a": False,
            }
        )
    )
    sch, args = dense.instantiate(small, config)
    out_op = sch.outputs[0].op
    assert isinstance(out_op, ComputeOp)
    assert any(t.name == "C_part" for t in out_op.inputs)
    logical = dense.random_inputs(small, np.random.default_rng(3))
    arrays = [*dense.pack_inputs(small, config, logical), *output_arrays(args)]
    interpreter.run(lower(sch, args, "op"), *arrays)
    check_close(
        dense.unpack_output(small, config, arrays[-1]), dense.reference(*logical), "dense", 256
    )


def test_stride_one_1x1_tiles_pixels_across_rows_and_matches_numpy() -> None:
    """At stride 1 the pixel tile runs across row ends (6 pixels of a 5-wide image, with a
    tail tile); at stride 2 the tile is still reg_n pixels of oh_tile rows."""
    conv = template("conv2d_1x1_nchwc")
    flat = (1, 32, 5, 7, 16, 1, 1, 1, 0, 3)  # 35 pixels: tiles of 6 leave a tail of 5
    space = conv.config_space(flat)
    assert "oh_tile" not in space.get(0)
    assert {6, 7, 16} <= set(space.knobs[2].choices)
    _, args = conv.instantiate(flat, space.get(0))
    assert list(args[0].shape) == [1, 2, 35, 16]  # one axis of pixels
    picks = [
        space.get(space.index_of({"ic_block": icb, "oc_block": 16, "reg_n": n, "oc_order": o}))
        for icb, n, o in ((16, 6, "outer"), (32, 16, "inner"), (16, 35 // 5, "inner"))
    ]
    for config, (ours, ref) in zip(picks, run_built(conv, [(flat, c) for c in picks]), strict=True):
        check_close(ours, ref, f"1x1 {flat} {dict(config)}", 32)
    strided = (1, 32, 9, 9, 64, 1, 1, 2, 0, 0)
    assert "oh_tile" in conv.config_space(strided).get(0)


def test_direct_conv_flat_pixel_tiles_cross_row_ends_and_match_numpy() -> None:
    """The 3x3 conv's "flat" tiling: reg_n consecutive output pixels of the image as one axis,
    each finding its strided input window by p // OW, p % OW. A 5-wide output with 6-pixel
    tiles crosses every row end, and 35 pixels leave a tail of 5; stride 2 and stride 1."""
    conv = template("conv2d_nchwc")
    cases = (
        ((1, 32, 10, 14, 32, 3, 3, 2, 1, 2), 6),  # stride 2: out 5x7 = 35 pixels
        ((1, 16, 5, 7, 16, 3, 3, 1, 1, 1), 4),  # stride 1: out 5x7
    )
    for wl, reg_n in cases:
        space = conv.config_space(wl)
        flat = {"ic_block": 16, "oc_block": 16, "reg_n": reg_n, "oh_tile": 1, "pixels": "flat"}
        picks = [
            space.get(space.index_of({**flat, "unroll_kw": kw, "oc_order": order}))
            for kw, order in ((False, "outer"), (True, "inner"))
        ]
        _, args = conv.instantiate(wl, picks[0])
        assert list(args[-1].shape) == [1, wl[4] // 16, 35, 16]  # one axis of output pixels
        assert all(conv.worth_measuring(wl, c, "x86_64-avx2") for c in picks)
        for config, (ours, ref) in zip(
            picks, run_built(conv, [(wl, c) for c in picks]), strict=True
        ):
            check_close(ours, ref, f"flat conv {wl} {dict(config)}", wl[1] * 9)
    # one flat config per tile: row counts are not knobs of it, and row tiles keep row sizes
    wl = cases[0][0]
    space = conv.config_space(wl)
    base = {"ic_block": 16, "oc_block": 16, "unroll_kw": False, "oc_order": "outer"}
    rows2 = space.get(space.index_of({**base, "reg_n": 6, "oh_tile": 2, "pixels": "flat"}))
    assert not conv.worth_measuring(wl, rows2, "x86_64-avx2")
    odd_row = space.get(space.index_of({**base, "reg_n": 6, "oh_tile": 1, "pixels": "rows"}))
    assert not conv.worth_measuring(wl, odd_row, "x86_64-avx2")  # 6 is no row tile of 7
    # the stem (3 channels, 7x7/2) takes flat tiles too: 8x7 = 56 output pixels, tail of 2
    stem = template("conv2d_stem_nchwc")
    wl = (1, 3, 16, 14, 16, 7, 7, 2, 3, 2)
    space = stem.config_space(wl)
    knobs = {"ic_block": 3, "oc_block": 16, "reg_n": 6, "oc_order": "outer", "pixels": "flat"}
    picks = [space.get(space.index_of({**knobs, "unroll_kw": kw})) for kw in (True, False)]
    _, args = stem.instantiate(wl, picks[0])
    assert list(args[-1].shape) == [1, 1, 56, 16]
    for config, (ours, ref) in zip(picks, run_built(stem, [(wl, c) for c in picks]), strict=True):
        check_close(ours, ref, f"flat stem {wl} {dict(config)}", 3 * 49)


def test_flat_1x1_register_budget_counts_the_weight_vectors() -> None:
    """On AVX2 (16 ymm) a 6-pixel tile of two vectors fits (12 + 2 weights + 1 broadcast), a
    7-pixel one does not, nor 4 pixels of four vectors; the untuned default (the first config
    that fits) is the largest tile."""
    conv = template("conv2d_1x1_nchwc")
    wl = (1, 576, 14, 14, 96, 1, 1, 1, 0, 1)
    space = conv.config_space(wl)

    def fits(n: int, ocb: int) -> bool:
        c = space.get(
            space.index_of({"ic_block": 64, "oc_block": ocb, "reg_n": n, "oc_order": "outer"})
        )
        return conv.worth_measuring(wl, c, "x86_64-avx2")

    assert fits(6, 16) and not fits(7, 16)
    assert fits(4, 32) is False and fits(2, 32)
    first = next(
        c
        for c in map(space.get, range(len(space)))
        if c["oc_block"] == 16 and conv.worth_measuring(wl, c, "x86_64-avx2")
    )
    assert first["reg_n"] == 6


def test_depthwise_pads_its_input_itself_per_block_or_per_row() -> None:
    """The data argument is the unpadded input; both places the padded input is built (a
    block's plane, an output row's input rows) give numpy's result, strided and 5x5 too."""
    dw = template("depthwise_conv2d_nchwc")
    cases = []
    for shape in (
        (1, 32, 9, 7, 3, 3, 1, 1, 3),
        (1, 16, 8, 9, 3, 3, 2, 1, 1),
        (1, 16, 6, 6, 5, 5, 1, 2, 0),
    ):
        _, args = dw.instantiate(shape, dw.config_space(shape).get(0))
        n, c, h, w = shape[:4]
        assert list(args[0].shape) == [n, c // 16, h, w, 16]  # not padded
        space = dw.config_space(shape)
        for at in ("block", "row"):
            knobs = {"c_block": 16, "reg_n": 4, "unroll_kw": True, "pad_at": at}
            cases.append((shape, space.get(space.index_of(knobs))))
    for (shape, config), (ours, ref) in zip(cases, run_built(dw, cases), strict=True):
        check_close(ours, ref, f"depthwise {shape} {dict(config)}", shape[4] * shape[5])


# -- threads ------------------------------------------------------------------------------------
PARALLEL_TEMPLATES = sorted(n for n in CASES if template(n).parallel_choices(CASES[n][0][0]))


def _libgomp() -> ctypes.CDLL:
    gomp = ctypes.CDLL("libgomp.so.1")  # the runtime the kernels link (-fopenmp)
    gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
    gomp.omp_get_max_threads.restype = ctypes.c_int
    return gomp


def test_one_thread_space_is_the_space_without_a_parallel_knob() -> None:
    for name in PARALLEL_TEMPLATES:
        t, shape = template(name), CASES[name][0][0]
        one, two = threaded_space(t, shape, 1), threaded_space(t, shape, 2)
        assert one.knobs == t.config_space(shape).knobs  # same indices: old records keep meaning
        assert two.knobs[:-1] == one.knobs and two.knobs[-1].name == PARALLEL_KNOB
        assert two.knobs[-1].choices[0] == NO_PARALLEL and len(two.knobs[-1].choices) >= 2
    assert threaded_space(template("add"), (5, 67), 8).knobs == (
        template("add").config_space((5, 67)).knobs
    )
    with pytest.raises(ValueError, match="at least one thread"):
        threaded_space(template("dense"), (4, 4, 4), 0)


@pytest.mark.parametrize("name", PARALLEL_TEMPLATES)
def test_parallel_kernels_match_numpy_at_1_2_3_threads(name: str) -> None:
    """Every parallel choice, on odd shapes, run on 1, 2 and 3 OpenMP threads (more threads
    than cores included): the same answers as numpy."""
    t = template(name)
    rng = np.random.default_rng(5)
    cases = []
    for shape in CASES[name][0][:3]:
        space = threaded_space(t, shape, 2)
        for choice in space.knobs[-1].choices[1:]:
            picked = [space.get(int(i)) for i in rng.integers(0, len(space), 200)]
            fitting = [c for c in picked if c[PARALLEL_KNOB] == choice]
            plausible = [c for c in fitting if t.worth_measuring(shape, c)] or fitting
            cases += [(shape, c) for c in plausible[:1]]
    assert cases
    gomp = _libgomp()
    before = gomp.omp_get_max_threads()
    try:
        for threads in (1, 2, 3):
            gomp.omp_set_num_threads(threads)
            for (shape, config), (ours, ref) in zip(cases, run_built(t, cases), strict=True):
                what = f"{name} {shape} {dict(config)} on {threads} threads"
                check_close(ours, ref, what, reduction_length(t, shape, ref.size))
    finally:
        gomp.omp_set_num_threads(before)


def _parallel_loops(stmt: Any, outer: tuple[str, ...] = ()) -> list[tuple[str, tuple[str, ...]]]:
    """(parallel loop's var, the vars of the loops around it) of every parallel loop in `stmt`."""
    from compiler.ir.stmt import For, ForKind

    found: list[tuple[str, tuple[str, ...]]] = []
    if isinstance(stmt, For):
        if stmt.kind is ForKind.PARALLEL:
            found.append((stmt.var.name, outer))
        return found + _parallel_loops(stmt.body, (*outer, stmt.var.name))
    for value in vars(stmt).values() if hasattr(stmt, "__dict__") else ():
        children = value if isinstance(value, list | tuple) else [value]
        for child in children:
            if hasattr(child, "__dict__") and not isinstance(child, type):
                found += _parallel_loops(child, outer)
    return found


def test_dense_parallel_loop_sits_inside_the_k_block_reduction() -> None:
    """With k blocks, C sums partial products over the k-block loop: the parallel loop over
    output tiles runs inside it (each k block one region), never around it."""
    t, shape = template("dense"), (64, 96, 256)
    space = threaded_space(t, shape, 2)
    for parallel in ("outer", "fused"):
        config = space.get(
            space.index_of(
                {
                    "nr": 32,
                    "mr": 4,
                    "m_tiles": 4,
                    "kc": 64,
                    "unroll_k": 1,
                    "order": "panel",
                    "pack_a": False,
                    "parallel": parallel,
                }
            )
        )
        sch, args = t.instantiate(shape, config)
        loops = _parallel_loops(lower(sch, args, "f").body)
        inside = [outer for _, outer in loops if "ko" in outer]
        assert inside, f"{parallel}: no parallel loop inside the k-block loop: {loops}"


def test_dense_row_blocks_divide_the_full_tiles_so_the_micro_kernel_is_emitted_once() -> None:
    """256 rows in tiles of 12: 21 full tiles and one of 4 rows. Blocks of 8 (3 blocks, the last
    short) made the partition emit the register tile's code twice; blocks of the nearest
    divisor (7) leave the 4-row tile alone in the last block."""
    assert block_tiles(256, 12, 8) == 7
    assert block_tiles(256, 5, 16) == 17  # 51 = 3 x 17: the nearest divisor may be larger
    assert block_tiles(256, 6, 2) == 2 and block_tiles(256, 12, 32) == 32  # 32 >= 21: one block
    assert block_tiles(256, 12, 0) == 0
    dense, shape = template("dense"), (256, 64, 64)
    space = dense.config_space(shape)

    def source(m_tiles: int) -> str:
        knobs = {"nr": 32, "mr": 12, "m_tiles": m_tiles, "kc": 64, "unroll_k": 2}
        config = space.get(space.index_of({**knobs, "order": "row", "pack_a": False}))
        sch, args = dense.instantiate(shape, config)
        return render_c([(lower(sch, args, "f"), "f")])

    # one block of every tile and blocks of 8 tiles: the same code but for the block loop
    assert len(source(8)) < 1.1 * len(source(0))
    cases = [
        (shape, space.get(space.index_of({"nr": 32, "mr": mr, "m_tiles": tiles, "kc": 64,
                                          "unroll_k": 2, "order": order, "pack_a": pack})))
        for mr, tiles, order, pack in ((12, 8, "row", False), (5, 16, "panel", True),
                                       (7, 4, "row", True), (3, 64, "panel", False))
    ]  # fmt: skip
    for (_, config), (ours, ref) in zip(cases, run_built(dense, cases), strict=True):
        check_close(ours, ref, f"dense {shape} {dict(config)}", shape[2])

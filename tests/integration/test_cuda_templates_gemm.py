"""The CUDA GEMM and convolution templates (`cuda_dense`, `cuda_batch_matmul`, `cuda_conv2d`,
`cuda_conv2d_gemm`): configs run in the loop-IR interpreter against numpy at small odd sizes,
their spaces at odd sizes, knobs visible in the rendered CUDA, and nvcc compiling many configs
for sm_90 in one translation unit (skipped without nvcc; no GPU is needed)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from compiler.codegen.cuda import CUDA_PRELUDE, render_cuda
from compiler.ir import interpreter
from compiler.lower import lower
from compiler.ops import get_template
from compiler.ops.base import OpTemplate
from compiler.ops.cuda.conv2d import SHARED_BYTES, CudaConv2dTemplate, shared_footprint
from compiler.ops.cuda.gemm import AxisTile, Epilogue
from compiler.ops.space import Config, ConfigSpace
from compiler.toolchain import find_nvcc

NVCC = find_nvcc()

# Tiny odd workloads: the interpreter runs every thread's copy of a shared tile in turn.
CASES = [
    ("cuda_dense", (10, 6, 9, int(Epilogue.BIAS_ADD_RELU))),
    ("cuda_dense", (7, 12, 8)),
    ("cuda_batch_matmul", (2, 6, 10, 7, int(Epilogue.BIAS_RELU6))),
    ("cuda_conv2d", (1, 3, 6, 5, 4, 3, 3, 1, 1, int(Epilogue.BIAS_ADD_RELU))),
    ("cuda_conv2d", (2, 2, 7, 7, 6, 3, 3, 2, 1, int(Epilogue.BIAS))),
    ("cuda_conv2d_gemm", (2, 3, 4, 5, 4, 3, 3, 1, 1, int(Epilogue.BIAS_RELU))),
    ("cuda_conv2d_gemm", (1, 2, 7, 6, 3, 3, 2, 2, 0)),
]


def _config(space: ConfigSpace, **knobs: object) -> Config:
    values = {**space.get(0), **knobs}
    return space.get(space.index_of(values))


def _run(name: str, shape: tuple[int, ...], config: Config) -> None:
    template = get_template(name)
    assert isinstance(template, OpTemplate)
    sch, args = template.instantiate(shape, config)
    func = lower(sch, args, "kernel")
    rng = np.random.default_rng(config.index % 1000)
    inputs = template.random_inputs(shape, rng)
    out = np.full(args[-1].shape, np.nan, np.float32)
    interpreter.run(func, *template.pack_inputs(shape, config, inputs), out)
    got = template.unpack_output(shape, config, out)
    np.testing.assert_allclose(got, template.reference_for(shape, *inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_default_and_sampled_configs_match_numpy_in_the_interpreter(
    name: str, shape: tuple[int, ...]
) -> None:
    space = get_template(name).config_space(shape)
    rng = np.random.default_rng(len(space))
    for index in (0, *(int(i) for i in rng.integers(0, len(space), 2))):
        _run(name, shape, space.get(index))


def test_every_gemm_knob_keeps_the_dense_result() -> None:
    # each knob's every choice, the others at their defaults: vthreads, layouts, padding,
    # vector copies, double buffering and unrolling change the kernel, never its result
    shape = (8, 8, 8, int(Epilogue.BIAS_RELU))
    space = get_template("cuda_dense").config_space(shape)
    for knob in space.knobs:
        for choice in knob.choices[1:]:
            if knob.name.startswith("tile") and AxisTile.parse(choice).block < 4:
                continue  # the small tiles are covered by the sampled configs
            _run("cuda_dense", shape, _config(space, **{knob.name: choice}))


def test_direct_conv_knobs_keep_the_result() -> None:
    shape = (1, 4, 5, 6, 4, 3, 3, 1, 1, int(Epilogue.BIAS_RELU6))
    space = get_template("cuda_conv2d").config_space(shape)
    for knobs in (
        {"tile_o": "2x2x1"},  # virtual threads: a thread's channels 2 apart
        {"tile_h": "1x1x1", "tile_w": "1x2x3"},
        {"c_tile": 1, "taps_inner": False},
        {"double_buffer": True, "c_tile": 2},
    ):
        _run("cuda_conv2d", shape, _config(space, **knobs))


def test_spaces_at_odd_sizes_offer_dividing_tiles_and_a_plausible_default() -> None:
    space = get_template("cuda_dense").config_space((100, 36, 27))
    default = space.get(0)
    assert 100 % AxisTile.parse(default["tile_m"]).block == 0
    assert 36 % AxisTile.parse(default["tile_n"]).block == 0
    assert 27 % default["k_tile"] == 0 and default["copy"] == "scalar"  # K % 4 != 0
    dense = get_template("cuda_dense")
    assert isinstance(dense, OpTemplate) and dense.worth_measuring((100, 36, 27), default)
    for knob in ("tile_m", "tile_n"):
        choices = next(k for k in space.knobs if k.name == knob).choices
        assert "1x1x1" in choices and all(
            (100 if knob == "tile_m" else 36) % AxisTile.parse(c).block == 0 for c in choices
        )
    aligned = get_template("cuda_dense").config_space((256, 256, 256)).get(0)
    assert (aligned["tile_m"], aligned["k_tile"], aligned["copy"]) == ("1x16x4", 8, "float4")
    conv = get_template("cuda_conv2d").config_space((1, 3, 13, 13, 7, 3, 3, 1, 1))
    assert len(conv) > 1
    with pytest.raises(ValueError, match="epilogue is one of"):
        get_template("cuda_dense").config_space((8, 8, 8, 9))


def _render(name: str, shape: tuple[int, ...], config: Config, symbol: str) -> str:
    template = get_template(name)
    sch, args = template.instantiate(shape, config)
    return render_cuda(lower(sch, args, symbol), symbol).source


def test_knobs_show_in_the_cuda() -> None:
    shape = (256, 256, 256)
    space = get_template("cuda_dense").config_space(shape)
    vec = _render("cuda_dense", shape, _config(space, copy="float4"), "k")
    scalar = _render("cuda_dense", shape, _config(space, copy="scalar"), "k")
    assert "*(const float4 *)(X + " in vec and "const float4" not in scalar
    # a thread's 4 consecutive outputs leave as one 128-bit store, whatever the copies
    assert "*(float4 *)(C_acc + " in scalar
    # both tiles k-major: the transposing copy loads 128 bits and stores four words
    assert ".w;" in vec
    mk = _render("cuda_dense", shape, _config(space, copy="float4", a_shared="mk"), "k")
    assert re.search(r"\*\(float4 \*\)\(A_shared \+ .*\) = \*\(const float4 \*\)\(X \+ ", mk)
    padded = _render("cuda_dense", shape, _config(space, shared_pad=4), "k")
    assert "float A_shared[512];" in scalar.replace("__align__(16) ", "")
    assert "float A_shared[544];" in padded.replace("__align__(16) ", "")  # rows of 64 + 4
    single = _render("cuda_dense", shape, _config(space, double_buffer=False), "k")
    double = _render("cuda_dense", shape, _config(space, double_buffer=True), "k")
    assert single.count("__syncthreads()") == 3 and double.count("__syncthreads()") == 1
    # virtual threads: a thread's 8 rows as two runs of 4, 32 rows apart, not 8 in a row
    plain = _render("cuda_dense", shape, _config(space, tile_m="1x8x8"), "k")
    spread = _render("cuda_dense", shape, _config(space, tile_m="2x8x4"), "k")
    assert "float C_acc_local[32];" in plain and "float C_acc_local[32];" in spread
    assert plain != spread and "+ 32)]" in spread


def _nvcc_ptx(sources: list[str], tmp_path: Path) -> str:
    """PTX for the kernels of `sources` (each a `render_cuda` source) in one nvcc call."""
    assert NVCC is not None
    bodies = [s.removeprefix(CUDA_PRELUDE) for s in sources]
    src = tmp_path / "kernels.cu"
    src.write_text(CUDA_PRELUDE + "\n".join(bodies))
    out = tmp_path / "kernels.ptx"
    cmd = [NVCC, "-ptx", "-arch=sm_90", "-O3", "-o", str(out), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return out.read_text()


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_nvcc_compiles_default_and_sampled_configs_of_every_template(tmp_path: Path) -> None:
    workloads = [
        ("cuda_dense", (256, 512, 128, int(Epilogue.BIAS_ADD_RELU))),
        ("cuda_dense", (100, 36, 27)),
        ("cuda_batch_matmul", (4, 128, 64, 64, int(Epilogue.BIAS))),
        ("cuda_conv2d", (1, 64, 14, 14, 64, 3, 3, 1, 1, int(Epilogue.BIAS_RELU))),
        ("cuda_conv2d", (2, 3, 15, 15, 16, 7, 7, 2, 3, int(Epilogue.BIAS_ADD_RELU))),
        ("cuda_conv2d_gemm", (1, 64, 14, 14, 64, 3, 3, 1, 1, int(Epilogue.BIAS_RELU))),
        ("cuda_conv2d_gemm", (2, 3, 15, 15, 16, 7, 7, 2, 3)),
    ]
    sources: list[str] = []
    rng = np.random.default_rng(7)
    for w, (name, shape) in enumerate(workloads):
        template = get_template(name)
        assert isinstance(template, OpTemplate)
        space = template.config_space(shape)
        picked = [space.get(0)]
        while len(picked) < 4:  # sampled among those worth measuring: the ones a tuner builds
            cfg = space.get(int(rng.integers(0, len(space))))
            if template.worth_measuring(shape, cfg):
                picked.append(cfg)
        sources += [_render(name, shape, cfg, f"k{w}_{i}") for i, cfg in enumerate(picked)]
    # the largest shared footprints the spaces offer: 128 x 128 tiles of k 16, padded rows,
    # double buffered; a direct 7x7/2 convolution with the widest window and most channels
    dense = get_template("cuda_dense").config_space((256, 256, 256))
    big = {"tile_m": "1x16x8", "tile_n": "2x16x4", "k_tile": 16, "shared_pad": 4}
    for layouts in ({"a_shared": "mk", "b_shared": "nk"}, {"a_shared": "km", "b_shared": "kn"}):
        cfg = _config(dense, **big, **layouts, double_buffer=True, copy="async")
        sources.append(_render("cuda_dense", (256, 256, 256), cfg, f"big_{len(sources)}"))
    stem = (1, 32, 64, 64, 64, 7, 7, 2, 3)
    conv = get_template("cuda_conv2d")
    space = conv.config_space(stem)
    widest = {
        k.name: max(k.choices, key=lambda c: AxisTile.parse(c).block) for k in space.knobs[:3]
    }
    cfg = _config(space, **widest, c_tile=16, double_buffer=True)
    sources.append(_render("cuda_conv2d", stem, cfg, "big_conv"))
    ptx = _nvcc_ptx(sources, tmp_path)
    assert ptx.count(".visible .entry") == len(sources)
    # the dense default: 128-bit global loads, and a thread's 4 values of a k-major shared
    # tile read as one 128-bit shared load
    first = ptx[ptx.index(".visible .entry k0_0(") : ptx.index(".visible .entry k0_1(")]
    assert re.search(r"ld\.global(\.nc)?\.v4\.f32", first) and "ld.shared.v4.f32" in first


def test_direct_conv_configs_fit_shared_memory_as_built() -> None:
    conv = get_template("cuda_conv2d")
    assert isinstance(conv, CudaConv2dTemplate)
    for shape in ((1, 32, 64, 64, 64, 7, 7, 2, 3), (1, 64, 28, 28, 128, 3, 3, 1, 1)):
        space = conv.config_space(shape)
        shrunk = 0
        for index in range(0, len(space), 7):
            cfg = space.get(index)
            c_tile, double = conv.effective(shape, cfg)
            assert shared_footprint(shape, conv.tiles(shape, cfg), c_tile, double) <= SHARED_BYTES
            if (c_tile, double) != (cfg["c_tile"], cfg["double_buffer"]):
                shrunk += 1
                assert not conv.worth_measuring(shape, cfg)
        assert shrunk  # the caps alone do not fit every c_tile: the shrinking is exercised


@pytest.mark.parametrize(("name", "shape"), [CASES[0], CASES[3], CASES[5]])
def test_reference_kernels_take_the_configs_arguments(name: str, shape: tuple[int, ...]) -> None:
    # what a harness checks a tuned kernel against: the config's argument layout (the tiled
    # output and residual), naively scheduled, from the layout knobs alone
    template = get_template(name)
    assert isinstance(template, OpTemplate)
    space = template.config_space(shape)
    config = space.get(len(space) // 3)
    sch, args = template.reference_kernel(shape, config)
    assert [t.shape for t in args] == [t.shape for t in template.instantiate(shape, config)[1]]
    func = lower(sch, args, "reference")
    inputs = template.random_inputs(shape, np.random.default_rng(3))
    out = np.full(args[-1].shape, np.nan, np.float32)
    interpreter.run(func, *template.pack_inputs(shape, config, inputs), out)
    expected = template.reference_for(shape, *inputs)
    got = template.unpack_output(shape, config, out)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_tiny_workloads_still_have_configs_worth_measuring() -> None:
    for name, shape in (("cuda_dense", (4, 4, 4)), ("cuda_conv2d", (1, 1, 3, 3, 2, 3, 3, 1, 1))):
        template = get_template(name)
        assert isinstance(template, OpTemplate)
        space = template.config_space(shape)
        assert any(template.worth_measuring(shape, space.get(i)) for i in range(len(space)))


def test_async_copies_fill_tiles_that_keep_the_global_layout() -> None:
    # cp.async moves 16 bytes from global to shared memory without registers: with double
    # buffering the next tile's copies are in flight during this tile's FMAs
    shape = (8, 8, 8, int(Epilogue.BIAS))
    template = get_template("cuda_dense")
    assert isinstance(template, OpTemplate)
    space = template.config_space(shape)
    kept = _config(space, copy="async", a_shared="mk", b_shared="nk", double_buffer=True)
    _run("cuda_dense", shape, kept)
    source = _render("cuda_dense", shape, kept, "k")
    assert source.count("kiln_cp_async_float4(") == 3  # the helper, A's call, B's call
    assert "__pipeline_wait_prior(0);" in source
    assert template.worth_measuring(shape, kept)
    # a transposing copy cannot: its tile falls back to float4 copies, and with both tiles
    # transposed the config is the float4 kernel again
    moved = _config(space, copy="async", a_shared="mk", b_shared="kn")
    assert _render("cuda_dense", shape, moved, "k").count("kiln_cp_async_float4(") == 2
    transposed = _config(space, copy="async", a_shared="km", b_shared="kn")
    assert "cp_async" not in _render("cuda_dense", shape, transposed, "k")
    assert not template.worth_measuring(shape, transposed)
    # batch matmul's B is row-contiguous: its kn tile keeps the layout
    bmm = get_template("cuda_batch_matmul")
    bshape = (2, 4, 8, 4)
    cfg = _config(bmm.config_space(bshape), copy="async", a_shared="km", b_shared="kn")
    assert _render("cuda_batch_matmul", bshape, cfg, "k").count("kiln_cp_async_float4(") == 2
    _run("cuda_batch_matmul", bshape, cfg)


def test_register_tiles_are_indexed_by_constants_when_a_grid_axis_has_one_block() -> None:
    # one image and one channel tile: the batch and channel block indices span their whole
    # dimension; indexing the register tile by them would make nvcc put it on the stack
    shape = (1, 8, 6, 6, 16, 3, 3, 1, 1, int(Epilogue.BIAS_RELU))
    space = get_template("cuda_conv2d_gemm").config_space(shape)
    source = _render("cuda_conv2d_gemm", shape, _config(space, tile_m="1x4x4"), "k")
    indices = re.findall(r"C_acc_local\[([^\]]*)\]", source)
    assert indices and all(i.isdigit() for i in indices), {i for i in indices if not i.isdigit()}


# (template, shape, knobs, copies and layouts): guards on the rows (10 and 6 do not fill a
# copy's threads), lane tails (k_tile 3 of float4), a row-contiguous B (batch matmul), an
# implicit GEMM's gathered input with padding (small tiles: the interpreter runs every thread's
# copy of a tile for every thread)
EVERY_COPY = [
    (c, a, b) for c in ("scalar", "float4", "async") for a, b in (("km", "kn"), ("mk", "nk"))
]
STAGED_CASES = [
    ("cuda_dense", (10, 6, 9, int(Epilogue.BIAS_ADD_RELU)), {"k_tile": 3}, EVERY_COPY),
    ("cuda_dense", (16, 16, 16), {"k_tile": 4}, [("float4", "km", "kn"), ("async", "km", "nk")]),
    ("cuda_batch_matmul", (2, 6, 10, 8, int(Epilogue.BIAS_RELU6)), {"k_tile": 2}, EVERY_COPY),
    (
        "cuda_conv2d_gemm",
        (1, 4, 5, 5, 8, 3, 3, 1, 1, int(Epilogue.BIAS_RELU)),
        {"tile_m": "2x1x2", "tile_n": "1x1x5", "k_tile": 3},
        [("scalar", "km", "kn"), ("float4", "mk", "nk")],
    ),
]


@pytest.mark.parametrize(("name", "shape", "knobs", "copies"), STAGED_CASES)
def test_tiles_staged_through_registers_keep_the_result(
    name: str, shape: tuple[int, ...], knobs: dict[str, object], copies: list[tuple[str, str, str]]
) -> None:
    # the staged loads and stores (and the interpreter keeping each thread's registers its
    # own) give the numpy result
    space = get_template(name).config_space(shape)
    for copy, a, b in copies:
        config = _config(space, **knobs, copy=copy, a_shared=a, b_shared=b, double_buffer="staged")
        _run(name, shape, config)
        assert "_shared_reg" in _render(name, shape, config, "k")  # some tile is staged


def test_staged_tiles_load_before_the_fmas_and_store_after_them() -> None:
    # CUTLASS's SIMT mainloop: the next k tile's global loads go into registers before this
    # tile's FMAs, so a thread's own FMAs hide their latency, and into the other shared half
    # after them; plain double buffering stores into shared memory before the FMAs
    shape = (64, 64, 64)
    space = get_template("cuda_dense").config_space(shape)
    knobs = {"tile_m": "2x8x4", "tile_n": "2x8x4", "k_tile": 8, "copy": "float4"}
    staged = _render("cuda_dense", shape, _config(space, **knobs, double_buffer="staged"), "k")
    plain = _render("cuda_dense", shape, _config(space, **knobs, double_buffer=True), "k")
    for source, is_staged in ((staged, True), (plain, False)):
        loop = source[source.index("for (int32_t k_o = 0;") :]
        first_fma = loop.index("C_acc_local[0] = (C_acc_local[0] +")
        last_fma = loop.index("C_acc_local[63] = (C_acc_local[63] +")
        loads = [m.start() for m in re.finditer(r"\*\(const float4 \*\)\((X|W) \+ ", loop)]
        stores = [m.start() for m in re.finditer(r"[AB]_shared\[[^;]*\] = ", loop)]
        # a thread's 2 float4 of A and 2 of B: unrolled when staged, a loop of 2 each when not
        assert len(loads) == (4 if is_staged else 2) and len(stores) >= 2
        assert all(at < first_fma for at in loads)
        if is_staged:
            assert all(at > last_fma for at in stores)
            assert "float A_shared_reg[8];" in source and "float B_shared_reg[8];" in source
            assert source.count("__syncthreads()") == 1  # still one barrier a k step
        else:
            assert all(at < first_fma for at in stores) and "_reg" not in source


def test_staging_applies_only_where_a_tile_is_copied_through_registers() -> None:
    # cp.async copies need no registers: with both tiles copied so, "staged" is the True
    # kernel again; with one, the other tile is staged
    shape = (16, 16, 16)
    template = get_template("cuda_dense")
    assert isinstance(template, OpTemplate)
    space = template.config_space(shape)
    both = {"copy": "async", "a_shared": "mk", "b_shared": "nk"}
    assert not template.worth_measuring(shape, _config(space, **both, double_buffer="staged"))
    same = _render("cuda_dense", shape, _config(space, **both, double_buffer="staged"), "k")
    assert same == _render("cuda_dense", shape, _config(space, **both, double_buffer=True), "k")
    one = _config(space, copy="async", a_shared="km", b_shared="nk", double_buffer="staged")
    source = _render("cuda_dense", shape, one, "k")
    assert template.worth_measuring(shape, one)
    assert "A_shared_reg" in source and "B_shared_reg" not in source


def test_min_blocks_bounds_the_launch_of_big_blocks_only() -> None:
    shape = (256, 256, 256)
    template = get_template("cuda_dense")
    assert isinstance(template, OpTemplate)
    space = template.config_space(shape)
    big = _config(space, tile_m="2x16x4", tile_n="2x16x4", min_blocks=2)  # 256 threads
    assert template.worth_measuring(shape, big)
    assert "__global__ void __launch_bounds__(256, 2) k(" in _render("cuda_dense", shape, big, "k")
    one = _config(space, tile_m="2x16x4", tile_n="2x16x4", min_blocks=1)
    assert "__launch_bounds__" not in _render("cuda_dense", shape, one, "k")
    # 128 threads: two blocks leave 256 registers a thread, above ptxas's 255: no cap
    small = _config(space, tile_m="2x8x4", tile_n="2x16x4", min_blocks=2)
    assert not template.worth_measuring(shape, small)


# The ResNet-18 conv candidate that failed every launch on the H100 (2 of 36, stop 40): 7 x 7 x 8
# threads, 13 warps, one partition of a multiprocessor holding 4 of them
BIG_CONV = (1, 64, 56, 56, 64, 3, 3, 1, 1, 2)
BIG_BLOCK = {"tile_o": "2x8x2", "tile_h": "1x7x4", "tile_w": "1x7x2", "c_tile": 8}


def test_blocks_of_more_than_8_warps_are_bounded_and_smaller_ones_are_not() -> None:
    space = get_template("cuda_conv2d").config_space(BIG_CONV)
    big = _config(space, **BIG_BLOCK, taps_inner=False, double_buffer=True)
    assert "__global__ void __launch_bounds__(392) k(" in _render("cuda_conv2d", BIG_CONV, big, "k")
    small = _config(space, **{**BIG_BLOCK, "tile_h": "1x1x4"}, taps_inner=False)  # 56 threads
    assert "__launch_bounds__" not in _render("cuda_conv2d", BIG_CONV, small, "k")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_a_bounded_big_block_gets_registers_its_launch_has(tmp_path: Path) -> None:
    # unbounded, ptxas gave this block 136 registers a thread: 4 warps x 32 x 136 = 17,408 in
    # one 16,384-register partition, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES at every launch
    space = get_template("cuda_conv2d").config_space(BIG_CONV)
    big = _config(space, **BIG_BLOCK, taps_inner=False, double_buffer=True)
    src = tmp_path / "k.cu"
    src.write_text(_render("cuda_conv2d", BIG_CONV, big, "k"))
    assert NVCC is not None
    cmd = [NVCC, "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-o", str(tmp_path / "k.o")]
    proc = subprocess.run(
        [*cmd, str(src)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    used = int(re.findall(r"Used (\d+) registers", proc.stderr)[0])
    warps_in_a_partition = -(-13 // 4)
    assert warps_in_a_partition * 32 * used <= 16384, used


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_two_blocks_a_multiprocessor_cap_the_registers_ptxas_gives(tmp_path: Path) -> None:
    # a staged 128 x 128 tile takes ~160 registers (one block of 256 threads a multiprocessor);
    # __launch_bounds__(256, 2) makes ptxas fit it in 128
    shape = (2048, 2048, 2048)
    space = get_template("cuda_dense").config_space(shape)
    knobs = {"tile_m": "2x16x4", "tile_n": "2x16x4", "k_tile": 16, "copy": "scalar"}
    src = tmp_path / "k.cu"
    bodies = [
        _render("cuda_dense", shape, _config(space, **knobs, double_buffer="staged", min_blocks=b), f"b{b}")
        .removeprefix(CUDA_PRELUDE)
        for b in (1, 2)
    ]  # fmt: skip
    src.write_text(CUDA_PRELUDE + "\n".join(bodies))
    assert NVCC is not None
    cmd = [NVCC, "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-o", str(tmp_path / "k.o")]
    cmd.append(str(src))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    used = dict(re.findall(r"entry function '(b\d)'.*?Used (\d+) registers", proc.stderr, re.S))
    assert int(used["b2"]) <= 128 < int(used["b1"]), used

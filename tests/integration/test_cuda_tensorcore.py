"""Tensor cores through tensorize (compiler/ops/cuda/tensorcore.py): the WMMA intrinsics and the
fp16 GEMM template `cuda_dense_fp16_tc`, run as loop IR in the interpreter against numpy (each
intrinsic's emulation is its semantics), and rendered as CUDA that nvcc compiles for sm_90 and
sm_80 (no GPU needed; skipped when nvcc is absent). float16 casts render and compile too."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from compiler import ops, te
from compiler.codegen.cuda import CUDA_PRELUDE, render_cuda
from compiler.errors import CodegenError, LowerError, ScheduleError
from compiler.ir import PrimFunc, interpreter
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.stmt import Allocate, For, ForKind, IntrinCall
from compiler.lower import lower
from compiler.ops.cuda.tensorcore import (
    BENCHMARK_CONFIGS,
    TensorCoreConfig,
    TensorCoreDenseTemplate,
    tensorcore_dense,
    tensorcore_schedule,
    wmma_load_a,
    wmma_mma,
)
from compiler.ops.space import Config
from compiler.schedule import create_schedule
from compiler.toolchain import compile_cuda, find_nvcc

NVCC = find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
TEMPLATE = TensorCoreDenseTemplate()
SMALL = (32, 48, 64)  # M, N, K: two 16-row fragments, three 16-column ones, two 32-wide k tiles


def _config(shape: tuple[int, int, int], **knobs: object) -> Config:
    space = TEMPLATE.config_space(shape)
    values = dict(space.get(0))
    values.update(knobs)
    return space.get(space.index_of(values))


def _lowered(shape: tuple[int, int, int], config: Config) -> PrimFunc:
    sch, args = TEMPLATE.instantiate(shape, config)
    return lower(sch, args, "tc_gemm")


def _check_in_interpreter(func: PrimFunc, shape: tuple[int, int, int], seed: int = 0) -> None:
    m, n, k = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float16)
    w = rng.standard_normal((n, k)).astype(np.float16)
    y = np.full((m, n), np.nan, np.float32)
    interpreter.run(func, x, w, y)
    # fp16 x fp16 products are exact in fp32 (11-bit significands), so the kernel and numpy's
    # fp32 GEMM differ only in the order of K fp32 additions: |error| <= K * 2^-24 * sum |x w|,
    # about 64 * 6e-8 * 64 = 2.4e-4 in the worst case here; an fp16 accumulator would be off by
    # ~1e-2, so 1e-4 + 1e-5 relative tells the two apart.
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(y, TEMPLATE.reference(x, w), rtol=1e-5, atol=1e-4)


def test_tensorized_gemm_calls_the_intrinsics_on_fragments_and_matches_numpy() -> None:
    cfg = _config(SMALL, tile_m="1x2", k_tile=32, pad=8, copy="vector", double_buffer=False)
    func = _lowered(SMALL, cfg)
    text = str(func)
    # the warp's accumulators (2 x 1 fragments) are zeroed by the reset part, fragments are
    # loaded from the padded shared tiles (32 + 8 halves a row), one MMA per fragment pair
    assert "Y.wmma.accumulator = allocate(float32[32, 16], wmma.accumulator)" in text
    assert "X.shared = allocate(float16[32, 40], shared)" in text
    assert "X.shared.wmma.matrix_a = allocate(float16[32, 16], wmma.matrix_a)" in text
    for call in ("fill", "load_a", "load_b", "mma", "store"):
        assert f"kiln_wmma_{call}_16x16x16(" in text
    assert "kiln_copy_half8(" in text
    _check_in_interpreter(func, SMALL)


def test_every_config_of_a_small_space_is_correct_in_the_interpreter() -> None:
    space = TEMPLATE.config_space(SMALL)
    assert len(space) >= 32
    for index in range(len(space)):
        _check_in_interpreter(_lowered(SMALL, space.get(index)), SMALL, seed=index)


@pytest.mark.parametrize(
    "knobs", [{"tile_m": "2x2", "tile_n": "2x2"}, {"tile_m": "4x1", "tile_n": "1x4"}]
)
def test_several_warps_and_blocks_with_double_buffering_match_numpy(
    knobs: dict[str, str],
) -> None:
    shape = (128, 128, 64)
    cfg = _config(shape, k_tile=16, double_buffer=True, **knobs)
    func = _lowered(shape, cfg)
    assert "if (k_o + 1) < 4:" in str(func)  # the next k tile is prefetched into the other half
    _check_in_interpreter(func, shape)


def test_workloads_that_are_not_multiples_of_16_are_refused() -> None:
    with pytest.raises(ValueError, match="K=40 is not a positive multiple of 16"):
        TEMPLATE.config_space((32, 32, 40))
    with pytest.raises(ValueError, match="M=8 is not a positive multiple of 16"):
        TEMPLATE.compute((8, 32, 32))
    x, w, y = TEMPLATE.compute((32, 32, 32))
    with pytest.raises(ScheduleError, match="M=32 is not a multiple of 64"):
        tensorcore_schedule(x, w, y, TensorCoreConfig(warps_m=2, frags_m=2))
    with pytest.raises(ScheduleError, match="pad=4 is not a multiple of 8"):
        tensorcore_schedule(x, w, y, TensorCoreConfig(1, 1, 1, 1, pad=4))


def test_the_template_is_registered_with_a_space_of_dividing_tiles() -> None:
    assert ops.op_templates()["cuda_dense_fp16_tc"].name == "cuda_dense_fp16_tc"
    x, w = TEMPLATE.random_inputs((32, 32, 16), np.random.default_rng(0))
    assert x.dtype == w.dtype == np.float16 and w.shape == (32, 16)  # W is [N][K]
    space = TEMPLATE.config_space((64, 48, 16))
    knobs = {k.name: k.choices for k in space.knobs}
    assert knobs["tile_n"] == ("1x1",)  # 48 = 3 fragments: only one a block divides it
    assert knobs["k_tile"] == (16,)
    assert set(knobs["tile_m"]) == {"1x1", "1x2", "2x1", "2x2", "1x4", "4x1"}


def test_tensorizing_a_copy_intrinsic_onto_a_reduction_is_refused() -> None:
    a = te.placeholder((16, 16), "float16", name="A")
    r = te.reduce_axis((0, 16), name="r")
    b = te.compute((16, 16), lambda i, j: te.sum(a[i, r] * a[r, j], axis=r), name="B")
    s = create_schedule(b)
    i, _ = s[b].axis
    s[b].reorder(i, s[b].axis[1], r)
    with pytest.raises(ScheduleError, match="covers 3 loops, intrinsic kiln_wmma_load_a"):
        s[b].tensorize(i, wmma_load_a())
    c = te.compute((16, 16), lambda i, j: te.sum(a[i, r], axis=r), name="C")
    s = create_schedule(c)
    s[c].reorder(s[c].reduce_axis[0], *s[c].axis)
    s[c].tensorize(s[c].axis[0], wmma_load_a())
    with pytest.raises(LowerError, match="which has no reduction, on a reduction"):
        lower(s, [a, c], "f")


def test_storage_align_pads_only_the_rows() -> None:
    a = te.placeholder((8, 8), name="A")
    b = te.compute((8, 8), lambda i, j: a[i, j] * 2.0, name="B")
    s = create_schedule(b)
    with pytest.raises(ScheduleError, match="only the second-to-last data axis"):
        s[b].storage_align(s[b].axis[1], 16, 8)
    with pytest.raises(ScheduleError, match="0 <= offset < factor"):
        s[b].storage_align(s[b].axis[0], 16, 16)


# -- rendering -----------------------------------------------------------------------------------


def _source(shape: tuple[int, int, int], **knobs: object) -> str:
    return render_cuda(_lowered(shape, _config(shape, **knobs)), "tc_gemm").source


def test_render_declares_fragments_and_calls_wmma() -> None:
    kernel = render_cuda(
        _lowered((128, 128, 64), _config((128, 128, 64), tile_m="2x2", tile_n="1x2")), "tc"
    )
    assert kernel.block == (32, 1, 2)  # threadIdx.x = the 32 lanes, threadIdx.z = the warps
    src = kernel.source
    assert src.index("#include <cuda_fp16.h>") < src.index("__half")
    assert "void tc(__half *__restrict__ X, __half *__restrict__ W, float *__restrict__ Y)" in src
    assert "kiln_wmma_fill_16x16x16_frag Y_wmma_accumulator[4];" in src
    assert "kiln_wmma_load_a_16x16x16_frag X_shared_wmma_matrix_a[2];" in src
    assert "nvcuda::wmma::mma_sync(c, a, b, c);" in src
    # A's rows of k are row-major; W's rows of k, read as B = W^T (k x n), are column-major
    assert "fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major>" in src
    assert "fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half, nvcuda::wmma::col_major>" in src
    # fragment (i, j) of the warp's 2x2 accumulators is element i * 2 + j of the array
    mma = re.search(
        r"kiln_wmma_mma_16x16x16\(Y_wmma_accumulator\[\(\((\w+) \* 2\) \+ (\w+)\)\], "
        r"X_shared_wmma_matrix_a\[(\w+)\], W_shared_wmma_matrix_b\[(\w+)\]\);",
        src,
    )
    assert mma is not None and mma.group(1, 2) == mma.group(3, 4), src
    assert "__shared__ __align__(32) __half X_shared[" in src


def test_config_knobs_change_the_code() -> None:
    base = {"tile_m": "1x2", "k_tile": 32, "pad": 8, "copy": "vector", "double_buffer": False}
    padded = _source(SMALL, **base)
    unpadded = _source(SMALL, **{**base, "pad": 0})
    # rows of 32 + 8 halves: the leading dimension the fragment loads are given
    assert "__half X_shared[1280];" in padded and ", 40, 1);" in padded
    assert "__half X_shared[1024];" in unpadded and ", 40, 1);" not in unpadded
    scalar = _source(SMALL, **{**base, "copy": "scalar"})
    assert "kiln_copy_half8(" in padded and "kiln_copy_half8(" not in scalar
    doubled = _source(SMALL, **{**base, "double_buffer": True})
    assert padded.count("__syncthreads();") == 3 and doubled.count("__syncthreads();") == 1
    assert "__half X_shared[2560];" in doubled
    # cp.async: the copies land later, so every barrier first waits for them
    asynchronous = _source(SMALL, **{**base, "double_buffer": True, "copy": "async"})
    assert "kiln_cp_async_half8(&X_shared[" in asynchronous
    assert "__pipeline_memcpy_async(d, s, 16);" in asynchronous
    assert asynchronous.count("__pipeline_wait_prior(0);\n") == 1
    assert re.search(r"__pipeline_wait_prior\(0\);\n\s*__syncthreads\(\);", asynchronous)
    assert "__pipeline_wait_prior" not in doubled


def test_fragments_are_opaque_to_element_stores() -> None:
    # an accumulator that the schedule leaves to ordinary loops (no tensorize) cannot render
    a = te.placeholder((16, 16), "float16", name="A")
    b = te.compute((16, 16), lambda i, j: te.cast("float32", a[i, j]), name="B")
    s = create_schedule(b)
    s.cache_write(b, "wmma.accumulator")
    with pytest.raises(CodegenError, match="never written by an intrinsic"):
        render_cuda(lower(s, [a, b], "f"), "f")


def test_a_region_that_does_not_start_a_fragment_is_refused() -> None:
    intrin = wmma_mma()
    assert intrin.reset is not None and intrin.emulate_reset is not None
    acc = Buffer("acc", (32, 16), "float32", "wmma.accumulator")
    i = E.Var("i")
    fill = IntrinCall(
        intrin.reset,
        ((acc, i * 8, (16, 1)),),  # half a fragment down: rows 8..23
        ((16, 16),),
        intrin.c_source,
        intrin.emulate_reset,
    )
    func = PrimFunc("f", (), Allocate(acc, For(i, E.IntImm(2), ForKind.SERIAL, fill)))
    with pytest.raises(CodegenError, match="does not provably start a 16x16 fragment"):
        render_cuda(func, "f")
    aligned = dataclasses.replace(fill, operands=((acc, i * 256, (16, 1)),))
    func = PrimFunc("f", (), Allocate(acc, For(i, E.IntImm(2), ForKind.SERIAL, aligned)))
    assert "kiln_wmma_fill_16x16x16(acc[i]);" in render_cuda(func, "f").source


CONFIGS_TO_BUILD = (
    {"tile_m": "2x4", "tile_n": "2x4", "k_tile": 32, "copy": "vector", "double_buffer": False},
    {"tile_m": "4x2", "tile_n": "2x2", "k_tile": 32, "copy": "async", "double_buffer": True},
    {"tile_m": "1x1", "tile_n": "1x1", "k_tile": 16, "pad": 0, "copy": "scalar"},
)


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvcc_compiles_tensor_core_gemms(arch: str) -> None:
    shape = (256, 256, 128)
    for knobs in CONFIGS_TO_BUILD:
        kernel = render_cuda(_lowered(shape, _config(shape, **knobs)), "tc_gemm")
        assert "mma_sync" in kernel.source
        cubin = compile_cuda(kernel.source, arch)
        assert cubin[:4] == b"\x7fELF", knobs


@needs_nvcc
def test_benchmark_configs_build_without_spilling(tmp_path: Path) -> None:
    assert NVCC is not None
    for cfg in BENCHMARK_CONFIGS:
        source = render_cuda(tensorcore_dense(1024, 1024, 1024, cfg), "tc").source
        src = tmp_path / "tc.cu"
        src.write_text(source)
        cmd = [NVCC, "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-o", str(tmp_path / "tc")]
        proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        assert "0 bytes spill stores" in proc.stderr, (cfg, proc.stderr)


@needs_nvcc
def test_two_kernels_calling_the_same_intrinsics_share_one_unit() -> None:
    # build_cuda concatenates kernels after one prelude: each helper must be defined once
    first = render_cuda(_lowered(SMALL, _config(SMALL)), "tc_a").source
    second = render_cuda(_lowered(SMALL, _config(SMALL, pad=0)), "tc_b").source
    assert first.startswith(CUDA_PRELUDE) and second.startswith(CUDA_PRELUDE)
    unit = first + second[len(CUDA_PRELUDE) :]
    assert unit.count("__device__ __forceinline__ void kiln_wmma_mma_16x16x16(") == 2
    assert compile_cuda(unit, "sm_90")[:4] == b"\x7fELF"


# -- float16 outside tensor cores ---------------------------------------------------------------


def _fp16_kernel() -> tuple[PrimFunc, list[te.Tensor]]:
    """h = fp16(exp(f32(x)) * 0.5) + fp16(1.5); y = f32(h) + 0.25: both directions of cast, an
    fp16 literal and fp16 arithmetic, on 64 threads."""
    x = te.placeholder((4, 64), "float16", name="X")
    h = te.compute(
        (4, 64),
        lambda i, j: (
            te.cast("float16", te.exp(te.cast("float32", x[i, j])) * 0.5)
            + te.cast("float16", te.cast("float32", x[i, j]) * 0.0 + 1.5)
        ),
        name="H",
    )
    y = te.compute((4, 64), lambda i, j: te.cast("float32", h[i, j]) + 0.25, name="Y")
    s = create_schedule(y)
    s[h].compute_inline()
    s[y].bind(s[y].axis[0], "blockIdx.x")
    s[y].bind(s[y].axis[1], "threadIdx.x")
    return lower(s, [x, y], "fp16_ew"), [x, y]


def test_fp16_arithmetic_rounds_to_fp16_in_the_interpreter() -> None:
    func, _ = _fp16_kernel()
    x = np.linspace(-2, 2, 256, dtype=np.float16).reshape(4, 64)
    y = np.full((4, 64), np.nan, np.float32)
    interpreter.run(func, x, y)
    h = np.exp(x.astype(np.float32)).__mul__(np.float32(0.5)).astype(np.float16)
    want = (h + np.float16(1.5)).astype(np.float32) + np.float32(0.25)
    np.testing.assert_array_equal(y, want)  # every fp16 step rounds as numpy's float16 does
    # a float16 sum accumulates in float16 when the IR says so (no hidden float32)
    a = te.placeholder((1000,), "float16", name="A")
    r = te.reduce_axis((0, 1000), name="r")
    total = te.compute((1,), lambda _: te.sum(a[r], axis=r), name="T")
    f = lower(create_schedule(total), [a, total], "sum16")
    tenths = np.full(1000, 0.1, np.float16)
    out = np.zeros(1, np.float16)
    interpreter.run(f, tenths, out)
    acc = np.float16(0)
    for v in tenths:
        acc = np.float16(acc + v)
    assert out[0] == acc and abs(float(acc) - 1000 * float(tenths[0])) > 1  # 105.2, not 99.98


def test_fp16_casts_render_through_float() -> None:
    func, _ = _fp16_kernel()
    src = render_cuda(func, "fp16_ew").source
    assert src.index("#include <cuda_fp16.h>") < src.index("__half")
    assert "__half *__restrict__ X, float *__restrict__ Y" in src
    assert "__half2float(X[" in src and "__float2half(" in src
    assert "_Float16" not in src


@needs_nvcc
def test_nvcc_compiles_fp16_casts() -> None:
    func, _ = _fp16_kernel()
    cubin = compile_cuda(render_cuda(func, "fp16_ew").source, "sm_90")
    assert cubin[:4] == b"\x7fELF"


def _cast_kernel() -> PrimFunc:
    """Y = f32(fp16(f64(X) * 3) + fp16(i32(X))): fp16 from float64 and int32, and back."""
    x = te.placeholder((64,), "float16", name="X")
    y = te.compute(
        (64,),
        lambda i: te.cast(
            "float32",
            te.cast("float16", te.cast("float64", x[i]) * 3.0)
            + te.cast("float16", te.cast("int32", x[i])),
        ),
        name="Y",
    )
    s = create_schedule(y)
    s[y].bind(s[y].axis[0], "threadIdx.x")
    return lower(s, [x, y], "casts")


def test_fp16_casts_from_float64_and_int_match_numpy_and_render() -> None:
    func = _cast_kernel()
    x = np.linspace(-3, 3, 64, dtype=np.float16)
    y = np.full(64, np.nan, np.float32)
    interpreter.run(func, x, y)
    tripled = (x.astype(np.float64) * 3.0).astype(np.float16)
    want = (tripled + np.trunc(x).astype(np.int32).astype(np.float16)).astype(np.float32)
    np.testing.assert_array_equal(y, want)
    src = render_cuda(func, "casts").source
    assert "__double2half(" in src and "((int32_t)__half2float(X[" in src


@needs_nvcc
def test_nvcc_compiles_fp16_casts_from_float64_and_int() -> None:
    assert compile_cuda(render_cuda(_cast_kernel(), "casts").source, "sm_90")[:4] == b"\x7fELF"


# -- on a GPU (skipped here: no GPU; run on a lent machine) --------------------------------------


@pytest.mark.parametrize("cfg", BENCHMARK_CONFIGS, ids=str)
def test_tensor_core_gemm_matches_numpy_on_the_gpu(cfg: TensorCoreConfig) -> None:
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    from device_agent.backends.cuda_driver import CudaError, Gpu

    try:
        gpu = Gpu.open()
    except CudaError as e:
        pytest.skip(f"no GPU: {e}")
    try:
        major, minor = gpu.compute_capability()
        m, n, k = 256, 384, 512
        kernel = render_cuda(tensorcore_dense(m, n, k, cfg), "tc")
        fn = gpu.load_function(compile_cuda(kernel.source, f"sm_{major}{minor}"), "tc")
        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, (m, k)).astype(np.float16)
        w = rng.uniform(-1, 1, (n, k)).astype(np.float16)
        bufs = [gpu.upload(x), gpu.upload(w), gpu.upload(np.full((m, n), np.nan, np.float32))]
        gpu.launch(fn, kernel.grid, kernel.block, bufs)
        gpu.synchronize()
        got = gpu.download(bufs[2], (m, n))
        # exact products, fp32 sums in the tensor core's order (and its truncation on sm_90)
        np.testing.assert_allclose(got, TEMPLATE.reference(x, w), rtol=1e-3, atol=1e-3)
    finally:
        gpu.close()

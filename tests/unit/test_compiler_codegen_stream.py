"""Streaming stores (pragma "nontemporal" on a vectorized loop): the C they render, the fences,
builds for every x86 target class and aarch64, and results against numpy whether or not the
output is aligned for the streaming instruction."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from compiler import te
from compiler.build import build_source
from compiler.codegen.c import check_symbol
from compiler.codegen.vector import NONTEMPORAL, stream_helper
from compiler.errors import CodegenError
from compiler.schedule import Schedule, create_schedule
from compiler.toolchain import TARGETS, compile_shared

pytestmark = pytest.mark.usefixtures("build_cache")


def scale_schedule(
    rows: int, cols: int, lanes: int = 16, parallel: bool = True, stream: bool = True
) -> tuple[Schedule, list[te.Tensor]]:
    """out = 2 * a, rows in parallel, columns vectorized `lanes` wide, stores streamed."""
    a = te.placeholder((rows, cols), name="a")
    out = te.compute((rows, cols), lambda i, j: a[i, j] * 2.0, name="out")
    s = create_schedule(out)
    i, j = out.op.axis
    _jo, ji = s[out].split(j, lanes)
    s[out].vectorize(ji)
    if stream:
        s[out].pragma(ji, NONTEMPORAL)
    if parallel:
        s[out].parallel(i)
    return s, [a, out]


def kernel(source: str) -> str:
    start = source.index("int32_t scale(")
    return source[start : source.index("\n}\n", start)]


def test_streamed_stores_render_through_the_helper_and_are_fenced() -> None:
    src = build_source(*scale_schedule(4, 64), "scale", "x86_64-avx512")
    body = kernel(src)
    assert body.count("kiln_vstream_float32x16(&out[") == 1 and "kiln_vstore" not in body
    # one fence per parallel iteration (this thread's stores) and one before returning
    assert body.count("kiln_stream_fence();") == 2
    assert body.rstrip().endswith("kiln_stream_fence();\n  return 0;")
    assert "if (((uintptr_t)p & 63) == 0) {\n    _mm512_stream_ps(p, (__m512)v);" in src
    assert "#include <immintrin.h>" in src


def test_without_the_pragma_the_source_is_unchanged() -> None:
    src = build_source(*scale_schedule(4, 64, stream=False), "scale", "x86_64-avx512")
    assert "stream" not in src and "immintrin" not in src
    assert "kiln_vstore_float32x16(&out[" in src


def test_a_serial_kernel_fences_once_and_a_tail_streams_its_own_width() -> None:
    src = build_source(*scale_schedule(3, 45, lanes=16, parallel=False), "scale", "x86_64-avx512")
    body = kernel(src)
    assert body.count("kiln_stream_fence();") == 1
    # 45 = 2 x 16 + 8 + 4 + 1: the partitioned tail's vectors stream too, the last element not
    assert "kiln_vstream_float32x8(" in body and "kiln_vstream_float32x4(" in body
    assert "static inline void kiln_vstream_float32x4(float *p" in src


@pytest.mark.parametrize(
    ("dtype", "lanes", "expect"),
    [
        ("float32", 4, "_mm_stream_ps(p, (__m128)v)"),
        ("float32", 8, "_mm256_stream_ps(p, (__m256)v)"),
        ("float64", 8, "_mm512_stream_pd(p, (__m512d)v)"),
        ("int32", 16, "_mm512_stream_si512((__m512i *)p, (__m512i)v)"),
        ("int64", 2, "_mm_stream_si128((__m128i *)p, (__m128i)v)"),
        ("float32", 2, None),  # 8 bytes: no streaming instruction, the ordinary store only
    ],
)
def test_stream_helper_per_vector_type(dtype: str, lanes: int, expect: str | None) -> None:
    helper = stream_helper(dtype, lanes)
    assert helper.rstrip().endswith(f"kiln_vstore_{dtype}x{lanes}(p, v);\n}}")
    if expect is None:
        assert "_mm" not in helper
    else:
        assert expect in helper


@pytest.mark.parametrize("target", [*TARGETS])
def test_it_builds_for_every_target_class(target: str) -> None:
    tgt = TARGETS[target]
    try:
        compile_shared(build_source(*scale_schedule(3, 45), "scale", tgt), tgt)
    except FileNotFoundError:
        pytest.skip(f"no compiler for {target}")


def run(rows: int, cols: int, offset_floats: int, lanes: int, parallel: bool) -> None:
    """Build for this machine and check against numpy, the output `offset_floats` past a
    64-byte boundary (0: every vector of a 64-float row is aligned and streams)."""
    source = build_source(*scale_schedule(rows, cols, lanes, parallel), "scale", "host")
    lib = ctypes.CDLL(str(compile_shared(source, "host").path))
    fn = lib.scale
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int32
    a = np.random.default_rng(rows * cols).random((rows, cols), dtype=np.float32)
    raw = np.zeros(rows * cols + 32, np.float32)
    start = (-raw.ctypes.data % 64) // 4 + offset_floats
    out = raw[start : start + rows * cols].reshape(rows, cols)
    out.fill(np.nan)
    assert fn((ctypes.c_void_p * 2)(a.ctypes.data, out.ctypes.data)) == 0
    np.testing.assert_array_equal(out, a * np.float32(2.0))


@pytest.mark.parametrize("offset_floats", [0, 1, 4])
@pytest.mark.parametrize(("rows", "cols", "lanes"), [(5, 64, 16), (7, 45, 16), (3, 37, 8)])
@pytest.mark.parametrize("parallel", [True, False])
def test_results_match_numpy_aligned_or_not(
    rows: int, cols: int, lanes: int, offset_floats: int, parallel: bool
) -> None:
    run(rows, cols, offset_floats, lanes, parallel)


@pytest.mark.parametrize("name", ["kiln_vstream_float32x16", "kiln_stream_fence"])
def test_helper_names_are_reserved(name: str) -> None:
    with pytest.raises(CodegenError):
        check_symbol(name)

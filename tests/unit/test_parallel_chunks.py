"""The `omp_chunk` pragma on a parallel loop: `schedule(static, k)` in the C, in both places a
parallel loop is rendered (the function's one region, and a region of its own inside a serial
loop), numpy's answers on 1, 2 and 3 threads; loops without it keep `schedule(static)`."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from compiler import te, toolchain
from compiler.codegen.c import render_c
from compiler.errors import CodegenError
from compiler.lower import lower
from compiler.schedule import create_schedule
from compiler.schedule.schedule import Schedule
from compiler.te.tensor import Tensor

pytestmark = pytest.mark.usefixtures("build_cache")

ROWS, COLS = 37, 29  # odd: chunks of 3 rows leave a short last chunk


def two_stages(chunk: int | None) -> tuple[Schedule, list[Tensor]]:
    """b = 2a + 1 and c = b * b, each its own parallel loop over rows at the function's top."""
    a = te.placeholder((ROWS, COLS), name="a")
    b = te.compute((ROWS, COLS), lambda i, j: a[i, j] * 2.0 + 1.0, name="b")
    c = te.compute((ROWS, COLS), lambda i, j: b[i, j] * b[i, j], name="c")
    sch = create_schedule(c)
    for t in (b, c):
        sch[t].parallel(sch[t].axis[0])
        if chunk is not None:
            sch[t].pragma(sch[t].axis[0], "omp_chunk", chunk)
    return sch, [a, b, c]


def nested(chunk: int) -> tuple[Schedule, list[Tensor]]:
    """c = 3a over rows split by 8: a serial outer loop, a parallel inner one (its own region)."""
    a = te.placeholder((ROWS, COLS), name="a")
    c = te.compute((ROWS, COLS), lambda i, j: a[i, j] * 3.0, name="c")
    sch = create_schedule(c)
    st = sch[c]
    _, inner = st.split(st.axis[0], 8)
    st.parallel(inner)
    st.pragma(inner, "omp_chunk", chunk)
    return sch, [a, c]


def _libgomp() -> ctypes.CDLL:
    gomp = ctypes.CDLL("libgomp.so.1")
    gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
    gomp.omp_get_max_threads.restype = ctypes.c_int
    return gomp


def _run(source: str, symbol: str, arrays: list[np.ndarray]) -> None:
    lib = ctypes.CDLL(str(toolchain.compile_shared(source).path))
    fn = lib[symbol]
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int32
    pointers = (ctypes.c_void_p * len(arrays))(*(x.ctypes.data for x in arrays))
    assert fn(pointers) == 0


def test_omp_chunk_writes_a_chunked_static_schedule_and_matches_numpy() -> None:
    x = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32)
    top = render_c([(lower(*two_stages(3), "two"), "two")])
    assert top.count("#pragma omp for schedule(static, 3)") == 2  # the function's one region
    inside = render_c([(lower(*nested(2), "inner"), "inner")])
    assert "#pragma omp parallel for schedule(static, 2)" in inside
    plain = render_c([(lower(*two_stages(None), "two"), "two")])
    assert "schedule(static)" in plain and "schedule(static," not in plain
    gomp = _libgomp()
    before = gomp.omp_get_max_threads()
    try:
        for threads in (1, 2, 3):
            gomp.omp_set_num_threads(threads)
            b, c = np.zeros_like(x), np.zeros_like(x)
            _run(top, "two", [x, b, c])
            np.testing.assert_allclose(c, (2 * x + 1) ** 2, rtol=1e-6, err_msg=f"{threads}")
            c = np.zeros_like(x)
            _run(inside, "inner", [x, c])
            np.testing.assert_allclose(c, 3 * x, rtol=1e-6, err_msg=f"{threads}")
    finally:
        gomp.omp_set_num_threads(before)


@pytest.mark.parametrize("chunk", [0, -2, 1.5, "4", True])
def test_a_bad_omp_chunk_is_refused(chunk: object) -> None:
    with pytest.raises(CodegenError, match="omp_chunk"):
        render_c([(lower(*two_stages(chunk), "two"), "two")])  # type: ignore[arg-type]

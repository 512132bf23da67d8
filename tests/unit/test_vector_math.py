"""Vector exp and erf in vectorized loops, against numpy / math.erf over their whole range."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable

import numpy as np
import pytest

from compiler import te, toolchain
from compiler.build import build_source
from compiler.codegen.vector_math import vector_math_helper
from compiler.ir import expr as E
from compiler.schedule import create_schedule
from compiler.te import math as tm

pytestmark = pytest.mark.usefixtures("build_cache")

N = 4096 + 7  # a tail past the last full vector


def kernel(fn: Callable[[E.Expr], E.Expr], target: str, lanes: int = 16) -> tuple[str, str]:
    x = te.placeholder((N,), name="x")
    y = te.compute((N,), lambda i: fn(x[i]), name="y")
    s = create_schedule(y)
    _, inner = s[y].split(y.op.axis[0], lanes)
    s[y].vectorize(inner)
    return build_source(s, [x, y], "k", target=target), "k"


def run(source: str, symbol: str, xs: np.ndarray, target: str) -> np.ndarray:
    lib = ctypes.CDLL(str(toolchain.compile_shared(source, target).path))
    fn = lib[symbol]
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int32
    out = np.full(N, np.nan, np.float32)
    assert fn((ctypes.c_void_p * 2)(xs.ctypes.data, out.ctypes.data)) == 0
    return out


def inputs(low: float, high: float, specials: list[float]) -> np.ndarray:
    rng = np.random.default_rng(0)
    xs = rng.uniform(low, high, N).astype(np.float32)
    xs[: len(specials)] = specials
    return xs


TARGETS = ["x86_64-avx512", "x86_64-avx2"]


def runnable(target: str) -> bool:
    host = toolchain.host_target_name()
    return host == target or (host == "x86_64-avx512" and target == "x86_64-avx2")


@pytest.mark.parametrize("target", TARGETS)
def test_vector_exp_is_within_two_ulp(target: str) -> None:
    if not runnable(target):
        pytest.skip(f"{target} code does not run on this host")
    source, symbol = kernel(tm.exp, target)
    assert "kiln_vexp_float32x" in source and "expf(" in source  # vector body, scalar tail
    specials = [0.0, -0.0, 1.0, -1.0, 88.0, -87.0, 1e-8, -1e-8, 0.5, -0.5, 20.0, -20.0]
    xs = inputs(-87.0, 88.0, specials)
    got = run(source, symbol, xs, target)
    want = np.exp(xs.astype(np.float64))
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    assert float(np.max(np.abs(got - want) / ulp)) <= 2.0
    # softmax's masked lanes: far below the range, exp is (as good as) zero
    low = run(source, symbol, np.full(N, -np.inf, np.float32), target)
    assert float(low.max()) < 1.2e-38 and float(low.min()) >= 0.0


@pytest.mark.parametrize("target", TARGETS)
def test_vector_erf_matches_math_erf(target: str) -> None:
    if not runnable(target):
        pytest.skip(f"{target} code does not run on this host")
    source, symbol = kernel(tm.erf, target)
    assert "kiln_verf_float32x" in source
    specials = [0.0, -0.0, 1.0, -1.0, 0.999999, 1.000001, 1e-6, -1e-6, 5.0, -5.0, 30.0, -30.0]
    xs = inputs(-4.0, 4.0, specials)
    got = run(source, symbol, xs, target)
    want = np.array([math.erf(float(v)) for v in xs])
    err = np.abs(got - want)
    # absolute error within 3e-7 everywhere (5 float32 spacings below 1: the rational form's
    # rounding near |x| = 4), relative within 1e-6 where |x| < 1
    assert float(err.max()) <= 3e-7
    small = np.abs(xs) < 1
    assert float(np.max(err[small] / np.maximum(np.abs(want[small]), 1e-30))) <= 1e-6
    assert got[1] == 0.0 and math.copysign(1.0, float(got[1])) == -1.0  # erf(-0) = -0


def test_unknown_math_function_has_no_vector_form() -> None:
    with pytest.raises(ValueError, match="no vector form of 'tanh'"):
        vector_math_helper("tanh", 16)
    source, _ = kernel(tm.tanh, "x86_64-avx512")
    assert "kiln_vtanh" not in source and "tanhf(" in source  # scalar loop instead


def test_erf_coefficients_are_those_the_fit_derives() -> None:
    """The vector erf's constants come from `erf_fit` (our own fit), to float64 rounding."""
    from compiler.codegen import erf_fit, vector_math

    p, q, err = erf_fit.fit()
    assert err < 1e-7
    np.testing.assert_allclose(vector_math._ERF_P, p[::-1], rtol=1e-6)
    np.testing.assert_allclose(vector_math._ERF_Q, q[::-1], rtol=1e-6)
    assert vector_math._ERF_CLAMP == erf_fit.CLAMP

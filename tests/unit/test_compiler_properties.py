"""Property tests: random schedules (split / fuse / reorder / vectorize / unroll / compute_at) of
small computes keep their meaning (interpreter vs numpy) and compile with gcc."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import te, toolchain
from compiler.build import build_source
from compiler.ir import interpreter
from compiler.lower import lower
from compiler.schedule import Schedule, create_schedule


def _program(m: int, n: int, k: int) -> tuple[list[te.Tensor], np.ndarray, np.ndarray]:
    """bias-add + relu producer feeding a matmul: two stages to place."""
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    act = te.compute((m, k), lambda i, j: te.maximum(a[i, j] + 0.5, 0.0), name="act")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(act[i, r] * b[r, j], axis=r), name="C")
    xa = rng.standard_normal((m, k), dtype=np.float32)
    xb = rng.standard_normal((k, n), dtype=np.float32)
    return [a, b, c, act], xa, xb


@st.composite
def schedules(draw: st.DrawFn) -> tuple[Schedule, list[te.Tensor], np.ndarray, np.ndarray]:
    m, n, k = draw(st.integers(1, 9)), draw(st.integers(1, 19)), draw(st.integers(1, 6))
    (a, b, c, act), xa, xb = _program(m, n, k)
    s = create_schedule(c)
    stage = s[c]
    i, j = c.op.axis
    (r,) = c.op.reduce_axis
    io, ii = stage.split(i, draw(st.integers(1, 5)))
    jo, ji = stage.split(j, draw(st.sampled_from([1, 2, 4, 8, 3])))
    ro, ri = stage.split(r, draw(st.integers(1, 4)))
    order = draw(st.permutations([io, jo, ro, ii, ri]))
    stage.reorder(*order, ji)
    leaves = stage.leaf_iter_vars
    if draw(st.booleans()):
        # fuse two adjacent data leaves
        for x, y in itertools.pairwise(leaves):
            if x.kind is y.kind is te.IterKind.DATA and x is not ji and y is not ji:
                stage.fuse(x, y)
                break
    leaves = stage.leaf_iter_vars
    if draw(st.booleans()):
        stage.vectorize(ji)
    unrollable = [v for v in leaves if v is not ji]
    stage.unroll(draw(st.sampled_from(unrollable)))
    placement = draw(st.sampled_from(["root", "inline", "at"]))
    if placement == "inline":
        s[act].compute_inline()
    elif placement == "at":
        s[act].compute_at(stage, draw(st.sampled_from(stage.leaf_iter_vars)))
    return s, [a, b, c], xa, xb


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_random_schedules_keep_semantics(
    case: tuple[Schedule, list[te.Tensor], np.ndarray, np.ndarray],
) -> None:
    s, args, xa, xb = case
    func = lower(s, args, "f")
    out = np.full(args[2].shape, np.nan, np.float32)
    interpreter.run(func, xa, xb, out)
    expected = np.maximum(xa + np.float32(0.5), 0) @ xb
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4, err_msg=str(func))


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(toolchain.CACHE_ENV, str(cache))
        yield cache


@pytest.mark.slow
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=schedules())
def test_random_schedules_compile_with_gcc(
    build_cache: Path, case: tuple[Schedule, list[te.Tensor], np.ndarray, np.ndarray]
) -> None:
    s, args, _, _ = case
    shared = toolchain.compile_shared(build_source(s, args, "f"))
    assert shared.path.parent == build_cache
    assert shared.data[:4] == b"\x7fELF"

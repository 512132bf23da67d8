"""The reduction templates (reduce_sum, softmax, layer_norm) on several threads: a `parallel`
knob only in spaces for more than one thread, one-thread kernels unchanged, the parallel loop
over whole outputs (never a reduce axis), and numpy's answers on 1, 2 and 3 threads at odd
sizes, fewer rows than threads included."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from test_compiler_ops import check_close, reduction_length, run_built, template

from compiler.codegen.c import render_c
from compiler.ir.stmt import For, ForKind
from compiler.lower import lower
from compiler.ops.base import NO_PARALLEL, PARALLEL_KNOB, threaded_space
from compiler.ops.space import Config

pytestmark = pytest.mark.usefixtures("build_cache")

# (template, odd workloads): row sums and column sums, rows fewer than threads, tails everywhere
REDUCTIONS: dict[str, list[tuple[int, ...]]] = {
    "reduce_sum": [(37, 65, 0), (37, 65, 1), (1, 7, 0), (2, 129, 1)],
    "softmax": [(5, 37), (1, 7), (67, 130)],
    "layer_norm": [(3, 20), (2, 7), (41, 129)],
}
# The loop each template's "outer" choice runs on the threads: the output tiles' (column sums
# over j, row sums over i) or the rows'.
PARALLEL_LOOPS = {"reduce_sum": ("j_o", "i_o"), "softmax": ("r",), "layer_norm": ("r",)}
CASES = [(name, shape) for name, shapes in REDUCTIONS.items() for shape in shapes]


def _parallel_loops(name: str, shape: tuple[int, ...], config: Config) -> list[tuple[str, int]]:
    """(parallel loop's var, how many loops enclose it) of the lowered kernel."""
    found: list[tuple[str, int]] = []

    def visit(s: Any, around: int) -> None:
        if isinstance(s, For):
            if s.kind is ForKind.PARALLEL:
                found.append((s.var.name, around))
            around += 1
        for child in _children(s):
            visit(child, around)

    visit(lower(*template(name).instantiate(shape, config), "k").body, 0)
    return found


def _children(s: Any) -> list[Any]:
    out: list[Any] = []
    for value in vars(s).values() if hasattr(s, "__dict__") else ():
        for child in value if isinstance(value, list | tuple) else (value,):
            if hasattr(child, "__dict__") and not isinstance(child, type):
                out.append(child)
    return out


def _with(space: Any, knobs: dict[str, Any]) -> Config:
    return space.get(space.index_of(knobs))


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_the_parallel_knob_is_only_in_spaces_for_more_than_one_thread(
    name: str, shape: tuple[int, ...]
) -> None:
    t = template(name)
    one, two = threaded_space(t, shape, 1), threaded_space(t, shape, 3)
    assert one.knobs == t.config_space(shape).knobs  # one thread: indices and records unchanged
    assert two.knobs[:-1] == one.knobs
    assert two.knobs[-1].name == PARALLEL_KNOB and two.knobs[-1].choices == (NO_PARALLEL, "outer")
    assert len(two) == 2 * len(one)


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_none_is_the_one_thread_kernel_and_outer_runs_whole_outputs_on_the_threads(
    name: str, shape: tuple[int, ...]
) -> None:
    t = template(name)
    one, two = threaded_space(t, shape, 1), threaded_space(t, shape, 2)
    for i in (0, len(one) - 1):
        plain = one.get(i)
        serial = _with(two, {**plain, PARALLEL_KNOB: NO_PARALLEL})
        kernels = [lower(*t.instantiate(shape, c), "k") for c in (plain, serial)]
        assert render_c([(kernels[0], "k")]) == render_c([(kernels[1], "k")])
        assert "#pragma omp" not in render_c([(kernels[0], "k")])
        parallel = _with(two, {**plain, PARALLEL_KNOB: "outer"})
        loops = _parallel_loops(name, shape, parallel)
        # at most one parallel loop, outermost, over output tiles or rows: no reduction crosses
        # threads. Loop partitioning drops it where one tile covers the output (one iteration
        # and a tail), so it must be there for the smallest tiles (i == 0) of several rows.
        assert len(loops) <= 1 and {(v, 0) for v in PARALLEL_LOOPS[name]} >= set(loops)
        several = name == "reduce_sum" or shape[0] > 1
        if i == 0 and several:
            assert loops
            assert "#pragma omp" in render_c([(lower(*t.instantiate(shape, parallel), "k"), "k")])


def _gomp() -> ctypes.CDLL:
    gomp = ctypes.CDLL("libgomp.so.1")  # the runtime the kernels link (-fopenmp)
    gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
    gomp.omp_get_max_threads.restype = ctypes.c_int
    return gomp


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_parallel_reductions_match_numpy_on_1_2_3_threads(name: str) -> None:
    """Per workload, the first and last configs of the space with "outer" (every knob's
    extremes), built once and run on 1, 2 and 3 OpenMP threads."""
    t = template(name)
    cases = []
    for shape in REDUCTIONS[name]:
        space = threaded_space(t, shape, 2)
        outer = [c for c in map(space.get, range(len(space))) if c[PARALLEL_KNOB] == "outer"]
        cases += [(shape, c) for c in {id(c): c for c in (outer[0], outer[-1])}.values()]
    gomp = _gomp()
    before = gomp.omp_get_max_threads()
    try:
        for threads in (1, 2, 3):
            gomp.omp_set_num_threads(threads)
            for (shape, config), (ours, ref) in zip(
                cases, run_built(t, cases, seed=threads), strict=True
            ):
                what = f"{name} {shape} {dict(config)} on {threads} threads"
                assert np.isfinite(ours).all(), what
                check_close(ours, ref, what, reduction_length(t, shape, ref.size))
    finally:
        gomp.omp_set_num_threads(before)

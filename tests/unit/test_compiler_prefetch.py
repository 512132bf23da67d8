"""Software prefetch (`Stage.prefetch`, lower/prefetch.py) and the direct conv's `prefetch` knob:
what is prefetched is exactly what the next iteration reads, the result never changes, and a
malformed request names its cause."""

from __future__ import annotations

import ctypes
import importlib
import re

import numpy as np
import pytest

from compiler import te, toolchain
from compiler.codegen.c import render_c
from compiler.errors import LowerError, ScheduleError
from compiler.ir import interpreter
from compiler.lower import lower
from compiler.ops import get_template
from compiler.ops.base import PARALLEL_KNOB, OpTemplate, output_arrays, threaded_space
from compiler.ops.space import Config
from compiler.schedule.schedule import create_schedule

pytestmark = pytest.mark.usefixtures("build_cache")
prefetch_pass = importlib.import_module("compiler.lower.prefetch")  # the package shadows it


def _recorded(monkeypatch: pytest.MonkeyPatch, base: np.ndarray) -> list[tuple[int, int]]:
    """(start, count) of every prefetch the interpreter runs on `base`, in order."""
    seen: list[tuple[int, int]] = []

    def record(view: np.ndarray) -> None:
        start = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // (
            base.itemsize
        )
        seen.append((start, view.shape[0]))

    monkeypatch.setattr(prefetch_pass, "_no_effect", record)
    return seen


def _row_scale(rows: int, cols: int) -> tuple[te.Tensor, te.Tensor]:
    a = te.placeholder((rows, cols), name="a")
    out = te.compute((rows, cols), lambda i, j: a[i, j] * 2.0, name="out")
    return a, out


def test_each_iteration_prefetches_the_next_rows_reads_in_spread_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, out = _row_scale(5, 40)
    sch = create_schedule(out)
    i, j = sch[out].axis
    jo, _ = sch[out].split(j, 8)  # 5 pieces of a 40-element row
    sch[out].prefetch(a, i, spread=(jo,))
    data = np.arange(200, dtype=np.float32).reshape(5, 40)
    got = np.zeros((5, 40), np.float32)
    seen = _recorded(monkeypatch, data)
    interpreter.run(lower(sch, [a, out], "f"), data, got)
    np.testing.assert_array_equal(got, data * 2)
    # rows 1..4, each in five pieces of 8 in order, asked for during the row before it
    assert seen == [(row * 40 + 8 * p, 8) for row in range(1, 5) for p in range(5)]


def test_offset_looks_further_ahead_and_the_last_iterations_prefetch_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, out = _row_scale(6, 16)
    sch = create_schedule(out)
    i, _ = sch[out].axis
    sch[out].prefetch(a, i, offset=2)
    data = np.ones((6, 16), np.float32)
    seen = _recorded(monkeypatch, data)
    interpreter.run(lower(sch, [a, out], "f"), data, np.zeros_like(data))
    assert seen == [(row * 16, 16) for row in range(2, 6)]


def test_pieces_cover_a_region_their_count_does_not_divide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, out = _row_scale(3, 10)
    sch = create_schedule(out)
    i, j = sch[out].axis
    jo, _ = sch[out].split(j, 4)  # 3 iterations (4, 4, 2): pieces of 4, the last moved back
    sch[out].prefetch(a, i, spread=(jo,))
    data = np.ones((3, 10), np.float32)
    seen = _recorded(monkeypatch, data)
    interpreter.run(lower(sch, [a, out], "f"), data, np.zeros_like(data))
    assert len(seen) == 6  # rows 1 and 2, three pieces each
    for row, pieces in ((1, seen[:3]), (2, seen[3:])):
        covered = {e for s, n in pieces for e in range(s, s + n)}
        # the row, and what the loose bound of a tail adds, inside the buffer
        assert set(range(row * 10, row * 10 + 10)) <= covered <= set(range(row * 10, 30))


def test_a_stage_computed_inside_the_loop_has_its_reads_prefetched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The matmul's accumulator stage is computed at the output's row loop: the prefetch on
    that loop covers the weight rows it reads (all of b, the whole reduction), and the spread
    loops may be the accumulator stage's own."""
    m, k, n = 4, 6, 8
    a = te.placeholder((m, k), name="a")
    b = te.placeholder((k, n), name="b")
    r = te.reduce_axis((0, k), name="r")
    out = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="out")
    sch = create_schedule(out)
    acc = sch.cache_write(out, "local")
    i, _ = sch[out].axis
    sch[acc].compute_at(sch[out], i)
    r_acc = sch[acc].reduce_axis[0]
    sch[acc].reorder(r_acc, sch[acc].axis[1])  # the reduction outside the row's columns
    sch[out].prefetch(a, i, spread=(r_acc,))
    x = np.arange(m * k, dtype=np.float32).reshape(m, k)
    w = np.ones((k, n), np.float32)
    got = np.zeros((m, n), np.float32)
    seen = _recorded(monkeypatch, x)
    interpreter.run(lower(sch, [a, b, out], "f"), x, w, got)
    np.testing.assert_allclose(got, x @ w)
    assert seen == [(row * k + p, 1) for row in range(1, m) for p in range(k)]


def test_malformed_prefetches_name_their_cause() -> None:
    a, out = _row_scale(4, 8)
    sch = create_schedule(out)
    i, j = sch[out].axis
    with pytest.raises(ScheduleError, match="offset must be >= 1"):
        sch[out].prefetch(a, i, offset=0)
    with pytest.raises(ScheduleError, match="locality must be 0-3"):
        sch[out].prefetch(a, i, locality=5)
    with pytest.raises(ScheduleError, match="spread over i, which is not inside j"):
        sch[out].prefetch(a, j, spread=(i,))
    with pytest.raises(ScheduleError, match="computed, not an input"):
        sch[out].prefetch(out, i)
    with_between = create_schedule(out)
    rows, cols = with_between[out].axis
    _, cols_in = with_between[out].split(cols, 4)  # j_o will sit between rows and the spread
    ci_outer, _ = with_between[out].split(cols_in, 2)
    with_between[out].prefetch(a, rows, spread=(ci_outer,))
    with pytest.raises(LowerError, match=r"loop\(s\) j_o run between"):
        lower(with_between, [a, out], "f")
    other = te.placeholder((4, 8), name="other")
    sch[out].prefetch(other, i)  # not read by the loop: found when lowering
    with pytest.raises(LowerError, match="does not read other"):
        lower(sch, [a, other, out], "f")


CONV = (1, 32, 3, 6, 32, 3, 3, 1, 1, 2)  # 2 blocks of 16 output channels


def _conv_config(
    t: OpTemplate, shape: tuple[int, ...], threads: int = 1, **knobs: object
) -> Config:
    base: dict[str, object] = {"ic_block": 16, "oc_block": 16, "reg_n": 3, "oh_tile": 1}
    base |= {"unroll_kw": False, "oc_order": "outer", "pixels": "rows", "prefetch": True}
    if threads > 1:
        base[PARALLEL_KNOB] = "outer"
    space = threaded_space(t, shape, threads)
    return space.get(space.index_of({**base, **knobs}))


def test_the_conv_knob_prefetches_every_next_block_of_weights_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = get_template("conv2d_nchwc")
    assert isinstance(t, OpTemplate)
    config = _conv_config(t, CONV)
    sch, args = t.instantiate(CONV, config)
    rng = np.random.default_rng(0)
    logical = t.random_inputs(CONV, rng)
    arrays = [*t.pack_inputs(CONV, config, logical), *output_arrays(args)]
    weights = arrays[1]
    seen = _recorded(monkeypatch, weights)
    interpreter.run(lower(sch, args, "conv"), *arrays)
    ours = t.unpack_output(CONV, config, arrays[-1].reshape(args[-1].shape))
    np.testing.assert_allclose(ours, t.reference_for(CONV, *logical), rtol=1e-4, atol=1e-4)
    block = weights[0].size  # one output-channel block: [IC/icb][3][3][icb][ocb]
    covered = np.zeros(weights.size, bool)
    for start, count in seen:
        covered[start : start + count] = True
    assert covered[block:].all() and not covered[:block].any()
    # in pieces spread over a block's 3 x 2 pixel tiles x 2 channel blocks x 3 kernel rows
    assert len(seen) == 1 * (3 * 2 * 2 * 3)


def test_the_conv_knob_keeps_results_when_built_serial_and_parallel() -> None:
    t = get_template("conv2d_nchwc")
    assert isinstance(t, OpTemplate)
    cases = [
        (CONV, _conv_config(t, CONV)),
        (CONV, _conv_config(t, CONV, oc_order="inner", unroll_kw=True)),
        (CONV, _conv_config(t, CONV, threads=2)),  # the block loop fused into the parallel one
        ((1, 16, 7, 11, 48, 3, 3, 2, 1, 1), _conv_config(t, (1, 16, 7, 11, 48, 3, 3, 2, 1, 1))),
    ]
    funcs = []
    for n, (shape, config) in enumerate(cases):
        sch, args = t.instantiate(shape, config)
        funcs.append((lower(sch, args, f"op{n}"), f"op{n}"))
    source = render_c(funcs)
    assert source.count("__builtin_prefetch(q + i, 0, 3)") == len(
        set(re.findall(r"static inline void (kiln_prefetch_\w+)", source))
    )
    lib = ctypes.CDLL(str(toolchain.compile_shared(source).path))
    rng = np.random.default_rng(1)
    for n, (shape, config) in enumerate(cases):
        _, args = t.instantiate(shape, config)
        logical = t.random_inputs(shape, rng)
        arrays = [*t.pack_inputs(shape, config, logical), *output_arrays(args)]
        fn = lib[f"op{n}"]
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = ctypes.c_int32
        assert fn((ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))) == 0
        ours = t.unpack_output(shape, config, arrays[-1].reshape(args[-1].shape))
        np.testing.assert_allclose(ours, t.reference_for(shape, *logical), rtol=1e-4, atol=2e-4)
    assert "kiln_prefetch" in source


def test_the_knob_is_added_later_and_a_config_without_it_is_the_old_one() -> None:
    t = get_template("conv2d_nchwc")
    assert isinstance(t, OpTemplate)
    space = t.config_space(CONV)
    old: dict[str, object] = {"ic_block": 16, "oc_block": 16, "reg_n": 3, "oh_tile": 1}
    old |= {"unroll_kw": False, "oc_order": "outer", "pixels": "rows"}
    assert space.get(space.index_of(old))["prefetch"] is False
    one_block = (1, 16, 5, 5, 16, 3, 3, 1, 1, 0)  # no next block: nothing to measure
    config = t.config_space(one_block).get(
        t.config_space(one_block).index_of({**old, "reg_n": 5, "prefetch": True})
    )
    assert not t.worth_measuring(one_block, config)


def test_an_untuned_direct_conv_prefetches_where_it_has_a_next_block() -> None:
    """model_kernels.default_config turns the knob on where it is worth measuring (several
    output-channel blocks), on one thread and on two, and changes nothing else of the config
    its rule picks; one block keeps it off."""
    from compiler.graph.model_kernels import _default_in, default_config
    from compiler.ops import op_templates
    from compiler.ops.base import threaded_space

    t = op_templates()["conv2d_nchwc"]
    target = "x86_64-avx512"
    layer4 = (1, 512, 7, 7, 512, 3, 3, 1, 1, 1)
    blocks = {"ic_block": 16, "oc_block": 16}
    for threads in (1, 2):
        config = default_config(t, layer4, target, blocks, threads)
        assert config["prefetch"] is True
        space = threaded_space(t, layer4, threads)
        before = _default_in(t, layer4, target, space, blocks, threads)
        assert before["prefetch"] is False and {**before, "prefetch": True} == dict(config)
    one_block = (1, 16, 7, 7, 16, 3, 3, 1, 1, 1)
    assert default_config(t, one_block, target, blocks)["prefetch"] is False

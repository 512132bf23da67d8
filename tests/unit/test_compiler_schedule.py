"""Schedule primitives and the ScheduleErrors they raise for malformed requests."""

from __future__ import annotations

import pytest

from compiler import te
from compiler.errors import ScheduleError
from compiler.ir import ForKind
from compiler.schedule import Stage, create_schedule


def matmul_stage() -> tuple[Stage, te.Tensor]:
    a = te.placeholder((8, 4), name="A")
    b = te.placeholder((4, 8), name="B")
    k = te.reduce_axis((0, 4), name="k")
    c = te.compute((8, 8), lambda m, n: te.sum(a[m, k] * b[k, n], axis=k), name="C")
    return create_schedule(c)[c], a


def test_split_reorder_and_annotate() -> None:
    stage, _ = matmul_stage()
    m, n = stage.axis
    (k,) = stage.reduce_axis
    mo, mi = stage.split(m, 3)
    assert (mo.extent, mi.extent) == (3, 3)
    no, ni = stage.split(n, 100)  # a factor past the extent is capped
    assert (no.extent, ni.extent) == (1, 8)
    stage.reorder(mo, k, mi, ni)
    # the named axes take the positions they held, in the order given; n_o keeps its place
    assert [v.name for v in stage.leaf_iter_vars] == ["m_o", "k", "n_o", "m_i", "n_i"]
    stage.vectorize(ni)
    stage.unroll(k)
    stage.parallel(mo)
    assert stage.kinds == {ni: ForKind.VECTORIZED, k: ForKind.UNROLLED, mo: ForKind.PARALLEL}


@pytest.mark.parametrize("factor", [0, -2, 2.5, True])
def test_split_by_bad_factor(factor: object) -> None:
    stage, _ = matmul_stage()
    with pytest.raises(ScheduleError, match=r"stage C: split of axis m by .*factor must be an int"):
        stage.split(stage.axis[0], factor)  # type: ignore[arg-type]


def test_reorder_axis_not_in_stage() -> None:
    stage, _ = matmul_stage()
    other, _ = matmul_stage()
    with pytest.raises(ScheduleError, match=r"stage C: reorder of axis m, which is not a loop"):
        stage.reorder(stage.axis[1], other.axis[0])


def test_reorder_of_a_split_axis_and_repeats() -> None:
    stage, _ = matmul_stage()
    m, n = stage.axis
    stage.split(m, 2)
    with pytest.raises(ScheduleError, match="reorder of axis m, which is not a loop"):
        stage.reorder(n, m)
    with pytest.raises(ScheduleError, match="names an axis twice"):
        stage.reorder(n, n)


@pytest.mark.parametrize("primitive", ["vectorize", "parallel"])
def test_reduction_axis_cannot_run_lanes_or_threads(primitive: str) -> None:
    stage, _ = matmul_stage()
    with pytest.raises(ScheduleError, match=f"stage C: cannot {primitive}d? reduction axis k"):
        getattr(stage, primitive)(stage.reduce_axis[0])


def test_reduction_axis_can_unroll() -> None:
    stage, _ = matmul_stage()
    stage.unroll(stage.reduce_axis[0])
    assert stage.kinds[stage.reduce_axis[0]] is ForKind.UNROLLED


def test_split_after_annotate_is_refused() -> None:
    stage, _ = matmul_stage()
    stage.vectorize(stage.axis[1])
    with pytest.raises(ScheduleError, match="split of axis n, already vectorized"):
        stage.split(stage.axis[1], 4)


def test_placeholders_have_no_stage() -> None:
    stage, a = matmul_stage()
    with pytest.raises(ScheduleError, match="A has no stage"):
        create_schedule(stage.tensor)[a]
    with pytest.raises(ScheduleError, match="A is a placeholder"):
        create_schedule(a)


def test_te_rejects_malformed_computes() -> None:
    a = te.placeholder((4,), name="a")
    k = te.reduce_axis((0, 4), name="k")
    with pytest.raises(ValueError, match="must be the whole body"):
        te.compute((4,), lambda i: te.sum(a[k], axis=k) + 1.0)
    with pytest.raises(IndexError, match="a has 1 dimensions, indexed with 2"):
        te.compute((4,), lambda i: a[i, i])
    with pytest.raises(ValueError, match="range must be"):
        te.reduce_axis((1, 4))

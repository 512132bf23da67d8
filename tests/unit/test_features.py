"""Knob features (vectorized digits, numeric and one-hot columns) and loop-IR curve features."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compiler import ops
from compiler.lower import lower
from compiler.ops.space import ConfigSpace, Knob
from tuner.search.features import (
    FEATURE_PASSES,
    FEATURE_VERSION,
    LOOP_FEATURE_LENGTH,
    digits,
    indices_of,
    knob_feature_width,
    knob_features,
    loop_features,
)

DENSE_A = (64, 64, 64)
DENSE_B = (96, 96, 96)
CONV = (1, 32, 9, 9, 32, 3, 3, 1, 1, 0)


def _mixed_space() -> ConfigSpace:
    return ConfigSpace(
        [
            Knob("tile", (1, 2, 4, 8)),
            Knob("flag", (True, False)),
            Knob("order", ("ab", "ba", "abc")),
            Knob("single", (16,)),
        ]
    )


def test_digits_match_space_get_and_invert() -> None:
    space = ops.get_template("conv2d_nchwc").config_space(CONV)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(space), size=200)
    d = digits(space, idx)
    for row, i in zip(d, idx, strict=True):
        config = space.get(int(i))
        expect = [k.choices.index(config[k.name]) for k in space.knobs]
        assert list(row) == expect
    assert np.array_equal(indices_of(space, d), idx)


def test_knob_features_columns() -> None:
    space = _mixed_space()
    # numeric knobs: 2 columns each; bool and string knobs: one-hot.
    assert knob_feature_width(space) == 2 + 2 + 3 + 2
    idx = np.arange(len(space))
    x = knob_features(space, idx)
    assert x.shape == (len(space), knob_feature_width(space))
    assert x.dtype == np.float32
    for i in (0, 7, len(space) - 1):
        c = space.get(i)
        row = x[i]
        assert row[0] == pytest.approx(math.log2(c["tile"] + 1))
        assert row[1] == (1, 2, 4, 8).index(c["tile"])
        assert list(row[2:4]) == [float(c["flag"] is v) for v in (True, False)]
        assert list(row[4:7]) == [float(c["order"] == v) for v in ("ab", "ba", "abc")]
        assert row[7] == pytest.approx(math.log2(17))
        assert row[8] == 0.0
    assert len({tuple(r) for r in x}) == len(space)  # distinct configs, distinct features


def test_knob_features_huge_space_is_not_materialized() -> None:
    space = ConfigSpace([Knob(f"k{j}", tuple(range(1, 11))) for j in range(9)])  # 10^9 configs
    idx = np.asarray([0, 123_456_789, len(space) - 1], dtype=np.int64)
    x = knob_features(space, idx)
    assert x.shape == (3, 18)
    assert list(digits(space, idx)[1]) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert np.isfinite(x).all()


def test_knob_features_reject_outside_indices() -> None:
    space = _mixed_space()
    with pytest.raises(IndexError, match="config indices"):
        knob_features(space, np.asarray([len(space)]))
    with pytest.raises(IndexError, match="config indices"):
        knob_features(space, np.asarray([-1]))


def _loop(op: str, shape: tuple[int, ...], config: dict[str, object] | int) -> np.ndarray:
    t = ops.get_template(op)
    space = t.config_space(shape)
    c = space.get(config if isinstance(config, int) else space.index_of(config))
    sch, args = t.instantiate(shape, c)
    func = lower(sch, args, name="f", passes=FEATURE_PASSES)
    return loop_features(func, t.flop(shape))


def test_loop_features_fixed_length_across_workloads_and_templates() -> None:
    assert FEATURE_VERSION >= 1
    vectors = [
        _loop("dense", DENSE_A, 0),
        _loop("dense", DENSE_B, 5),
        _loop("conv2d_nchwc", CONV, 0),
        _loop("conv2d_nchwc", CONV, 3),
    ]
    for v in vectors:
        assert v.shape == (LOOP_FEATURE_LENGTH,)
        assert v.dtype == np.float32
        assert np.isfinite(v).all()
    assert not np.array_equal(vectors[0], vectors[2])  # dense and conv differ


def test_loop_features_follow_the_loop_nest() -> None:
    space = ops.get_template("dense").config_space(DENSE_A)
    base = dict(space.get(0))
    ref = _loop("dense", DENSE_A, base)
    for knob, value in (("mr", 4), ("unroll_k", 2), ("nr", 32)):
        other = _loop("dense", DENSE_A, {**base, knob: value})
        assert not np.array_equal(ref, other), knob
    # the register tile: the local allocation grows with mr (feature 4: log2 local bytes)
    bigger = _loop("dense", DENSE_A, {**base, "mr": 4})
    assert bigger[4] > ref[4]

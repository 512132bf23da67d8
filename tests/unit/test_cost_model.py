"""The XGBoost cost model: learns a known ranking, both objectives, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.search.cost_model import CostModel, NotFittedError, normalized_throughput


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def _truth(x: np.ndarray) -> np.ndarray:
    return 2.0 * x[:, 0] + np.sin(3.0 * x[:, 1]) - x[:, 2] * x[:, 3]


@pytest.mark.parametrize("objective", ["rank", "reg"])
def test_fitted_model_ranks_held_out_points(objective: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(size=(600, 8)).astype(np.float32)
    truth = _truth(x)
    noisy = truth + 0.05 * rng.normal(size=truth.size)
    y = (noisy - noisy.min()) / (noisy.max() - noisy.min())
    model = CostModel(objective, seed=0)  # type: ignore[arg-type]
    assert not model.fitted
    model.fit(x[:300], y[:300])
    assert model.fitted
    scores = model.predict(x[300:])
    assert scores.shape == (300,)
    assert _spearman(scores, truth[300:]) > 0.8


def test_same_seed_same_model() -> None:
    rng = np.random.default_rng(2)
    x = rng.uniform(size=(100, 4)).astype(np.float32)
    y = x[:, 0]
    a, b = CostModel(seed=3), CostModel(seed=3)
    a.fit(x, y)
    b.fit(x, y)
    assert np.array_equal(a.predict(x), b.predict(x))


def test_rank_with_groups_learns_within_group_order() -> None:
    rng = np.random.default_rng(4)
    x = rng.uniform(size=(400, 3)).astype(np.float32)
    # Two groups on different scales: only the order inside each group is meaningful.
    y = np.concatenate([x[:200, 0], 100.0 + x[200:, 0]])
    model = CostModel("rank")
    model.fit(x, normalized_throughput(y, [200, 200]), groups=[200, 200])
    test = rng.uniform(size=(200, 3)).astype(np.float32)
    assert _spearman(model.predict(test), test[:, 0]) > 0.8


def test_predict_before_fit_and_bad_input() -> None:
    model = CostModel()
    with pytest.raises(NotFittedError, match="before fit"):
        model.predict(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="objective"):
        CostModel("huber")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="x \\[n, d\\] and y \\[n\\]"):
        model.fit(np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="at least one sample"):
        model.fit(np.zeros((0, 2)), np.zeros(0))
    with pytest.raises(ValueError, match="finite"):
        model.fit(np.asarray([[np.nan, 1.0]]), np.zeros(1))
    with pytest.raises(ValueError, match="group sizes"):
        model.fit(np.zeros((3, 2)), np.zeros(3), groups=[2])
    model.fit(np.eye(3), np.arange(3.0))
    with pytest.raises(ValueError, match="predict needs"):
        model.predict(np.zeros((2, 5)))


def test_normalized_throughput() -> None:
    y = normalized_throughput(np.asarray([2.0, 4.0, 0.0, 1.0, 3.0, np.inf]), [3, 3])
    assert list(y) == [0.5, 1.0, 0.0, 1.0 / 3.0, 1.0, 0.0]
    assert list(normalized_throughput(np.zeros(3))) == [0.0, 0.0, 0.0]

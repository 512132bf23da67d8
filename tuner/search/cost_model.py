"""The statistical cost model: XGBoost over config features, scoring candidates by speed.

AutoTVM's choice: a pairwise ranking objective, because the search only needs the order of
candidates, with one query group per task (per workload when pretraining across workloads);
squared-error regression on normalized throughput is the option. Training is single-threaded
(`nthread=1`): the other core builds and measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import xgboost as xgb

Objective = Literal["rank", "reg"]
_OBJECTIVES = {"rank": "rank:pairwise", "reg": "reg:squarederror"}


class NotFittedError(RuntimeError):
    """predict() was called before fit()."""


def normalized_throughput(
    throughput: np.ndarray, groups: Sequence[int] | None = None
) -> np.ndarray:
    """Throughput over the best of its group (failures 0 stay 0); all-zero groups stay 0.

    Args:
        throughput: flop/s (or any higher-is-faster measure) per sample; 0 for failures.
        groups: sizes of consecutive groups (default: one group of every sample).
    """
    y = np.asarray(throughput, dtype=np.float64).copy()
    y[~np.isfinite(y) | (y < 0)] = 0.0
    start = 0
    for size in groups if groups is not None else [len(y)]:
        part = y[start : start + size]
        top = part.max() if size else 0.0
        if top > 0:
            y[start : start + size] = part / top
        start += size
    return y


class CostModel:
    """XGBoost cost model: `fit(X, y)` on normalized throughput, `predict(X)` higher = faster.

    Args:
        objective: "rank" (pairwise ranking, default) or "reg" (squared error).
        seed: the booster's seed; the same data and seed give the same model.
        n_rounds: boosting rounds.
        max_depth: depth of each tree.
        eta: learning rate.
        rank_top_k: "rank" trains on every pair that involves one of the `rank_top_k` best
            samples of a group (XGBoost's "topk" pair method): the order near the top is what
            the search needs, and all pairs of the top stay cheap to train.
    """

    def __init__(
        self,
        objective: Objective = "rank",
        seed: int = 0,
        n_rounds: int = 150,
        max_depth: int = 6,
        eta: float = 0.25,
        rank_top_k: int = 64,
    ) -> None:
        if objective not in _OBJECTIVES:
            raise ValueError(f"objective must be one of {sorted(_OBJECTIVES)}, got {objective!r}")
        self.objective = objective
        self.seed = seed
        self.n_rounds = n_rounds
        self._params = {
            "objective": _OBJECTIVES[objective],
            "max_depth": max_depth,
            "eta": eta,
            "gamma": 1e-4,
            "min_child_weight": 1,
            "subsample": 1.0,
            "nthread": 1,
            "seed": seed,
            "verbosity": 0,
            "tree_method": "hist",
        }
        if objective == "rank":
            self._params["lambdarank_pair_method"] = "topk"
            self._params["lambdarank_num_pair_per_sample"] = rank_top_k
        self._booster: xgb.Booster | None = None
        self._width: int | None = None

    @property
    def fitted(self) -> bool:
        return self._booster is not None

    def fit(self, x: np.ndarray, y: np.ndarray, groups: Sequence[int] | None = None) -> None:
        """Train on features `x` [n, d] and normalized throughput `y` [n] (higher = faster).

        Args:
            x: features.
            y: targets; for "rank" only their order within a group matters.
            groups: sizes of consecutive query groups, summing to n (default: one group).

        Raises:
            ValueError: shapes disagree, there are no samples, or values are not finite.
        """
        x = np.asarray(x, dtype=np.float32)
        y = np.asarray(y, dtype=np.float32)
        if x.ndim != 2 or y.shape != (x.shape[0],):
            raise ValueError(f"fit needs x [n, d] and y [n], got {x.shape} and {y.shape}")
        if x.shape[0] == 0:
            raise ValueError("fit needs at least one sample")
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            raise ValueError("fit needs finite features and targets")
        dtrain = xgb.DMatrix(x, label=y, nthread=1)
        if self.objective == "rank":
            sizes = list(groups) if groups is not None else [x.shape[0]]
            if sum(sizes) != x.shape[0]:
                raise ValueError(f"group sizes sum to {sum(sizes)}, not {x.shape[0]} samples")
            dtrain.set_group(sizes)
        self._booster = xgb.train(self._params, dtrain, num_boost_round=self.n_rounds)
        self._width = x.shape[1]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Scores [n] (float64) of features `x` [n, d]; higher means predicted faster.

        Raises:
            NotFittedError: the model was never fitted.
            ValueError: `x` has another width than the training features.
        """
        if self._booster is None:
            raise NotFittedError("CostModel.predict called before fit: no model trained yet")
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self._width:
            raise ValueError(f"predict needs x [n, {self._width}], got {x.shape}")
        if x.shape[0] == 0:
            return np.zeros(0)
        return self._booster.inplace_predict(x).astype(np.float64)

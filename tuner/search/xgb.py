"""The model-guided searcher: an XGBoost cost model proposes each batch (AutoTVM's tuner).

Ask/tell, like `RandomSearch`. Until `min_ok` results succeeded, configs come at random (or the
transfer model's top picks, which then take every other pick up to `transfer_until` successes);
then the cost model is fitted on every result told so far, a plan
of the `plan_size` best-scored configs never proposed is made (every unmeasured config scored
when the space is small, parallel simulated annealing otherwise), and the plan is handed out in
order with an `epsilon` share of random picks. The model is refitted when the plan is used up
or `refit_every` new results came in since the last fit: by default every 8 results (a batch)
in small spaces, where a fit plus scoring every config costs tens of milliseconds, and every
`plan_size` results in large ones, where each plan costs an annealing run. No config is proposed
twice, including those only told (a resumed run) or excluded.

Extra features (`config_features`, a GPU candidate's threads, shared memory, occupancy...:
`tuner.search.gpu_features`) cost a lowering per config, too much to score every candidate
annealing visits: a second model fitted on knob and extra features reorders the
`rerank` x `plan_size` best of the knob model's plan, and the plan is its `plan_size` best.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from compiler.ops.space import ConfigSpace
from tuner.measure import MeasureResult
from tuner.search.annealing import SimulatedAnnealing
from tuner.search.cost_model import CostModel, Objective, normalized_throughput
from tuner.search.features import knob_features

_LOG = logging.getLogger(__name__)

# Below this many configs every unmeasured config is scored: cheaper and better than SA.
EXHAUSTIVE_LIMIT = 20_000
# Results between refits in small spaces (one batch): refitting there is cheap.
SMALL_SPACE_REFIT = 8
# Random draws tried for one random pick in a large space before giving up.
_RANDOM_TRIES = 2_000

TransferScore = Callable[[np.ndarray], np.ndarray]
# index array -> extra feature columns [n, d] of those configs
ConfigFeatures = Callable[[np.ndarray], np.ndarray]
# Candidates the model over extra features reorders, in plans: each costs one lowering per process.
RERANK = 4


class XGBSearcher:
    """Searcher whose batches come from a cost model over knob features.

    Args:
        space: the task's config space.
        flop: floating-point operations of one run (throughput = flop / median_s); None ranks
            by 1 / median_s, the same order.
        seed: seeds every random choice, the model and the annealer.
        objective: the cost model's objective, "rank" or "reg".
        epsilon: share of random picks among model-guided ones.
        plan_size: configs planned per model fit.
        valid: index -> bool; configs for which it is False are never proposed.
        transfer: scores [n] of an index array by a model pretrained on other workloads; its
            top picks replace the first random batches, and then take every other pick until
            `transfer_until` results succeeded.
        min_ok: successful results needed before the model takes over.
        transfer_sample: candidates the transfer model scores.
        transfer_until: successful results after which the transfer model stops guiding.
        n_chains: annealing chains (large spaces).
        sa_steps: most annealing steps per plan.
        refit_every: new results after which the model is refitted (default: 8 in spaces
            scored exhaustively, `plan_size` in annealed ones).
        config_features: extra feature columns of configs (see the module doc); None: knob
            features alone.
        rerank: with `config_features`, the knob model's `rerank` x `plan_size` best configs
            are reordered by the model over knob and extra features.
    """

    def __init__(
        self,
        space: ConfigSpace,
        flop: float | None = None,
        seed: int = 0,
        objective: Objective = "rank",
        epsilon: float = 0.05,
        plan_size: int = 64,
        valid: Callable[[int], bool] | None = None,
        transfer: TransferScore | None = None,
        min_ok: int = 8,
        transfer_sample: int = 256,
        n_chains: int = 256,
        sa_steps: int = 500,
        refit_every: int | None = None,
        transfer_until: int = 32,
        config_features: ConfigFeatures | None = None,
        rerank: int = RERANK,
    ) -> None:
        if len(space) < 1:
            raise ValueError("the config space is empty")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
        if plan_size < 1 or min_ok < 1 or (refit_every is not None and refit_every < 1):
            raise ValueError("plan_size, min_ok and refit_every must be at least 1")
        self.space = space
        self.flop = flop
        self.epsilon = epsilon
        self.plan_size = plan_size
        self.min_ok = min_ok
        self.transfer_sample = transfer_sample
        self.transfer_until = transfer_until
        self._transfer_turn = False
        self._valid = valid
        self._transfer = transfer
        self._rng = np.random.default_rng(seed)
        self._model = CostModel(objective, seed=seed)
        self._config_features = config_features
        self._rerank = max(1, rerank)
        self._extra_model = CostModel(objective, seed=seed) if config_features else None
        self._sa = SimulatedAnnealing(space, n_chains=n_chains, n_steps=sa_steps, seed=seed)
        self._proposed: set[int] = set()
        self._results: dict[int, float] = {}  # index -> throughput, 0 for failures
        self._plan: list[int] = []
        self._transfer_plan: list[int] | None = None
        self._fitted_at = -1  # results count at the last fit
        self._valid_cache: dict[int, bool] = {}
        self._small = len(space) <= EXHAUSTIVE_LIMIT
        self.refit_every = refit_every or (SMALL_SPACE_REFIT if self._small else plan_size)
        self._order: np.ndarray | None = None  # small spaces: every valid index, shuffled
        self._cursor = 0
        self.model_seconds = 0.0  # fit + plan (SA or exhaustive scoring) + transfer scoring
        self.fits = 0

    # -- Searcher protocol ----------------------------------------------------------------

    def ask(self, n: int) -> list[int]:
        """Up to n valid config indices never proposed, told or excluded before."""
        out: list[int] = []
        while len(out) < n:
            idx = self._next()
            if idx is None:
                break
            self._proposed.add(idx)
            out.append(idx)
        return out

    def tell(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        """Learn results; indices never asked (a resumed run's records) are excluded too."""
        if len(indices) != len(results):
            raise ValueError(f"tell got {len(indices)} indices and {len(results)} results")
        for i, r in zip(indices, results, strict=True):
            i = int(i)
            self._proposed.add(i)
            ok = r.ok and r.median_s > 0
            self._results[i] = ((self.flop or 1.0) / r.median_s) if ok else 0.0

    def exclude(self, indices: Sequence[int]) -> None:
        """Never propose these (e.g. measured by an earlier run whose results are lost)."""
        self._proposed.update(int(i) for i in indices)

    @property
    def n_ok(self) -> int:
        return sum(t > 0 for t in self._results.values())

    # -- choosing -------------------------------------------------------------------------

    def _is_valid(self, idx: int) -> bool:
        if self._valid is None:
            return True
        ok = self._valid_cache.get(idx)
        if ok is None:
            ok = self._valid_cache[idx] = bool(self._valid(idx))
        return ok

    def _valid_order(self) -> np.ndarray:
        if self._order is None:
            every = self._rng.permutation(len(self.space))
            self._order = np.asarray([i for i in every if self._is_valid(int(i))], np.int64)
        return self._order

    def _random(self) -> int | None:
        if self._small:
            order = self._valid_order()
            while self._cursor < order.size:
                idx = int(order[self._cursor])
                self._cursor += 1
                if idx not in self._proposed:
                    return idx
            return None
        for _ in range(_RANDOM_TRIES):
            idx = int(self._rng.integers(len(self.space)))
            if idx not in self._proposed and self._is_valid(idx):
                return idx
        return None

    def _next(self) -> int | None:
        if self.n_ok < self.min_ok:
            if self._transfer is not None:
                idx = self._pop(self._transfer_candidates())
                if idx is not None:
                    return idx
            return self._random()
        if self._transfer is not None and self.n_ok < self.transfer_until:
            self._transfer_turn = not self._transfer_turn
            if self._transfer_turn:
                idx = self._pop(self._transfer_candidates())
                if idx is not None:
                    return idx
        if self._rng.random() < self.epsilon:
            idx = self._random()
            if idx is not None:
                return idx
        if self._refit_due() or not self._live_plan():
            self._replan()
        idx = self._pop(self._plan)
        return idx if idx is not None else self._random()

    def _refit_due(self) -> bool:
        return len(self._results) - self._fitted_at >= min(self.refit_every, self.plan_size)

    def _live_plan(self) -> bool:
        while self._plan and self._plan[0] in self._proposed:
            self._plan.pop(0)
        return bool(self._plan)

    def _pop(self, plan: list[int]) -> int | None:
        while plan:
            idx = plan.pop(0)
            if idx not in self._proposed:
                return idx
        return None

    def _transfer_candidates(self) -> list[int]:
        if self._transfer_plan is None:
            assert self._transfer is not None
            cursor = self._cursor
            picks: list[int] = []
            for _ in range(self.transfer_sample):
                idx = self._random()
                if idx is None:
                    break
                picks.append(idx)
            self._cursor = cursor  # small spaces: later random picks may take them again
            if not picks:
                self._transfer_plan = []
                return self._transfer_plan
            start = time.perf_counter()
            scores = np.asarray(self._transfer(np.asarray(picks, np.int64)), np.float64)
            self.model_seconds += time.perf_counter() - start
            order = np.argsort(-scores, kind="stable")
            self._transfer_plan = [picks[i] for i in order]
        return self._transfer_plan

    def _replan(self) -> None:
        start = time.perf_counter()
        idx = np.fromiter(self._results, dtype=np.int64, count=len(self._results))
        y = normalized_throughput(np.fromiter(self._results.values(), np.float64, idx.size))
        knobs = knob_features(self.space, idx)
        self._model.fit(knobs, y)
        if self._extra_model is not None:
            self._extra_model.fit(self._with_extra(knobs, idx), y)
        self.fits += 1
        self._fitted_at = len(self._results)

        def score(cands: np.ndarray) -> np.ndarray:
            return self._model.predict(knob_features(self.space, cands))

        wanted = self.plan_size * (self._rerank if self._extra_model is not None else 1)
        if self._small:
            order = self._valid_order()
            left = order[[int(i) not in self._proposed for i in order]] if order.size else order
            if left.size:
                scores = score(left)
                best = np.argsort(-scores, kind="stable")[:wanted]
                self._plan = [int(i) for i in left[best]]
            else:
                self._plan = []
        else:
            self._plan = self._sa.search(
                score, wanted, exclude=self._proposed, valid=self._is_valid
            )
        if self._extra_model is not None and self._plan:
            plan = np.asarray(self._plan, dtype=np.int64)
            x = self._with_extra(knob_features(self.space, plan), plan)
            best = np.argsort(-self._extra_model.predict(x), kind="stable")[: self.plan_size]
            self._plan = [int(i) for i in plan[best]]
        self.model_seconds += time.perf_counter() - start
        _LOG.debug("refit %d on %d results: plan of %d", self.fits, idx.size, len(self._plan))

    def _with_extra(self, knobs: np.ndarray, indices: np.ndarray) -> np.ndarray:
        assert self._config_features is not None
        extra = np.asarray(self._config_features(indices), dtype=np.float32)
        return np.hstack([knobs, extra.reshape(len(indices), -1)])

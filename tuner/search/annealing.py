"""Parallel simulated annealing over a config space, vectorized over chains with numpy.

AutoTVM's `sa_model_optimizer`: many chains walk the space at once; a step changes one random
knob of every chain to another of its choices, and a move is accepted by the Metropolis rule
exp((new - old) / T) with the temperature falling linearly from `t0` to 0 over the steps. The
score function sees a whole array of indices per step. The best `k` distinct indices seen that
are neither excluded nor invalid are kept; the chains' states persist between calls, so each
batch starts where the last one stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import numpy as np

from compiler.ops.space import ConfigSpace
from tuner.search.features import digits, indices_of

_LOG = logging.getLogger(__name__)

ScoreFn = Callable[[np.ndarray], np.ndarray]


class SimulatedAnnealing:
    """Parallel annealer over `space` whose chains persist between `search` calls.

    Args:
        space: the config space.
        n_chains: chains walked in parallel.
        n_steps: most steps of one `search`.
        t0: the starting temperature, in units of the score.
        early_stop: stop a search when the top-k has not changed for this many steps.
        seed: seeds the chains' start and every move.
    """

    def __init__(
        self,
        space: ConfigSpace,
        n_chains: int = 256,
        n_steps: int = 500,
        t0: float = 1.0,
        early_stop: int = 50,
        seed: int = 0,
    ) -> None:
        if n_chains < 1 or n_steps < 1 or early_stop < 1:
            raise ValueError("n_chains, n_steps and early_stop must be at least 1")
        self.space = space
        self.n_chains = n_chains
        self.n_steps = n_steps
        self.t0 = t0
        self.early_stop = early_stop
        self._rng = np.random.default_rng(seed)
        self._radix = np.asarray([len(k.choices) for k in space.knobs], dtype=np.int64)
        self._movable = np.flatnonzero(self._radix > 1)
        self._state: np.ndarray | None = None  # [chains] indices
        self.steps_run = 0  # steps of the last search

    def _random_indices(self, n: int) -> np.ndarray:
        d = self._rng.integers(0, self._radix, size=(n, len(self._radix)))
        return indices_of(self.space, d)

    def search(
        self,
        score: ScoreFn,
        k: int,
        exclude: Collection[int] = (),
        valid: Callable[[int], bool] | None = None,
    ) -> list[int]:
        """The best `k` distinct indices seen (best first), none excluded and all valid.

        Args:
            score: scores [n] (higher is better) of an int64 index array [n].
            k: how many to keep.
            exclude: indices never to return (measured or already proposed).
            valid: checked only for indices that would enter the top-k.

        Returns:
            Up to k indices, best score first; fewer when the walk met fewer eligible ones.
        """
        if k < 1:
            return []
        if self._state is None:
            self._state = self._random_indices(self.n_chains)
        state = self._state
        cur = np.asarray(score(state), dtype=np.float64)
        top: dict[int, float] = {}
        checked: dict[int, bool] = {}

        def offer(idx: np.ndarray, scores: np.ndarray) -> bool:
            floor = min(top.values()) if len(top) >= k else -np.inf
            changed = False
            for p in np.flatnonzero(scores > floor):
                i = int(idx[p])
                if i in top or i in exclude:
                    continue
                ok = checked.get(i)
                if ok is None:
                    ok = checked[i] = valid(i) if valid is not None else True
                if not ok:
                    continue
                if len(top) >= k:
                    worst = min(top, key=top.__getitem__)
                    if top[worst] >= scores[p]:
                        continue
                    del top[worst]
                top[i] = float(scores[p])
                changed = True
            return changed

        offer(state, cur)
        still = 0
        steps = 0
        if self._movable.size:
            for step in range(self.n_steps):
                steps += 1
                temp = self.t0 * (1.0 - step / self.n_steps)
                d = digits(self.space, state)
                rows = np.arange(state.size)
                knob = self._movable[self._rng.integers(0, self._movable.size, size=state.size)]
                shift = self._rng.integers(1, self._radix[knob])  # never 0: another choice
                d[rows, knob] = (d[rows, knob] + shift) % self._radix[knob]
                cand = indices_of(self.space, d)
                new = np.asarray(score(cand), dtype=np.float64)
                with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                    prob = np.exp(np.minimum((new - cur) / max(temp, 1e-12), 0.0))
                accept = (new >= cur) | (self._rng.random(state.size) < prob)
                state = np.where(accept, cand, state)
                cur = np.where(accept, new, cur)
                still = 0 if offer(cand, new) else still + 1
                if still >= self.early_stop:
                    break
        self._state = state
        self.steps_run = steps
        _LOG.debug("SA: %d steps, %d kept", steps, len(top))
        return sorted(top, key=lambda i: (-top[i], i))

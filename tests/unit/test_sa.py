"""Parallel simulated annealing: finds a known optimum, respects exclude/valid, bounded steps."""

from __future__ import annotations

import numpy as np

from compiler.ops.space import ConfigSpace, Knob
from tuner.search.annealing import SimulatedAnnealing
from tuner.search.features import digits

# 10^6 configs: too many to enumerate in a test, few enough to check answers exactly.
SPACE = ConfigSpace([Knob(f"k{j}", tuple(range(10))) for j in range(6)])
TARGET = np.asarray([3, 7, 1, 9, 0, 5])
ARGMAX = int("371905")


def _score(idx: np.ndarray) -> np.ndarray:
    # Separable peak at TARGET: the chains must climb every knob.
    return -np.abs(digits(SPACE, idx) - TARGET).sum(axis=1).astype(np.float64)


def test_finds_argmax_far_more_often_than_random() -> None:
    found = 0
    for seed in range(4):
        sa = SimulatedAnnealing(SPACE, n_chains=128, n_steps=300, t0=1.0, seed=seed)
        top = sa.search(_score, k=8)
        assert len(top) == 8
        assert sa.steps_run <= 300
        found += top[0] == ARGMAX
    # Random sampling of the same number of scored points (128 * 300) finds this one config
    # with probability ~ 1 - (1 - 1e-6)^38400 ~ 0.04 per run.
    assert found >= 3


def test_top_k_is_the_best_distinct_and_excludes() -> None:
    exclude = {ARGMAX, ARGMAX + 1}  # 371906 is one of the next best (distance 1)
    sa = SimulatedAnnealing(SPACE, n_chains=128, n_steps=300, seed=1)
    top = sa.search(_score, k=6, exclude=exclude)
    assert len(top) == len(set(top)) == 6
    assert not exclude & set(top)
    scores = _score(np.asarray(top))
    assert list(scores) == sorted(scores, reverse=True)
    assert scores[0] == -1.0  # a neighbour of the excluded optimum


def test_valid_filter_and_chain_state_persists() -> None:
    def odd(i: int) -> bool:
        return i % 2 == 1

    sa = SimulatedAnnealing(SPACE, n_chains=64, n_steps=100, seed=2)
    first = sa.search(_score, k=10, valid=odd)
    assert first and all(odd(i) for i in first)
    assert sa._state is not None  # the persisted chains are the point of the test
    state = sa._state.copy()
    second = sa.search(_score, k=10, exclude=set(first), valid=odd)
    assert not set(first) & set(second)
    # The second search starts from where the first stopped: its start scores beat random.
    assert _score(state).mean() > _score(np.arange(0, len(SPACE), 7919)).mean()


def test_early_stop_and_determinism() -> None:
    flat = SimulatedAnnealing(SPACE, n_chains=32, n_steps=1000, early_stop=5, seed=3)
    top = flat.search(lambda idx: np.zeros(idx.size), k=4)  # nothing ever beats the first 4
    assert len(top) == 4
    assert flat.steps_run == 5
    a = SimulatedAnnealing(SPACE, n_chains=32, n_steps=50, seed=9).search(_score, k=5)
    b = SimulatedAnnealing(SPACE, n_chains=32, n_steps=50, seed=9).search(_score, k=5)
    assert a == b


def test_single_choice_space() -> None:
    space = ConfigSpace([Knob("a", (1,)), Knob("b", (2,))])
    sa = SimulatedAnnealing(space, n_chains=4, n_steps=10)
    assert sa.search(lambda idx: np.ones(idx.size), k=3) == [0]
    assert sa.search(lambda idx: np.ones(idx.size), k=3, exclude={0}) == []

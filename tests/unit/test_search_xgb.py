"""XGBSearcher: no repeats, validity, resume, refit cadence, and it beats random search.

Throughput here is a known function of the config (measurement itself is tested with the
runners); these tests check the search mechanics and that the model exploits structure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from compiler.artifact import Artifact, Entry
from compiler.ops.space import ConfigSpace, Knob
from tuner.loop import tune
from tuner.measure import MeasureResult, Status
from tuner.measure.builder import BuildResult
from tuner.measure.fake_runner import FakeRunner
from tuner.options import TuneOptions
from tuner.records import Workload
from tuner.search import RandomSearch, Searcher
from tuner.search import xgb as model_search
from tuner.search.annealing import SimulatedAnnealing
from tuner.search.features import digits
from tuner.search.xgb import XGBSearcher
from tuner.task import Task

SMALL = ConfigSpace(
    [
        Knob("a", (1, 2, 4, 8, 16, 32)),
        Knob("b", (1, 2, 3, 4, 5, 6, 7, 8)),
        Knob("c", (True, False)),
        Knob("d", ("x", "y", "z")),
        Knob("e", (0, 1, 2, 3, 4)),
    ]
)  # 1440 configs: scored exhaustively
LARGE = ConfigSpace([Knob(f"k{j}", tuple(range(8))) for j in range(8)])  # 16.7M: annealing
# SMALL without its last knob: 288 configs, exhausted in a fifth of the refits. With _pop's
# guard removed, the transfer test below proposes 304 configs here, 197 of them distinct.
EXHAUSTED = ConfigSpace(SMALL.knobs[:-1])


def _peak(space: ConfigSpace, seed: int) -> Callable[[int], float]:
    """Seconds per run of a config: fastest at a random target, slower with digit distance."""
    rng = np.random.default_rng(seed)
    target = rng.integers(0, [len(k.choices) for k in space.knobs])

    def seconds(index: int) -> float:
        d = digits(space, np.asarray([index]))[0]
        return float(1.0 + np.abs(d - target).sum() ** 1.5)

    return seconds


def _ok(seconds: float) -> MeasureResult:
    return MeasureResult(Status.OK, samples_s=(seconds,))


def _trials_to_best(
    searcher: Searcher, seconds: Callable[[int], float], best: float, budget: int
) -> int:
    for trial in range(0, budget, 8):
        batch = searcher.ask(8)
        times = [seconds(i) for i in batch]
        searcher.tell(batch, [_ok(t) for t in times])
        if min(times) <= best:
            return trial + batch.index(batch[int(np.argmin(times))]) + 1
    return budget + 1


def test_never_repeats_and_exhausts_the_valid_space() -> None:
    def valid(i: int) -> bool:
        return i % 3 != 0

    # 192 valid configs, more than a plan of 128 (SMALL's 960 took 19 s for the same checks)
    s = XGBSearcher(EXHAUSTED, seed=1, valid=valid, plan_size=128)
    seconds = _peak(EXHAUSTED, 1)
    seen: list[int] = []
    for _ in range(50):  # bounded: 192 valid configs in batches of 8 is 24 asks
        batch = s.ask(8)
        if not batch:
            break
        seen.extend(batch)
        s.tell(batch, [_ok(seconds(i)) for i in batch])
    assert len(seen) == len(set(seen)) == sum(valid(i) for i in range(len(EXHAUSTED)))
    assert all(valid(i) for i in seen)
    assert s.ask(8) == []
    assert s.fits >= 1


def test_resumed_results_and_exclusions_are_never_proposed() -> None:
    seconds = _peak(SMALL, 2)
    earlier = list(range(0, len(SMALL), 3))  # a resumed run's records: never asked here
    s = XGBSearcher(SMALL, seed=2, plan_size=32)
    s.tell(earlier, [_ok(seconds(i)) for i in earlier])
    s.exclude([1, 2])
    assert s.n_ok == len(earlier)
    proposed = [i for _ in range(30) for i in s.ask(8)]
    assert len(proposed) == len(set(proposed)) == 240
    assert not set(proposed) & {*earlier, 1, 2}
    assert s.fits >= 1  # enough results told: the model chose from the first ask


def test_refit_cadence_and_model_time() -> None:
    seconds = _peak(SMALL, 3)
    s = XGBSearcher(SMALL, seed=3, plan_size=32, epsilon=0.0, refit_every=32)
    for _ in range(20):
        batch = s.ask(8)
        s.tell(batch, [_ok(seconds(i)) for i in batch])
    # 160 results: random until 8 succeeded, then one fit per 32 results (plan used up).
    assert 4 <= s.fits <= 5
    assert s.model_seconds > 0


def test_small_spaces_refit_every_batch_large_ones_every_plan() -> None:
    small = XGBSearcher(SMALL, seed=3, plan_size=64, epsilon=0.0)
    large = XGBSearcher(LARGE, seed=3, plan_size=64, epsilon=0.0, n_chains=32, sa_steps=20)
    for s, space in ((small, SMALL), (large, LARGE)):
        seconds = _peak(space, 3)
        for _ in range(10):
            batch = s.ask(8)
            s.tell(batch, [_ok(seconds(i)) for i in batch])
    # 80 results, the first batch random: 9 fits when refitting per batch, 2 per 64-plan.
    assert small.refit_every == 8 and small.fits == 9
    assert large.refit_every == 64 and large.fits == 2


def test_failures_count_as_zero_and_all_failures_stay_random() -> None:
    s = XGBSearcher(SMALL, seed=4)
    failed = MeasureResult.failed(Status.RUNTIME_ERROR, "boom")
    for _ in range(5):
        batch = s.ask(8)
        s.tell(batch, [failed] * len(batch))
    assert s.n_ok == 0 and s.fits == 0
    assert len(s.ask(8)) == 8


def test_same_seed_same_proposals() -> None:
    seconds = _peak(LARGE, 5)

    def run() -> list[int]:
        s = XGBSearcher(LARGE, seed=5, plan_size=16, n_chains=64, sa_steps=50)
        out: list[int] = []
        for _ in range(5):
            batch = s.ask(8)
            s.tell(batch, [_ok(seconds(i)) for i in batch])
            out.extend(batch)
        return out

    assert run() == run()


def test_beats_random_on_a_small_space() -> None:
    ours: list[int] = []
    theirs: list[int] = []
    for seed in range(5):
        seconds = _peak(SMALL, 10 + seed)
        best = min(seconds(i) for i in range(len(SMALL)))
        ours.append(_trials_to_best(XGBSearcher(SMALL, seed=seed), seconds, best, 600))
        theirs.append(_trials_to_best(RandomSearch(len(SMALL), seed), seconds, best, 600))
    # Random needs ~ 1440 / 2 trials for the one best config; the model far fewer.
    assert np.median(ours) * 3 <= np.median(theirs)


def test_beats_random_on_a_large_space_with_annealing() -> None:
    ours: list[float] = []
    theirs: list[float] = []
    for seed in range(3):
        seconds = _peak(LARGE, 20 + seed)
        s = XGBSearcher(LARGE, seed=seed, plan_size=32, n_chains=128, sa_steps=200)
        r = RandomSearch(len(LARGE), seed)
        for searcher, out in ((s, ours), (r, theirs)):
            found: list[float] = []
            for _ in range(25):
                batch = searcher.ask(8)
                found.extend(seconds(i) for i in batch)
                searcher.tell(batch, [_ok(seconds(i)) for i in batch])
            out.append(min(found))
        assert s.fits >= 2
    assert np.median(ours) < np.median(theirs) / 2


def test_transfer_picks_the_first_batch() -> None:
    favourite = {5, 50, 500, 1000}

    def transfer(idx: np.ndarray) -> np.ndarray:
        return np.asarray([1.0 if int(i) in favourite else 0.0 for i in idx])

    s = XGBSearcher(SMALL, seed=6, transfer=transfer, transfer_sample=len(SMALL))
    assert set(s.ask(4)) == favourite
    more = s.ask(8)
    assert not favourite & set(more) and len(set(more)) == 8


def test_transfer_guides_every_other_pick_of_the_next_batches() -> None:
    ranked = [7 * i + 3 for i in range(40)]  # the transfer model's order, best first
    rank = {idx: len(ranked) - k for k, idx in enumerate(ranked)}

    def transfer(idx: np.ndarray) -> np.ndarray:
        return np.asarray([float(rank.get(int(i), 0)) for i in idx])

    s = XGBSearcher(SMALL, seed=2, transfer=transfer, transfer_sample=len(SMALL), transfer_until=24)
    first = s.ask(8)
    assert first == ranked[:8]
    s.tell(first, [_ok(1e-3 * (1 + i % 5)) for i in first])
    second = s.ask(8)
    assert second[0::2] == ranked[8:12]  # every other pick, in the transfer model's order
    s.tell(second, [_ok(1e-3) for _ in second])
    third = s.ask(8)
    assert third[0::2] == ranked[12:16]
    s.tell(third, [_ok(1e-3) for _ in third])
    assert s.n_ok == 24
    fourth = s.ask(8)  # past transfer_until: the model alone
    assert fourth[0::2] != ranked[16:20]


@pytest.mark.parametrize("min_ok", [8, 2000])  # the model takes over; transfer all along
def test_with_transfer_no_config_is_proposed_twice_to_the_end_of_the_space(min_ok: int) -> None:
    """The transfer model's plan, the random order and the cost model's plan overlap; whichever
    hands out a config, it is proposed once, and asking on exhausts the space exactly."""
    seconds = _peak(EXHAUSTED, 4)

    def transfer(idx: np.ndarray) -> np.ndarray:
        return -np.asarray([seconds(int(i)) for i in idx])  # a good model: faster is better

    s = XGBSearcher(
        EXHAUSTED,
        seed=4,
        transfer=transfer,
        transfer_sample=len(EXHAUSTED),
        transfer_until=len(EXHAUSTED),
        min_ok=min_ok,
    )
    seen: list[int] = []
    for _ in range(len(EXHAUSTED) // 8 + 2):  # bounded: 36 asks of 8 exhaust 288 configs
        batch = s.ask(8)
        if not batch:
            break
        seen.extend(batch)
        s.tell(batch, [_ok(seconds(i)) for i in batch])
    assert len(seen) == len(set(seen)) == len(EXHAUSTED)
    assert s.ask(8) == []


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        XGBSearcher(SMALL, epsilon=2.0)
    with pytest.raises(ValueError, match="plan_size"):
        XGBSearcher(SMALL, plan_size=0)
    s = XGBSearcher(SMALL)
    with pytest.raises(ValueError, match="2 indices and 1 results"):
        s.tell([1, 2], [_ok(1.0)])


def test_large_space_uses_annealing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = model_search.SimulatedAnnealing.search

    def spy(self: SimulatedAnnealing, *args: Any, **kwargs: Any) -> list[int]:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(model_search.SimulatedAnnealing, "search", spy)
    seconds = _peak(LARGE, 7)
    s = XGBSearcher(LARGE, seed=7, plan_size=16, n_chains=32, sa_steps=30)
    for _ in range(4):
        batch = s.ask(8)
        s.tell(batch, [_ok(seconds(i)) for i in batch])
    assert calls and s.fits == len(calls)


class _NamedBuilder:
    """Artifacts whose entry symbol ends in the config index, as the real builder names them."""

    target = "fake-target"

    def build(
        self, workload: Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        out = []
        for i in indices:
            data = str(i).encode()
            entry = Entry(symbol=f"k_c{i}", timing_symbol=f"k_c{i}__time", args=(), flop=1.0)
            art = Artifact(
                data, hashlib.sha256(data).hexdigest(), "shared_object", self.target, (entry,)
            )
            out.append(BuildResult(i, art))
        return out

    def close(self) -> None:
        pass


def test_drops_into_the_tuning_loop() -> None:
    task = Task(Workload("dense", (64, 64, 64)))
    seconds = _peak(task.space, 8)
    searcher = XGBSearcher(task.space, flop=task.flop, seed=0, plan_size=16)
    runner = FakeRunner(config_seconds=seconds, fail_configs={0: Status.RUNTIME_ERROR})
    progress = tune(
        task, _NamedBuilder(), runner, TuneOptions(trials=64, batch_size=8), searcher=searcher
    )
    indices = [r.config_index for r in progress.history]
    assert len(indices) == len(set(indices)) == 64
    assert searcher.fits >= 2 and searcher.model_seconds > 0
    assert progress.best is not None
    assert seconds(progress.best.config_index) == min(seconds(i) for i in indices)

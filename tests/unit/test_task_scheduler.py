"""The task scheduler on synthetic tasks whose best latency follows a known curve.

Task i's t-th candidate takes `floor + (start - floor) * exp(-t / tau)` seconds times
`1 + noise * |N(0, 1)|` from a seeded rng, so its best-so-far falls towards `floor` at rate `tau`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import pytest

from tuner.network.scheduler import (
    Allocation,
    SchedTask,
    ScheduleResult,
    TaskScheduler,
    estimate_gradient,
    weighted_latency,
)

BATCH = 16


class Curve:
    """A synthetic tune_batch: candidates on a decaying latency curve, optionally limited."""

    def __init__(
        self,
        start: float,
        floor: float,
        tau: float,
        seed: int,
        noise: float = 0.3,
        space: int | None = None,
    ) -> None:
        self.start, self.floor, self.tau, self.noise, self.space = start, floor, tau, noise, space
        self.rng = random.Random(seed)
        self.t = 0
        self.calls: list[int] = []

    def __call__(self, n: int) -> list[float | None]:
        self.calls.append(n)
        if self.space is not None:
            n = min(n, self.space - self.t)
        out: list[float | None] = []
        for _ in range(n):
            self.t += 1
            base = self.floor + (self.start - self.floor) * math.exp(-self.t / self.tau)
            out.append(base * (1 + self.noise * abs(self.rng.gauss(0, 1))))
        return out


def task(
    name: str,
    weight: float,
    start: float,
    floor: float,
    tau: float,
    seed: int,
    *,
    flop: float = 0.0,
    group: str = "",
    space: int | None = None,
) -> SchedTask:
    return SchedTask(name, weight, flop, Curve(start, floor, tau, seed, space=space), group)


def skewed_model(seed: int) -> tuple[list[SchedTask], float]:
    """One heavy slow-converging task among five light fast ones, and the optimum objective."""
    tasks = [task("heavy", 10, 10e-3, 1e-3, 60.0, seed)]
    tasks += [task(f"light{i}", 1, 2e-3, 1e-3, 20.0, seed * 10 + i) for i in range(5)]
    return tasks, 10 * 1e-3 + 5 * 1e-3


def fixed(name: str, batches: Sequence[Sequence[float | None] | Exception]) -> SchedTask:
    """A task whose k-th batch cycles through batches[k] (the last repeats), or raises it."""
    calls = [0]

    def tune(n: int) -> list[float | None]:
        answer = batches[min(calls[0], len(batches) - 1)]
        calls[0] += 1
        if isinstance(answer, Exception):
            raise answer
        return [answer[k % len(answer)] for k in range(n)]

    return SchedTask(name, 1.0, 0.0, tune)


def run(tasks: list[SchedTask], total: int, **kw: Any) -> tuple[ScheduleResult, list[Allocation]]:
    seen: list[Allocation] = []
    result = TaskScheduler(tasks, total, BATCH, on_batch=seen.append, **kw).run()
    return result, seen


def test_warmup_gives_every_task_one_batch_before_any_second() -> None:
    tasks, _ = skewed_model(0)
    result = TaskScheduler(tasks, 400, BATCH).run()
    first = result.allocations[: len(tasks)]
    assert [a.task for a in first] == [t.name for t in tasks]
    assert {a.reason for a in first} == {"warmup"}
    assert all(a.trials == BATCH for a in first)
    assert {a.reason for a in result.allocations[len(tasks) :]} <= {"gradient", "random"}


def test_prior_history_skips_the_warmup_and_steers_the_first_picks() -> None:
    """A resumed run: tasks with earlier trials get no warm-up batch, and a task already at
    its floor after many trials gets nothing before the others."""
    tasks = [
        task("done", 1, 5e-3, 1e-3, 20.0, 1),
        task("fresh", 1, 5e-3, 1e-3, 20.0, 2),
        task("started", 1, 5e-3, 1e-3, 20.0, 3),
    ]
    prior = {"done": (400, 1e-3), "started": (16, 3e-3)}
    result = TaskScheduler(tasks, 48, BATCH, epsilon=0.0, prior=prior).run()
    assert result.allocations[0].task == "fresh" and result.allocations[0].reason == "warmup"
    assert {a.reason for a in result.allocations[1:]} == {"gradient"}
    assert "done" not in {a.task for a in result.allocations}
    assert result.trials["done"] == 400  # prior trials are reported, not charged to the budget
    assert sum(a.trials for a in result.allocations) == 48
    with pytest.raises(ValueError, match="unknown tasks"):
        TaskScheduler(tasks, 8, BATCH, prior={"nope": (1, None)})


def test_stops_when_only_negligible_tasks_are_left() -> None:
    """The heavy tasks' spaces run out; the budget is not spent on a 0.1% task."""
    tasks = [
        task("heavy", 10, 10e-3, 1e-3, 20.0, 1, space=24),
        task("heavy2", 10, 10e-3, 1e-3, 20.0, 2, space=24),
        task("tiny", 1, 2e-5, 1e-5, 20.0, 3),
    ]
    result = TaskScheduler(tasks, 2000, BATCH, epsilon=0.0).run()
    assert result.trials["heavy"] == 24 and result.trials["heavy2"] == 24
    assert result.total_trials < 100 and "of the estimated latency" in result.stop_reason
    kept = TaskScheduler(tasks_copy(tasks), 2000, BATCH, epsilon=0.0, min_share=0.0).run()
    assert kept.total_trials == 2000 and kept.stop_reason == "budget"


def test_heavy_improvable_task_gets_more_than_light_or_converged_ones() -> None:
    tasks = [
        task("heavy_improvable", 10, 10e-3, 1e-3, 200.0, 1),
        task("heavy_converged", 10, 1.02e-3, 1e-3, 2.0, 2),
        task("light_improvable", 1, 10e-3, 1e-3, 200.0, 3),
    ]
    result = TaskScheduler(tasks, 800, BATCH, epsilon=0.0).run()
    trials = result.trials
    assert sum(trials.values()) == 800
    assert trials["heavy_improvable"] > 2 * trials["heavy_converged"]
    assert trials["heavy_improvable"] > 3 * trials["light_improvable"]
    rr = TaskScheduler(tasks_copy(tasks), 800, BATCH, strategy="round_robin").run()
    assert result.objective_s < rr.objective_s


def tasks_copy(tasks: list[SchedTask]) -> list[SchedTask]:
    """Fresh synthetic tasks with the same curves (a Curve remembers how far it got)."""
    out = []
    for i, t in enumerate(tasks):
        c = t.tune_batch
        assert isinstance(c, Curve)
        curve = Curve(c.start, c.floor, c.tau, seed=100 + i, space=c.space)
        out.append(SchedTask(t.name, t.weight, t.flop, curve, t.group))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_reaches_the_target_in_well_under_round_robins_trials(seed: int) -> None:
    target = 1.3  # times the optimum objective
    reached = {}
    for strategy in ("gradient", "round_robin"):
        tasks, optimum = skewed_model(seed)
        result = TaskScheduler(tasks, 1200, BATCH, strategy=strategy, seed=seed).run()
        reached[strategy] = result.trials_to_reach(target * optimum)
    assert reached["round_robin"] is not None and reached["gradient"] is not None
    assert reached["gradient"] <= 0.5 * reached["round_robin"], reached


@pytest.mark.parametrize("strategy", ["gradient", "round_robin"])
def test_budget_is_spent_exactly_even_when_it_is_not_a_multiple_of_the_batch(
    strategy: str,
) -> None:
    tasks, _ = skewed_model(3)
    greedy = SchedTask("greedy", 1, 0.0, lambda n: [1e-3] * (n + 5))  # answers more than asked
    result, seen = run([*tasks, greedy], 1001, strategy=strategy)
    assert result.total_trials == 1001
    assert sum(result.trials.values()) == 1001
    assert seen == result.allocations
    assert all(a.trials <= a.requested <= BATCH for a in seen)
    assert seen[-1].requested == 1001 % BATCH and seen[-1].total_trials == 1001
    assert [a.total_trials for a in seen] == [c[0] for c in result.objective_curve]
    for t in tasks:
        assert isinstance(t.tune_batch, Curve)
        assert sum(t.tune_batch.calls) == result.trials[t.name]


def test_round_robin_cycles_through_tasks_in_order() -> None:
    tasks, _ = skewed_model(0)
    result = TaskScheduler(tasks, 6 * BATCH * 3, BATCH, strategy="round_robin").run()
    assert [a.task for a in result.allocations] == [t.name for t in tasks] * 3
    assert set(result.trials.values()) == {3 * BATCH}


def test_a_task_failing_everything_is_dropped_after_max_failed_batches() -> None:
    tasks, _ = skewed_model(0)
    broken = fixed("broken", [[None]])
    flaky = fixed("flaky", [[None, 2e-3]])  # half its candidates fail
    result, seen = run([*tasks, broken, flaky], 800, max_failed_batches=2)
    trials = result.trials
    outcome = {t.name: t for t in result.tasks}
    assert trials["broken"] == 2 * BATCH
    assert outcome["broken"].status == "failing" and outcome["broken"].best_s is None
    assert [a.reason for a in seen if a.task == "broken"] == ["warmup", "unmeasured"]
    assert outcome["flaky"].status == "active" and outcome["flaky"].best_s == 2e-3
    assert all(a.failures == a.trials // 2 for a in seen if a.task == "flaky")
    assert sum(trials.values()) == 800
    assert math.isinf(result.objective_s)  # a kernel never worked


def test_a_task_whose_first_batch_failed_goes_first_after_warmup() -> None:
    tasks, _ = skewed_model(0)
    late = fixed("late", [[None], [5e-3]])
    result = TaskScheduler([late, *tasks], 400, BATCH).run()
    after_warmup = result.allocations[len(tasks) + 1]
    assert (after_warmup.task, after_warmup.reason) == ("late", "unmeasured")
    assert result.best_s["late"] == 5e-3
    assert math.isfinite(result.objective_s)


@pytest.mark.parametrize("strategy", ["gradient", "round_robin"])
def test_a_raising_task_is_marked_dead_and_the_others_go_on(
    strategy: str, caplog: pytest.LogCaptureFixture
) -> None:
    tasks, _ = skewed_model(0)
    dies = fixed("dies", [[1e-3], [1e-3], ConnectionError("device lost")])
    at_once = fixed("at_once", [RuntimeError("no such template")])
    result, seen = run([dies, at_once, *tasks], 900, strategy=strategy, epsilon=0.0)
    outcome = {t.name: t for t in result.tasks}
    assert outcome["dies"].status == "dead" and outcome["dies"].error is not None
    assert "device lost" in outcome["dies"].error
    assert outcome["dies"].trials == 2 * BATCH and outcome["dies"].best_s == 1e-3
    assert outcome["at_once"].status == "dead" and outcome["at_once"].trials == 0
    assert [a.trials for a in seen if a.task == "at_once"] == [0]
    assert result.total_trials == 900
    assert "device lost" in caplog.text and "no such template" in caplog.text


def test_exhausted_tasks_are_skipped_and_the_run_ends_when_all_are() -> None:
    small = task("small", 10, 10e-3, 1e-3, 100.0, 1, space=40)
    tiny = task("tiny", 1, 10e-3, 1e-3, 100.0, 2, space=5)
    big = task("big", 1, 10e-3, 1e-3, 100.0, 3, space=70)
    result, _ = run([small, tiny, big], 10_000)
    assert result.trials == {"small": 40, "tiny": 5, "big": 70}
    assert result.total_trials == 115
    assert {t.status for t in result.tasks} == {"exhausted"}
    # An exhausted task is not asked again: its last call is the one that came back short.
    for t, space in ((small, 40), (tiny, 5), (big, 70)):
        assert isinstance(t.tune_batch, Curve)
        assert len(t.tune_batch.calls) == space // BATCH + 1


def test_early_stop_retires_a_converged_task() -> None:
    converged = SchedTask("converged", 10, 0.0, lambda n: [1e-3] * n)
    slow = task("slow", 1, 10e-3, 1e-3, 300.0, 1)
    result = TaskScheduler([converged, slow], 800, BATCH, early_stop_per_task=3 * BATCH).run()
    outcome = {t.name: t for t in result.tasks}
    assert outcome["converged"].status == "early_stopped"
    assert outcome["converged"].trials == 4 * BATCH  # the first batch set the best, 3 more did not
    assert outcome["slow"].trials == 800 - 4 * BATCH


def test_same_seed_same_schedule_and_other_seeds_differ() -> None:
    def order(seed: int) -> list[tuple[str, str]]:
        tasks, _ = skewed_model(0)
        result = TaskScheduler(tasks, 1000, BATCH, epsilon=0.3, seed=seed).run()
        return [(a.task, a.reason) for a in result.allocations]

    assert order(7) == order(7)
    assert order(7) != order(8)
    assert any(reason == "random" for _, reason in order(7))


def test_a_pluggable_objective_steers_the_trials() -> None:
    def only_heavy(tasks: Sequence[SchedTask], latencies: Sequence[float]) -> float:
        return sum(3 * g for t, g in zip(tasks, latencies, strict=True) if t.name == "heavy")

    tasks, _ = skewed_model(0)
    result = TaskScheduler(tasks, 600, BATCH, epsilon=0.0, objective=only_heavy).run()
    assert result.trials["heavy"] == 600 - 5 * BATCH  # the light ones: warm-up only
    assert result.objective_s == pytest.approx(3 * result.best_s["heavy"])  # type: ignore[operator]


def test_the_default_objective_is_the_weighted_sum_of_latencies() -> None:
    tasks, _ = skewed_model(0)
    result = TaskScheduler(tasks, 300, BATCH).run()
    best = result.best_s
    expected = sum(t.weight * (best[t.name] or math.nan) for t in tasks)
    assert result.objective_s == pytest.approx(expected)
    assert weighted_latency(tasks, [1.0] * 6) == 15.0


def test_estimate_gradient_blends_backward_forward_and_similarity_terms() -> None:
    history = [(16, 4e-3), (32, 3e-3), (48, 2.5e-3), (64, 2.4e-3)]
    kw: dict[str, float] = {"chain": 10.0, "alpha": 0.2, "beta": 2.0}
    backward = (2.4e-3 - 4e-3) / (64 - 16)  # window of 3 batches back
    no_similar = estimate_gradient(history, flop=0, best_similar_flops=0, window=3, **kw)
    assert no_similar == pytest.approx(10 * (0.2 * backward + 0.8 * (-2.4e-3 / 64)))
    # A sibling reaching 1 TFLOP/s says this 1 GFLOP task could take 2 * 1 ms: 0.4 ms to gain.
    similar = estimate_gradient(history, flop=1e9, best_similar_flops=1e12, window=3, **kw)
    assert similar == pytest.approx(10 * (0.2 * backward + 0.8 * (2e-3 - 2.4e-3)))
    # The sibling bound never makes the guess more pessimistic than -g / t.
    slow_sibling = estimate_gradient(history, flop=1e9, best_similar_flops=1e11, window=3, **kw)
    assert slow_sibling == pytest.approx(no_similar)
    short = estimate_gradient(history, flop=0, best_similar_flops=0, window=1, **kw)
    assert short == pytest.approx(10 * (0.2 * (-0.1e-3 / 16) + 0.8 * (-2.4e-3 / 64)))
    first = estimate_gradient(history[:1], flop=0, best_similar_flops=0, window=3, **kw)
    assert first == pytest.approx(10 * 0.8 * (-4e-3 / 16))


def test_a_task_far_below_its_siblings_throughput_is_tuned_first() -> None:
    def first_picks(plain_group: str) -> list[str]:
        # "fast" shows the conv template can run 1 GFLOP in ~1 ms; "plain" takes ~4 ms for as
        # many FLOPs, so with a sibling it has ~2 ms to gain, not just -g / t like "alone".
        fast = task("fast", 1, 1.1e-3, 1e-3, 5.0, 1, flop=1e9, group="conv")
        plain = task("plain", 1, 4e-3, 1e-3, 200.0, 2, flop=1e9, group=plain_group)
        alone = task("alone", 1, 4e-3, 1e-3, 200.0, 2, flop=1e9, group="dense")
        result = TaskScheduler([fast, plain, alone], 12 * BATCH, BATCH, epsilon=0.0).run()
        return [a.task for a in result.allocations[3:]]

    assert first_picks("conv") == ["plain"] * 9
    assert first_picks("other").count("plain") <= 5  # no sibling: it alternates with "alone"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"total_trials": -1}, "total_trials"),
        ({"strategy": "greedy"}, "greedy"),
        ({"alpha": 1.5}, "alpha"),
        ({"early_stop_per_task": 0}, "early_stop_per_task"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"total_trials": 10, "batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=needle):
        TaskScheduler([fixed("a", [[1.0]])], **args)  # type: ignore[arg-type]


def test_duplicate_task_names_are_refused() -> None:
    with pytest.raises(ValueError, match="'a'"):
        TaskScheduler([fixed("a", [[1.0]]), fixed("a", [[1.0]])], 10, 2)


class Preparing:
    """Tasks with a `prepare` hook; every hook and batch call goes to one event list."""

    def __init__(self, tasks: Sequence[SchedTask]) -> None:
        self.events: list[tuple[str, str, int]] = []
        self.tasks = [
            SchedTask(
                t.name,
                t.weight,
                t.flop,
                self._noting("batch", t.name, t.tune_batch),
                t.group,
                self._noting("prepare", t.name, lambda n: None),
            )
            for t in tasks
        ]

    def _noting(self, what: str, name: str, call: Any) -> Any:
        def noted(n: int) -> Any:
            self.events.append((what, name, n))
            return call(n)

        return noted


def story(result: ScheduleResult) -> list[tuple[str, str, int, float]]:
    return [(a.task, a.reason, a.trials, a.objective_s) for a in result.allocations]


@pytest.mark.parametrize("strategy", ["gradient", "round_robin"])
@pytest.mark.parametrize("seed", [0, 3])
def test_prepare_never_changes_the_picks(strategy: Any, seed: int) -> None:
    plain = TaskScheduler(
        skewed_model(seed)[0], 400, BATCH, strategy=strategy, seed=seed, early_stop_per_task=96
    ).run()
    hooked = Preparing(skewed_model(seed)[0])
    prepared = TaskScheduler(
        hooked.tasks, 400, BATCH, strategy=strategy, seed=seed, early_stop_per_task=96
    ).run()
    assert story(prepared) == story(plain)
    assert any(what == "prepare" for what, _, _ in hooked.events)


@pytest.mark.parametrize("strategy", ["gradient", "round_robin"])
def test_each_batch_and_the_expected_next_are_prepared_before_it_runs(strategy: Any) -> None:
    """With epsilon 0 and batches that never improve on a task's first, the guess of the next
    task is always right: each batch is prepared, then the next one's, then it runs."""
    tasks = [fixed(f"t{i}", [[(i + 1) * 1e-3] * BATCH]) for i in range(4)]
    hooked = Preparing(tasks)
    total = 12 * BATCH + 5  # the last batch is a short one
    result = TaskScheduler(hooked.tasks, total, BATCH, strategy=strategy, epsilon=0.0).run()
    picks = [(a.task, a.requested) for a in result.allocations]
    assert len(picks) == 13 and picks[-1][1] == 5
    runs = [i for i, (what, _, _) in enumerate(hooked.events) if what == "batch"]
    for k, at in enumerate(runs):
        name, n = picks[k]
        assert hooked.events[at] == ("batch", name, n)
        before = hooked.events[runs[k - 1] + 1 if k else 0 : at]
        expected = [("prepare", name, n)]
        if k + 1 < len(picks) and picks[k + 1][0] != name and picks[k + 1][1] == BATCH:
            expected.append(("prepare", picks[k + 1][0], BATCH))
        assert before == expected, (k, before)
    # in the warm-up every task is prepared before the one ahead of it has been measured
    assert [p for p in hooked.events[:3]] == [
        ("prepare", "t0", BATCH),
        ("prepare", "t1", BATCH),
        ("batch", "t0", BATCH),
    ]

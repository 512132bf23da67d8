"""The task scheduler: which of a model's tuning tasks gets the next batch of trials.

A model is cut into tasks (distinct workloads of op templates); task i occurs `weight_i` times,
so the model's estimated latency is `sum_i weight_i * best_i` (the default objective; any
`Objective` can replace it). The scheduler hands out a trial budget in batches:

- `round_robin`: every live task in turn (the baseline).
- `gradient` (Ansor, Zheng et al., OSDI 2020, section 6): after a warm-up round that gives every
  task one batch, take the task whose next batch is expected to cut the objective most, i.e. the
  most negative `df/dt_i = df/dg_i * dg_i/dt_i`, where `g_i` is the task's best latency and `t_i`
  its trials so far. `dg_i/dt_i` blends what the task did lately with what it might still do:

      dg/dt = alpha * backward + (1 - alpha) * min(-g / t, beta * flop / best_similar - g)

  `backward` is the slope of the task's best-latency curve over its last `window` batches;
  `-g / t` guesses optimistically that the latency could keep falling as fast as its average so
  far (to zero in another `t` trials); `beta * flop / best_similar - g` is how far it is from the
  best throughput (FLOP/s) any task of the same template (`group`) reached, with `beta` of slack.
  With probability `epsilon` a random live task is taken instead.

A task leaves the schedule when its space is exhausted (`tune_batch` returned fewer candidates
than asked), when `early_stop_per_task` trials passed without a better candidate, when its last
`max_failed_batches` batches measured nothing that worked, or when `tune_batch` raised (logged;
the others go on). A task that has no working candidate yet but is still allowed to try goes
first, since the model's latency cannot be estimated without it.

The scheduler knows nothing of builders, runners or devices: a task is a `tune_batch(n)` callable
returning the latencies in seconds of the candidates it measured (None for a failed one), with an
optional `prepare(n)` that starts that batch's builds early. Before each batch runs, the scheduler
prepares it and the batch it expects next (certain in the warm-up and in a round-robin; after the
warm-up, the gradient pick as if the running batch improved nothing), so the next task's builds
overlap this one's measuring. A task prepared on a wrong guess keeps its builds for its own next
batch; the picks and what each batch measures are the same with or without `prepare`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

_LOG = logging.getLogger(__name__)

Strategy = Literal["gradient", "round_robin"]
Objective = Callable[[Sequence["SchedTask"], Sequence[float]], float]
"""(tasks, best latency of each in seconds, inf where unknown) -> the model's latency in seconds."""

# Relative step of the finite difference that estimates df/dg_i for a non-default objective.
_FD_STEP = 1e-3


@dataclass(frozen=True)
class SchedTask:
    """One tuning task as the scheduler sees it.

    Attributes:
        name: unique key of the task (e.g. its workload key).
        weight: how many times the workload occurs in the model (>= 0).
        flop: floating-point operations of one run (0 = unknown: no similarity estimate).
        tune_batch: measures `n` more candidates and returns their latencies in seconds (None for
            a failure, as is a non-finite or non-positive latency); fewer than `n` results means
            the task's space is exhausted, more than `n` are cut to `n`.
        group: the op template; tasks of one group are "similar" for the throughput bound.
        prepare: optional; `prepare(n)` starts building the task's next `n` candidates, which its
            next `tune_batch` then measures (it must not change what that batch measures). The
            scheduler calls it for the task it is about to run and, before that batch runs, for
            the task it expects to run next, so that one's builds overlap this one's measuring.
    """

    name: str
    weight: float
    flop: float
    tune_batch: Callable[[int], Sequence[float | None]]
    group: str = ""
    prepare: Callable[[int], None] | None = None


@dataclass(frozen=True)
class Allocation:
    """One batch handed to one task, in the order the scheduler made them.

    `reason` is why the task was picked: warmup, gradient, random, round_robin or unmeasured.
    `trials` is what the batch counted toward the budget (the candidates `tune_batch` returned,
    at most `requested`); `total_trials` the budget used after it; `objective_s` the estimated
    model latency after it (inf while some task has no working candidate).
    """

    step: int
    task: str
    reason: str
    requested: int
    trials: int
    failures: int
    total_trials: int
    task_best_s: float | None
    objective_s: float
    error: str | None = None


@dataclass(frozen=True)
class TaskOutcome:
    """Where one task ended: trials spent, best latency (None: nothing worked), final status.

    `status` is one of: active (still had room when the budget ran out), exhausted,
    early_stopped, failing (too many batches with nothing working), dead (tune_batch raised).
    """

    name: str
    weight: float
    trials: int
    best_s: float | None
    status: str
    error: str | None = None


@dataclass(frozen=True)
class ScheduleResult:
    """What a `TaskScheduler.run` did: per-task outcomes, the objective curve, the allocations.

    `objective_curve` holds `(total trials, estimated model latency in seconds)` after each batch.
    """

    tasks: list[TaskOutcome]
    total_trials: int
    objective_curve: list[tuple[int, float]]
    allocations: list[Allocation]
    stop_reason: str = ""  # "budget", "no live task", or why the rest was not worth tuning

    @property
    def trials(self) -> dict[str, int]:
        return {t.name: t.trials for t in self.tasks}

    @property
    def best_s(self) -> dict[str, float | None]:
        return {t.name: t.best_s for t in self.tasks}

    @property
    def objective_s(self) -> float:
        """The final estimated model latency (inf if a task never had a working candidate)."""
        return self.objective_curve[-1][1] if self.objective_curve else math.inf

    def trials_to_reach(self, objective_s: float) -> int | None:
        """The total trials after which the estimate first was at or below `objective_s`."""
        for trials, value in self.objective_curve:
            if value <= objective_s:
                return trials
        return None


def weighted_latency(tasks: Sequence[SchedTask], latencies: Sequence[float]) -> float:
    """The default objective: `sum_i weight_i * latency_i` (inf if a weighted task is unknown)."""
    return math.fsum(t.weight * g for t, g in zip(tasks, latencies, strict=True) if t.weight)


def estimate_gradient(
    history: Sequence[tuple[int, float]],
    *,
    flop: float,
    best_similar_flops: float,
    chain: float,
    alpha: float,
    beta: float,
    window: int,
) -> float:
    """Ansor's estimate of df/dt for one task; the more negative, the more a batch should help.

    Args:
        history: `(trials so far, best latency in seconds)` after each of the task's batches;
            the last entry must have a finite latency and trials > 0.
        flop: the task's FLOP count (0 = unknown: the similarity term is left out).
        best_similar_flops: the best FLOP/s reached by a task of the same group (0 = none).
        chain: df/dg, how much the objective moves per second of this task's latency.
        alpha, beta, window: the blend, the slack on the similarity bound, and the backward
            window in batches.
    """
    trials, best = history[-1]
    finite = [(t, g) for t, g in history if math.isfinite(g)]
    earlier = finite[-1 - window] if len(finite) > window else finite[0]
    backward = (best - earlier[1]) / (trials - earlier[0]) if trials > earlier[0] else 0.0
    forward = -best / trials
    if flop > 0 and best_similar_flops > 0:
        forward = min(forward, beta * flop / best_similar_flops - best)
    return chain * (alpha * backward + (1 - alpha) * forward)


@dataclass
class _State:
    task: SchedTask
    trials: int = 0
    best_s: float = math.inf
    improved_at: int = 0
    failed_batches: int = 0
    status: str = "active"
    error: str | None = None
    history: list[tuple[int, float]] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.status == "active"


class TaskScheduler:
    """Spends `total_trials` over `tasks` in batches of `batch_size`; see the module docstring.

    Deterministic for a given `seed` (and deterministic tasks). The budget counts the candidates
    the tasks report and is never exceeded; the run ends early when no task is left live.

    Args:
        tasks: the tasks, names unique.
        total_trials: the trial budget over all tasks.
        batch_size: trials asked of a task per allocation.
        strategy: "gradient" or "round_robin".
        alpha, beta, window: see `estimate_gradient`.
        epsilon: probability of a random live task instead of the best one (gradient only).
        seed: seeds the epsilon-greedy picks.
        early_stop_per_task: retire a task after this many trials without a better candidate.
        max_failed_batches: retire a task whose last this-many batches measured nothing working.
        objective: the model latency from the tasks' latencies (default `weighted_latency`).
        on_batch: called with each `Allocation` as it is made.
        prior: per task name, (trials, best seconds or None) done before this run (a resumed
            tuning run): such a task needs no warm-up batch and its gradient starts from there.
            Prior trials do not count against `total_trials`.
        min_share: (gradient, default objective) stop once the tasks still live make up less
            than this share of the estimated model latency: when every heavy task is exhausted
            or stopped, spending the rest of the budget on a 0.1% task gains nothing.

    Raises:
        ValueError: on a bad argument, naming it.
    """

    def __init__(
        self,
        tasks: Sequence[SchedTask],
        total_trials: int,
        batch_size: int,
        *,
        strategy: Strategy = "gradient",
        alpha: float = 0.2,
        beta: float = 2.0,
        window: int = 3,
        epsilon: float = 0.05,
        seed: int = 0,
        early_stop_per_task: int | None = None,
        max_failed_batches: int = 2,
        objective: Objective | None = None,
        on_batch: Callable[[Allocation], None] | None = None,
        prior: Mapping[str, tuple[int, float | None]] | None = None,
        min_share: float = 0.01,
    ) -> None:
        names = [t.name for t in tasks]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"task names must be unique; repeated: {dup}")
        for t in tasks:
            if t.weight < 0 or t.flop < 0:
                raise ValueError(
                    f"task {t.name!r}: weight {t.weight} and flop {t.flop} must be >= 0"
                )
        if total_trials < 0 or batch_size < 1:
            raise ValueError(
                f"total_trials {total_trials} must be >= 0, batch_size {batch_size} >= 1"
            )
        if strategy not in ("gradient", "round_robin"):
            raise ValueError(f"unknown strategy {strategy!r}; expected gradient or round_robin")
        if not 0 <= alpha <= 1 or not 0 <= epsilon <= 1 or window < 1 or max_failed_batches < 1:
            raise ValueError(
                f"need 0 <= alpha ({alpha}) <= 1, 0 <= epsilon ({epsilon}) <= 1, window ({window})"
                f" >= 1, max_failed_batches ({max_failed_batches}) >= 1"
            )
        if early_stop_per_task is not None and early_stop_per_task < 1:
            raise ValueError(f"early_stop_per_task {early_stop_per_task} must be >= 1")
        self.tasks = list(tasks)
        self.total_trials = total_trials
        self.batch_size = batch_size
        self.strategy = strategy
        self.alpha, self.beta, self.window, self.epsilon = alpha, beta, window, epsilon
        self.seed = seed
        self.early_stop_per_task = early_stop_per_task
        self.max_failed_batches = max_failed_batches
        self.objective: Objective = objective or weighted_latency
        self.on_batch = on_batch
        unknown = sorted(set(prior or {}) - set(names))
        if unknown:
            raise ValueError(f"prior names unknown tasks: {unknown}")
        self.prior = dict(prior or {})
        if not 0 <= min_share < 1:
            raise ValueError(f"min_share {min_share} must lie in [0, 1)")
        self.min_share = min_share

    def _initial(self, task: SchedTask) -> _State:
        state = _State(task)
        trials, best = self.prior.get(task.name, (0, None))
        if trials > 0:
            state.trials = state.improved_at = trials
            if best is not None and math.isfinite(best) and best > 0:
                state.best_s = best
            state.history.append((trials, state.best_s))
        return state

    def run(self) -> ScheduleResult:
        """Hand out the budget; returns what each task got and how the objective fell."""
        states = [self._initial(t) for t in self.tasks]
        rng = random.Random(self.seed)
        allocations: list[Allocation] = []
        curve: list[tuple[int, float]] = []
        used = 0
        next_rr = 0
        stop = "budget"
        while used < self.total_trials:
            live = [i for i, s in enumerate(states) if s.live]
            if not live:
                stop = "no live task"
                break
            unwarmed = [i for i in live if not states[i].history]
            share = self._live_share(states, live)
            if not unwarmed and share < self.min_share:
                stop = f"the live tasks are {share:.2%} of the estimated latency"
                break
            if self.strategy == "round_robin":
                index = min((i for i in live if i >= next_rr), default=live[0])
                next_rr, reason = index + 1, "round_robin"
            elif unwarmed:
                index, reason = unwarmed[0], "warmup"
            else:
                index, reason = self._pick(states, live, rng)
            self._prepare_ahead(states, live, unwarmed, index, used)
            allocation = self._allocate(states, index, reason, used, len(allocations))
            used = allocation.total_trials
            allocations.append(allocation)
            curve.append((used, allocation.objective_s))
            if self.on_batch is not None:
                self.on_batch(allocation)
        outcomes = [
            TaskOutcome(
                s.task.name,
                s.task.weight,
                s.trials,
                s.best_s if math.isfinite(s.best_s) else None,
                s.status,
                s.error,
            )
            for s in states
        ]
        return ScheduleResult(outcomes, used, curve, allocations, stop)

    def _prepare_ahead(
        self, states: list[_State], live: list[int], unwarmed: list[int], index: int, used: int
    ) -> None:
        """Start the builds of task `index`'s batch and, where a full batch follows it, of the
        task expected next (`_foresee`), in that order, before the batch runs."""
        n = min(self.batch_size, self.total_trials - used)
        task = states[index].task
        if task.prepare is None:
            return
        task.prepare(n)
        if used + n + self.batch_size > self.total_trials:
            return
        upcoming = self._foresee(states, live, unwarmed, index, n)
        prepare = states[upcoming].task.prepare if upcoming is not None else None
        if upcoming != index and prepare is not None:
            prepare(self.batch_size)

    def _foresee(
        self, states: list[_State], live: list[int], unwarmed: list[int], index: int, n: int
    ) -> int | None:
        """The task the next allocation will most likely go to, told before this batch of task
        `index` runs: certain in a round-robin and in the warm-up; after it, the gradient pick
        as if this batch improved nothing (the epsilon draw aside). None: no guess."""
        if self.strategy == "round_robin":
            return min((i for i in live if i > index), default=live[0])
        if len(unwarmed) > 1:
            return unwarmed[1]
        s = states[index]
        hypothetical = list(states)
        hypothetical[index] = dataclasses.replace(
            s, trials=s.trials + n, history=[*s.history, (s.trials + n, s.best_s)]
        )
        unmeasured = [i for i in live if not math.isfinite(hypothetical[i].best_s)]
        if unmeasured:
            return unmeasured[0]
        grads = self._gradients(hypothetical, live)
        return min(live, key=lambda i: (grads[i], i))

    def _live_share(self, states: Sequence[_State], live: Sequence[int]) -> float:
        """The live tasks' part of the weighted latency (1 when it cannot be told yet)."""
        if self.strategy != "gradient" or self.objective is not weighted_latency:
            return 1.0
        parts = [s.task.weight * s.best_s for s in states]
        if not all(math.isfinite(p) for p in parts) or sum(parts) <= 0:
            return 1.0
        return math.fsum(parts[i] for i in live) / math.fsum(parts)

    def _pick(self, states: list[_State], live: list[int], rng: random.Random) -> tuple[int, str]:
        unmeasured = [i for i in live if not math.isfinite(states[i].best_s)]
        if unmeasured:
            return unmeasured[0], "unmeasured"
        # Draw every step so the picks depend on the seed alone, not on which branch came before.
        if rng.random() < self.epsilon:
            return live[rng.randrange(len(live))], "random"
        grads = self._gradients(states, live)
        return min(live, key=lambda i: (grads[i], i)), "gradient"

    def _gradients(self, states: Sequence[_State], live: Sequence[int]) -> dict[int, float]:
        """The estimated df/dt of each live task (all have a finite best latency)."""
        latencies = [s.best_s if math.isfinite(s.best_s) else 0.0 for s in states]
        best_flops: dict[str, float] = {}
        for s in states:
            if s.task.group and s.task.flop > 0 and math.isfinite(s.best_s) and s.best_s > 0:
                flops = s.task.flop / s.best_s
                best_flops[s.task.group] = max(best_flops.get(s.task.group, 0.0), flops)
        grads = {}
        for i in live:
            s = states[i]
            grads[i] = estimate_gradient(
                s.history,
                flop=s.task.flop,
                best_similar_flops=best_flops.get(s.task.group, 0.0) if s.task.group else 0.0,
                chain=self._chain(latencies, i),
                alpha=self.alpha,
                beta=self.beta,
                window=self.window,
            )
        return grads

    def _chain(self, latencies: list[float], i: int) -> float:
        """df/dg_i: the weight for the default objective, a finite difference for any other."""
        if self.objective is weighted_latency:
            return self.tasks[i].weight
        step = max(latencies[i] * _FD_STEP, 1e-12)
        moved = list(latencies)
        moved[i] += step
        return (self.objective(self.tasks, moved) - self.objective(self.tasks, latencies)) / step

    def _allocate(
        self, states: list[_State], index: int, reason: str, used: int, step: int
    ) -> Allocation:
        s = states[index]
        n = min(self.batch_size, self.total_trials - used)
        error = None
        try:
            results = list(s.task.tune_batch(n))
        except Exception as exc:  # a broken task must not end the run for the others
            _LOG.warning(
                "task %s: tune_batch(%d) raised; dropping it", s.task.name, n, exc_info=True
            )
            results, error = [], f"{type(exc).__name__}: {exc}"
            s.status, s.error = "dead", error
        if len(results) > n:
            _LOG.warning("task %s returned %d results for %d asked", s.task.name, len(results), n)
            results = results[:n]
        ok = [r for r in results if r is not None and math.isfinite(r) and r > 0]
        s.trials += len(results)
        if ok and min(ok) < s.best_s:
            s.best_s, s.improved_at = min(ok), s.trials
        s.failed_batches = 0 if ok else s.failed_batches + 1
        s.history.append((s.trials, s.best_s))
        if s.live:
            if len(results) < n:
                s.status = "exhausted"
            elif s.failed_batches >= self.max_failed_batches:
                s.status = "failing"
                _LOG.warning(
                    "task %s: nothing worked in %d batches; dropping it",
                    s.task.name,
                    s.failed_batches,
                )
            elif (
                self.early_stop_per_task is not None
                and s.trials - s.improved_at >= self.early_stop_per_task
            ):
                s.status = "early_stopped"
        latencies = [st.best_s for st in states]
        return Allocation(
            step=step,
            task=s.task.name,
            reason=reason,
            requested=n,
            trials=len(results),
            failures=len(results) - len(ok),
            total_trials=used + len(results),
            task_best_s=s.best_s if math.isfinite(s.best_s) else None,
            objective_s=self.objective(self.tasks, latencies),
            error=error,
        )

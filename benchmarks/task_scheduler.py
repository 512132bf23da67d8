"""Task scheduling: trials the gradient scheduler needs to reach X% of the optimum, vs round robin.

Synthetic models (nothing is built or measured): task i's t-th candidate takes
`floor_i + (start_i - floor_i) * exp(-t / tau_i)` seconds times `1 + 0.3 * |N(0, 1)|` from a
seeded rng, so the optimum model latency `sum_i weight_i * floor_i` is known. For each shape of
skew and seed, both strategies spend the same budget; the table gives the total trials after
which the estimated model latency first fell to 150 / 120 / 110 / 105% of the optimum (`>B`:
not within the budget B, counted as B). The last line is
`task_scheduler: trials_ratio_vs_round_robin=<r>`, the geometric mean of gradient / round robin
over every shape, seed and level (lower = the gradient scheduler needs fewer trials; a level
round robin misses within the budget counts as B, so the ratio flatters round robin).

Run: `.venv/bin/python -m benchmarks.task_scheduler [--seeds 5] [--budget 2000]`.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable

from tuner.network.scheduler import SchedTask, TaskScheduler

BATCH = 16
LEVELS = (1.5, 1.2, 1.1, 1.05)
# (weight, start_s, floor_s, tau_trials, group) per task
_Task = tuple[float, float, float, float, str]
Shape = list[_Task]


def _t(weight: float, start_s: float, floor_s: float, tau: float, group: str) -> _Task:
    return (weight, start_s, floor_s, tau, group)


SHAPES: dict[str, Shape] = {
    "uniform (6 alike)": [_t(1, 4e-3, 1e-3, 60, f"t{i}") for i in range(6)],
    "one heavy x10 + 5 light": [_t(10, 10e-3, 1e-3, 60, "h")]
    + [_t(1, 2e-3, 1e-3, 20, f"l{i}") for i in range(5)],
    "two heavy + 8 light": [_t(5, 8e-3, 1e-3, 80, "h0"), _t(5, 6e-3, 2e-3, 40, "h1")]
    + [_t(1, 2e-3, 1e-3, 20, f"l{i}") for i in range(8)],
    "heavy converged + heavy slow": [_t(10, 1.05e-3, 1e-3, 5, "a"), _t(10, 8e-3, 1e-3, 150, "b")]
    + [_t(1, 3e-3, 1e-3, 30, f"l{i}") for i in range(4)],
    "long tail (weights 1..32)": [
        _t(2.0**k, 1e-3 * (2 + k % 3), 1e-3, 20 + 15 * k, f"t{k}") for k in range(6)
    ],
}


def _curve(
    start: float, floor: float, tau: float, seed: int
) -> Callable[[int], list[float | None]]:
    rng = random.Random(seed)
    trials = [0]

    def tune(n: int) -> list[float | None]:
        out: list[float | None] = []
        for _ in range(n):
            trials[0] += 1
            base = floor + (start - floor) * math.exp(-trials[0] / tau)
            out.append(base * (1 + 0.3 * abs(rng.gauss(0, 1))))
        return out

    return tune


def _tasks(shape: Shape, seed: int) -> list[SchedTask]:
    return [
        SchedTask(f"t{i}", w, 0.0, _curve(start, floor, tau, seed * 100 + i), group)
        for i, (w, start, floor, tau, group) in enumerate(shape)
    ]


def _reach(shape: Shape, seed: int, strategy: str, budget: int) -> list[int | None]:
    optimum = sum(w * floor for w, _, floor, _, _ in shape)
    scheduler = TaskScheduler(
        _tasks(shape, seed),
        budget,
        BATCH,
        strategy="gradient" if strategy == "gradient" else "round_robin",
        seed=seed,
    )
    result = scheduler.run()
    return [result.trials_to_reach(level * optimum) for level in LEVELS]


def _cell(values: list[int | None], budget: int) -> str:
    counted = [budget if v is None else v for v in values]
    mean = sum(counted) / len(counted)
    return f"{'>' if None in values else ''}{mean:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per shape")
    parser.add_argument("--budget", type=int, default=2000, help="trials per run")
    args = parser.parse_args(argv)
    header = "".join(f"{f'{100 * lv:.0f}% gr / rr':>20}" for lv in LEVELS)
    print(f"{'shape':<30}{header}")
    log_ratios: list[float] = []
    for name, shape in SHAPES.items():
        per_level: dict[str, list[list[int | None]]] = {"gradient": [], "round_robin": []}
        for seed in range(args.seeds):
            for strategy, rows in per_level.items():
                rows.append(_reach(shape, seed, strategy, args.budget))
        cells = []
        for k in range(len(LEVELS)):
            gr = [row[k] for row in per_level["gradient"]]
            rr = [row[k] for row in per_level["round_robin"]]
            cells.append(f"{_cell(gr, args.budget) + ' / ' + _cell(rr, args.budget):>20}")
            for g, r in zip(gr, rr, strict=True):
                log_ratios.append(math.log((g or args.budget) / (r or args.budget)))
        print(f"{name:<30}{''.join(cells)}")
    ratio = math.exp(sum(log_ratios) / len(log_ratios))
    print(f"mean trials to reach each level over {args.seeds} seeds, batches of {BATCH}")
    print(f"task_scheduler: trials_ratio_vs_round_robin={ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

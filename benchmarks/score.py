"""Cost-model scoring speed: 10,000 candidates featurized and predicted, and one SA plan.

On the dense 1024 space: a model is fitted on 200 random configs (timings made up: only speed
is measured here), then in interleaved rounds
- vectorized: `knob_features` + `CostModel.predict` of 10,000 indices (sampled with repetition);
- per-config peer: the same 10,000 featurized one at a time from `space.get` (what a plain
  Python featurizer costs), then predicted;
- an SA plan (256 chains, up to 500 steps, top 64) on the dense space and on a 10^8 space;
- the exhaustive plan the searcher uses on spaces under 20,000 configs.
Medians of the rounds; the last line is
`score: score_10k_ms=<ms> sa_plan_ms=<ms>` (SA plan on the dense space).

Run: `.venv/bin/python -m benchmarks.score [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from compiler import ops
from compiler.ops.space import ConfigSpace, Knob
from tuner.search.annealing import SimulatedAnnealing
from tuner.search.cost_model import CostModel
from tuner.search.features import knob_features

DENSE = (1024, 1024, 1024)


def _per_config_features(space: ConfigSpace, indices: np.ndarray) -> np.ndarray:
    rows = []
    for i in indices:
        c = space.get(int(i))
        row: list[float] = []
        for k in space.knobs:
            v = c[k.name]
            if isinstance(v, int | float) and not isinstance(v, bool):
                row += [math.copysign(math.log2(abs(v) + 1), v), float(k.choices.index(v))]
            else:
                row += [float(v == ch) for ch in k.choices]
        rows.append(row)
    return np.asarray(rows, dtype=np.float32)


def _ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()

    space = ops.get_template("dense").config_space(DENSE)
    big = ConfigSpace([Knob(f"k{j}", tuple(range(10))) for j in range(8)])  # 10^8 configs
    rng = np.random.default_rng(0)
    train = rng.choice(len(space), 200, replace=False)
    x = knob_features(space, train)
    y = rng.random(200)  # made-up targets: the model's accuracy is not measured here
    model = CostModel(seed=0)
    fit_ms = _ms(lambda: model.fit(x, y))
    big_model = CostModel(seed=0)
    big_train = rng.integers(0, len(big), 200)
    big_model.fit(knob_features(big, big_train), rng.random(200))
    cands = rng.integers(0, len(space), 10_000)

    def vectorized() -> np.ndarray:
        return model.predict(knob_features(space, cands))

    def per_config() -> np.ndarray:
        return model.predict(_per_config_features(space, cands))

    assert np.allclose(vectorized(), per_config())  # the peer computes the same features

    def sa_plan(s: ConfigSpace, m: CostModel, seed: int) -> list[int]:
        sa = SimulatedAnnealing(s, n_chains=256, n_steps=500, seed=seed)
        return sa.search(lambda idx: m.predict(knob_features(s, idx)), 64)

    def exhaustive() -> np.ndarray:
        every = np.arange(len(space))
        return np.argsort(-model.predict(knob_features(space, every)))[:64]

    times: dict[str, list[float]] = {
        k: [] for k in ("vectorized", "per_config", "sa_dense", "sa_1e8", "exhaustive")
    }
    for r in range(opts.rounds):  # interleaved so background load hits every case alike
        times["vectorized"].append(_ms(vectorized))
        times["per_config"].append(_ms(per_config))
        times["sa_dense"].append(_ms(partial(sa_plan, space, model, r)))
        times["sa_1e8"].append(_ms(partial(sa_plan, big, big_model, r)))
        times["exhaustive"].append(_ms(exhaustive))
    med = {k: statistics.median(v) for k, v in times.items()}

    print(
        f"dense {DENSE}: {len(space)} configs, {x.shape[1]} knob features; fit(200) {fit_ms:.0f} ms"
    )
    print(f"{'case':<44}{'median ms':>12}{'ratio':>10}")
    rows = [
        ("score 10k: vectorized features + predict", "vectorized", med["vectorized"]),
        ("score 10k: per-config features + predict", "per_config", med["vectorized"]),
        ("SA plan, dense space (256 chains, top 64)", "sa_dense", med["sa_dense"]),
        ("SA plan, 10^8 space (256 chains, top 64)", "sa_1e8", med["sa_dense"]),
        (f"exhaustive plan, all {len(space)} configs", "exhaustive", med["sa_dense"]),
    ]
    for label, key, base in rows:
        print(f"{label:<44}{med[key]:>12.1f}{med[key] / base:>10.2f}")
    print(f"score: score_10k_ms={med['vectorized']:.1f} sa_plan_ms={med['sa_dense']:.1f}")


if __name__ == "__main__":
    main()

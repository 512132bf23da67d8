"""Builder benchmark: a dense 1024 candidate built alone vs in a translation unit of 4, and what the
pool runner gains from a second device.

    .venv/bin/python benchmarks/builder.py [--rounds 5] [--per-unit 4] [--runner-candidates 16]

Build: each round draws `per_unit` random configs of dense 1024x1024x1024 and builds them both
ways, in alternating order, each into a fresh (empty) compile cache: alone (one gcc call per
candidate) and as one unit (`tuner.measure.builder.build_unit`, one gcc call). Then the same unit again
from the warm cache. Per-candidate medians over the rounds, and the ratio.

Runner: a local pool with one agent holding two devices; the same batch of small kernels measured
by `PoolRunner(devices=1)` and `PoolRunner(devices=2)`, interleaved, candidates per second.
On a 2-core machine the two devices share the cores with the client, so the gain is bounded.

Ends with one line:
    builder: alone_ms=<ms> unit_ms_per_candidate=<ms> unit_speedup=<x> cached_ms=<ms> runner_2dev_speedup=<x>
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler.toolchain import CACHE_ENV
from tuner.measure import EvaluatorConfig
from tuner.measure.builder import build_one, build_unit
from tuner.measure.local_pool import LocalPool
from tuner.measure.pool_runner import PoolConfig, PoolRunner
from tuner.records import Workload
from tuner.task import Task

DENSE = Workload("dense", (1024, 1024, 1024))


def _timed_in_fresh_cache(fn: object) -> float:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-cache-") as cache:
        os.environ[CACHE_ENV] = cache
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        return time.perf_counter() - started


def bench_build(rounds: int, per_unit: int) -> tuple[float, float, float]:
    """Median seconds per candidate: alone, in a unit, from the warm cache."""
    size = len(Task(DENSE).space)
    rng = random.Random(0)
    alone, unit, cached = [], [], []
    saved = os.environ.get(CACHE_ENV)
    try:
        for r in range(rounds):
            configs = rng.sample(range(size), per_unit)

            def build_alone(configs: list[int] = configs) -> None:
                for i in configs:
                    assert build_one(DENSE, i, "host").artifact is not None

            def build_together(configs: list[int] = configs) -> None:
                assert all(b.artifact for b in build_unit(DENSE, configs, "host"))

            if r % 2 == 0:
                a = _timed_in_fresh_cache(build_alone)
                u = _timed_in_fresh_cache(build_together)
            else:
                u = _timed_in_fresh_cache(build_together)
                a = _timed_in_fresh_cache(build_alone)
            with tempfile.TemporaryDirectory(prefix="kiln-bench-cache-") as cache:
                os.environ[CACHE_ENV] = cache
                build_together()
                started = time.perf_counter()
                build_together()
                c = time.perf_counter() - started
            alone.append(a / per_unit)
            unit.append(u / per_unit)
            cached.append(c / per_unit)
            print(
                f"  round {r}: alone {a / per_unit * 1e3:7.0f} ms  unit {u / per_unit * 1e3:7.0f} ms"
                f"  cached {c / per_unit * 1e3:6.0f} ms per candidate",
                file=sys.stderr,
            )
    finally:
        if saved is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = saved
    return statistics.median(alone), statistics.median(unit), statistics.median(cached)


def bench_runner(candidates: int, rounds: int) -> tuple[float, float]:
    """Median candidates per second with one device and with two."""
    built = build_one(Workload("matmul", (64, 64, 64)), 0, "host")
    assert built.artifact is not None
    batch = [built.artifact] * candidates
    evaluator = EvaluatorConfig(warmup=0, repeat=2, min_repeat_ms=10.0)
    rates: dict[int, list[float]] = {1: [], 2: []}
    with LocalPool(key="bench-builder", devices=2) as pool:
        config = PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token)
        for r in range(rounds):
            for devices in (1, 2) if r % 2 == 0 else (2, 1):
                runner = PoolRunner(config, evaluator, devices=devices)
                try:
                    runner.run(batch[:2])  # lease, upload: not part of the rate
                    started = time.perf_counter()
                    results = runner.run(batch)
                    rates[devices].append(candidates / (time.perf_counter() - started))
                finally:
                    runner.close()
                assert all(x.ok for x in results), [x.error for x in results]
    return statistics.median(rates[1]), statistics.median(rates[2])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per-unit", type=int, default=4)
    p.add_argument("--runner-candidates", type=int, default=16)
    args = p.parse_args()

    print(
        f"building dense 1024 candidates, {args.rounds} rounds of {args.per_unit}", file=sys.stderr
    )
    alone, unit, cached = bench_build(args.rounds, args.per_unit)
    one, two = bench_runner(args.runner_candidates, args.rounds)
    rows = [
        ("dense 1024, built alone", f"{alone * 1e3:.0f} ms / candidate", "1.00x"),
        (
            f"dense 1024, unit of {args.per_unit}",
            f"{unit * 1e3:.0f} ms / candidate",
            f"{alone / unit:.2f}x",
        ),
        (
            "dense 1024, unit from cache",
            f"{cached * 1e3:.0f} ms / candidate",
            f"{alone / cached:.2f}x",
        ),
        ("PoolRunner devices=1", f"{one:.1f} candidates/s", "1.00x"),
        ("PoolRunner devices=2", f"{two:.1f} candidates/s", f"{two / one:.2f}x"),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    for name, value, ratio in rows:
        print(f"{name:<{width}}  {value:>22}  {ratio:>6}")
    print(
        f"builder: alone_ms={alone * 1e3:.0f} unit_ms_per_candidate={unit * 1e3:.0f} "
        f"unit_speedup={alone / unit:.2f} cached_ms={cached * 1e3:.0f} "
        f"runner_2dev_speedup={two / one:.2f}"
    )


if __name__ == "__main__":
    main()

"""benchmarks/cores.py's sgemm on several threads tries the best config tuned on that many threads
(`--records`), beside the one-thread config with its parallel and row-block variants, so that a
figure on N threads can rest on tuning on N threads; a record of another thread count never
joins, however fast (issue 25: a record for one thread count never stands in for another)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.cores_child import sgemm_candidates
from compiler import ops, toolchain
from compiler.ops.base import threaded_space
from tuner import records as rec
from tuner.measure import MeasureResult, Status

N = 256


def _write(path: Path, threads: int, knobs: dict[str, object], seconds: float) -> None:
    space = threaded_space(ops.op_templates()["dense"], (N, N, N), threads)
    index = space.index_of(knobs)
    target = rec.records_target(toolchain.get_target("host").name, threads)
    record = rec.Record(
        rec.Workload("dense", (N, N, N)),
        target,
        index,
        dict(space.get(index)),
        MeasureResult(Status.OK, (seconds,)),
        2.0 * N**3,
        rec.now_iso(),
        space_size=len(space),
    )
    rec.append(path, [record])


def _knobs(threads: int) -> dict[str, object]:
    """A plausible config unlike any the one-thread pick's variants give (pack_a flipped, an
    order and a kc of its own)."""
    t = ops.op_templates()["dense"]
    space = threaded_space(t, (N, N, N), threads)
    base, _ = sgemm_candidates(N, threads)
    for i in range(len(space)):
        c = space.get(i)
        if c not in base and t.worth_measuring((N, N, N), c):
            return dict(c)
    raise AssertionError("no config outside the base candidates")


def test_a_config_tuned_on_the_thread_count_joins_the_candidates(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    knobs = _knobs(2)
    _write(path, 2, knobs, 1e-3)
    configs, sources = sgemm_candidates(N, 2, str(path))
    base, _ = sgemm_candidates(N, 2)
    assert len(configs) == len(base) + 1
    assert dict(configs[-1]) == knobs
    assert sources[-1] == "the records' best on 2 thread(s)"


def test_a_record_of_another_thread_count_does_not(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    one = {k: v for k, v in _knobs(2).items() if k != "parallel"}
    _write(path, 1, one, 1e-4)  # faster than anything, but tuned on one thread
    configs, _ = sgemm_candidates(N, 2, str(path))
    assert configs == sgemm_candidates(N, 2)[0]

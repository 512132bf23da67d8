"""A single op's records per thread count: tuning on two threads resumes only two-thread records
and reports only their best, although a four-thread record of the same index has the same
knobs (the spaces of every count above one are the same space) and is faster."""

from __future__ import annotations

from pathlib import Path

from test_tuner_resume import TARGET, FakeBuilder, faster_with_index

from tuner import records as rec
from tuner.loop import tune
from tuner.measure import MeasureResult, Status
from tuner.measure.fake_runner import FakeRunner
from tuner.options import TuneOptions
from tuner.records import FileRecords
from tuner.task import Task

WL = rec.Workload("softmax", (67, 130))


class ThreadedBuilder(FakeBuilder):
    """The fake builder of `test_tuner_resume`, building for `threads` threads."""

    def __init__(self, threads: int) -> None:
        super().__init__()
        self.threads = threads


def measured(task: Task, index: int, seconds: float, threads: int) -> rec.Record:
    result = MeasureResult(Status.OK, (seconds,), device_id="a/0", number_used=4)
    return rec.Record(
        WL,
        rec.records_target(TARGET, threads),
        index,
        dict(task.knobs(index)),
        result,
        1.0,
        rec.now_iso(),
        len(task.space),
    )


def test_a_single_op_never_resumes_or_reports_records_of_another_thread_count(
    tmp_path: Path,
) -> None:
    two, four = Task(WL, threads=2), Task(WL, threads=4)
    assert len(two.space) == len(four.space) and two.knobs(3) == four.knobs(3)
    store = FileRecords(tmp_path / "r.jsonl")
    store.append(
        [measured(four, i, 1e-9, 4) for i in range(6)]  # far faster, on four threads
        + [measured(two, 6, 1e-3, 2)]
    )
    options = TuneOptions(trials=3, batch_size=2, tuner="random", resume=True, confirm=0)
    runner = FakeRunner(lambda art: 1.0 + faster_with_index(art))  # all slower than 1e-3
    progress = tune(two, ThreadedBuilder(2), runner, options, records=store)
    assert progress.resumed == 1
    assert {r.target for r in progress.history} == {f"{TARGET}/threads=2"}
    assert progress.best is not None and progress.best.config_index == 6
    best = store.best(WL, f"{TARGET}/threads=2")
    assert best is not None and best.config_index == 6
    # the four-thread run takes its own six, and the one-thread store view sees none of them
    again = tune(four, ThreadedBuilder(4), runner, options, records=store)
    assert again.resumed == 6 and again.best is not None and again.best.threads == 4
    assert store.load(WL, TARGET) == []

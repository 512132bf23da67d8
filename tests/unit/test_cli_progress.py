"""The progress display: one redrawn line on a terminal, one plain line per batch elsewhere."""

from __future__ import annotations

import io

from kiln.cli.progress import ProgressBar, status_line
from tuner import records as rec
from tuner.loop import TuneProgress
from tuner.measure import MeasureResult, Status

WL = rec.Workload("matmul", (64, 64, 64))


def progress_after(trials: int, errors: int) -> TuneProgress:
    p = TuneProgress(total=20)
    batch = []
    for i in range(trials):
        if i < errors:
            result = MeasureResult.failed(Status.CRASH, "SIGSEGV")
        else:
            result = MeasureResult(Status.OK, (1e-3 / (i + 1),))
        batch.append(rec.Record(WL, "t", i, {}, result, 1e9, rec.now_iso()))
    p.add(batch)
    p.wall_s, p.model_s = 10.0, 0.5
    return p


def test_status_line_names_trials_best_errors_eta_and_model_share() -> None:
    p = progress_after(trials=5, errors=2)
    line = status_line(p, bar=False)
    assert "trials 5/20" in line and "errors 2" in line
    assert f"best measured {1e9 / (1e-3 / 5) / 1e9:.1f} GFLOP/s" in line
    assert "eta 30s" in line  # 10 s for 5 trials, 15 left
    assert "model 5.0%" in line
    assert "[" not in line
    assert status_line(p).startswith("[#####...............]")


def test_on_a_tty_one_line_is_redrawn_with_carriage_returns() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, tty=True)
    bar(progress_after(3, 0))
    bar(progress_after(6, 1))
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.count("\n") == 1 and text.endswith("\n")
    assert "trials 6/20" in text.split("\r")[-1]


def test_off_a_tty_every_batch_is_a_plain_line() -> None:
    out = io.StringIO()
    bar = ProgressBar(out)  # StringIO is not a terminal
    bar(progress_after(3, 0))
    bar(progress_after(6, 1))
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 2
    assert "trials 3/20" in lines[0] and "trials 6/20" in lines[1] and "errors 1" in lines[1]
    assert bar.last is not None and bar.last.trials == 6


def test_the_final_report_counts_noisy_results_and_says_nothing_when_none() -> None:
    from kiln.cli.tune_op import report

    p = TuneProgress(total=4)
    results = [
        MeasureResult(Status.OK, (1e-3, 1e-3, 1e-3)),
        MeasureResult(Status.OK, (1e-3, 2e-3, 1e-3, 2e-3), noisy=True),
        MeasureResult(Status.OK, (2e-3,)),
    ]
    p.add([rec.Record(WL, "t", i, {}, r, 1e9, rec.now_iso()) for i, r in enumerate(results)])
    p.stop_reason = "trial budget reached"
    assert "1 noisy results (samples spread over 10% after measuring again" in report(p)
    p.history[1] = rec.Record(WL, "t", 1, {}, MeasureResult(Status.OK, (1e-3,)), 1e9, "t")
    assert "noisy" not in report(p)

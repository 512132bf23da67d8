"""`kiln tune-op` refuses bad tuning flags before it starts any pool (in-process, no sockets)."""

from __future__ import annotations

import pytest

from kiln import cli


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The stderr of a kiln command that must exit with status 2 (usage)."""
    with pytest.raises(SystemExit) as info:
        cli.main(list(argv))
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--resume"], "--resume needs --records"),
        (["--early-stop", "0"], "--early-stop must be >= 1, got 0"),
        (["--trials", "0"], "--trials must be >= 1, got 0"),
        (["--batch", "0"], "--batch must be >= 1, got 0"),
        (["--devices", "0"], "--devices must be >= 1, got 0"),
        (["--per-unit", "-1"], "--per-unit must be >= 1, got -1"),
        (["--tuner", "annealing"], "invalid choice: 'annealing'"),
        (["--target", "vax"], "--target: unknown target 'vax'; known: host, "),
        (["--records", "redis:///0"], "names no host"),
        (["--records", "ftp://h/0"], "directory ftp:/h does not exist"),  # a path, not a URL
        (["--records", "/nonexistent/dir/r.jsonl"], "directory /nonexistent/dir does not exist"),
    ],
)
def test_bad_tuning_flags_are_usage_errors(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    err = refused(capsys, "tune-op", "dense", "--shape", "8,8,8", *flags)
    assert message in err


def test_shapes_are_checked_by_the_template_behind_an_alias(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "no dimension may be negative" in refused(
        capsys, "tune-op", "dense", "--shape", "8,-8,8"
    )
    err = refused(capsys, "tune-op", "conv2d", "--shape", "1,8,8,8,8,3,3,1,1")
    assert "conv2d_nchwc workload is (N, IC, H, W, OC, KH, KW, stride, pad, epilogue)" in err
    assert "(conv2d is conv2d_nchwc)" in err
    assert "dense workload is (M, N, K)" in refused(capsys, "tune-op", "dense", "--shape", "8,8")


def test_kiln_tune_retires_stalled_tasks_by_default() -> None:
    """Model tuning stops feeding a task that has not improved in 200 trials, unless told."""
    from kiln.cli.network import NETWORK_EARLY_STOP

    parser = cli.build_parser()
    assert parser.parse_args(["tune", "m.onnx"]).early_stop == NETWORK_EARLY_STOP == 200
    assert parser.parse_args(["tune", "m.onnx", "--early-stop", "50"]).early_stop == 50
    assert parser.parse_args(["tune-op", "dense", "--shape", "8,8,8"]).early_stop is None


def test_the_cli_runs_numpys_blas_on_one_thread_unless_told_otherwise() -> None:
    """As benchmarks/models.py does before numpy loads: the demo times beside onnxruntime the
    same way. OpenMP is left alone (a local pool's agents inherit it for parallel kernels)."""
    import os
    import subprocess
    import sys

    code = "import os, kiln.cli; print(os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'))"
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["1", "None"]
    env["OPENBLAS_NUM_THREADS"] = "4"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split()[0] == "4"


def test_model_tuning_times_cold_where_the_weights_outgrow_the_caches() -> None:
    """`kiln tune` and `kiln demo` time each candidate as one call after a sweep that evicts the
    caches (as inside the model) where the model's parameters exceed the cache size, on a CPU;
    `--caches cold|warm` decides outright; `tune-op` and devices other than a CPU's time warm;
    a measurement flag given explicitly wins over either mode."""
    from kiln.cli.common import (
        AUTO_COLD_PARAM_BYTES,
        COLD_FLUSH_BYTES,
        COLD_REPEAT,
        WARM_MIN_REPEAT_MS,
        WARM_REPEAT,
        evaluator,
        times_cold,
    )

    parser = cli.build_parser()
    big, small = AUTO_COLD_PARAM_BYTES + 1, AUTO_COLD_PARAM_BYTES  # ResNet-18 46 MB; MobileNetV2 14

    def timing(argv: list[str], param_bytes: int = big, cpu: bool = True) -> tuple[int, float, int]:
        args = parser.parse_args(argv)
        e = evaluator(args, times_cold(args, cpu, param_bytes))
        return e.repeat, e.min_repeat_ms, e.flush_cache_bytes

    cold = (COLD_REPEAT, 0.0, COLD_FLUSH_BYTES)
    warm = (WARM_REPEAT, WARM_MIN_REPEAT_MS, 0)
    assert COLD_FLUSH_BYTES >= 2 * AUTO_COLD_PARAM_BYTES == 2 * 32 * 2**20
    assert timing(["tune", "m.onnx"]) == cold
    assert timing(["demo"]) == cold
    assert timing(["tune", "m.onnx"], small) == warm
    assert timing(["tune", "m.onnx", "--caches", "cold"], small) == cold
    assert timing(["tune", "m.onnx", "--caches", "warm"]) == warm
    assert timing(["tune", "m.onnx", "--caches", "cold"], cpu=False) == warm  # GPU, sim, emulator
    assert timing(["tune-op", "dense", "--shape", "8,8,8"]) == warm
    assert timing(["tune", "m.onnx", "--repeat", "4", "--flush-cache-bytes", "4096"]) == (
        4,
        0.0,
        4096,
    )
    assert timing(["tune", "m.onnx", "--caches", "warm", "--min-repeat-ms", "5"]) == (3, 5.0, 0)


def test_no_pipeline_where_the_local_devices_hold_every_core(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Builds and the search beside a measurement share its cores when the devices hold them
    all (kiln.pool.every_core_held): the CLI and the API then tune without a pipeline."""
    import argparse
    import os

    from kiln.api import _pipeline_fits
    from kiln.cli.common import fit_pipeline
    from kiln.pool import every_core_held
    from tuner.options import TuneOptions

    allowed = sorted(os.sched_getaffinity(0))
    every = ",".join(map(str, allowed))
    assert every_core_held([allowed]) and every_core_held([[c] for c in allowed])
    assert not every_core_held([])
    if len(allowed) > 1:
        assert not every_core_held([allowed[:-1]])

    piped = TuneOptions(pipeline=True)
    args = argparse.Namespace(cores=[every], tracker=None, devices=1)
    assert not fit_pipeline(args, piped).pipeline
    assert "not pipelining: the --cores sets hold every core" in capsys.readouterr().err
    assert fit_pipeline(argparse.Namespace(cores=None, tracker=None, devices=1), piped).pipeline

    class _Pool:
        def __init__(self, core_sets: tuple[tuple[int, ...], ...]) -> None:
            self.core_sets = core_sets

    assert not _pipeline_fits(_Pool((tuple(allowed),)), piped).pipeline  # type: ignore[arg-type]
    assert _pipeline_fits(_Pool(()), piped).pipeline  # type: ignore[arg-type]
    if len(allowed) > 1:
        some = argparse.Namespace(cores=[str(allowed[-1])], tracker=None, devices=1)
        assert fit_pipeline(some, piped).pipeline

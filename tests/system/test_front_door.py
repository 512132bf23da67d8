"""The front door: the README's notebook example runs, a wrong config never wins, a mistyped key
fails at once, and the device's tags decide the target. Real tracker and agent processes."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from kiln_cli import kiln

import compiler.ops as ops
from compiler import te
from compiler.ops.matmul import MatmulTemplate, _workload
from compiler.ops.space import Config
from compiler.schedule.schedule import Schedule, create_schedule
from kiln.pool import Pool
from protos import common_pb2, tracker_pb2
from tuner import records as rec
from tuner.loop import tune
from tuner.measure.builder import LocalBuilder
from tuner.measure.local_pool import LocalPool
from tuner.measure.tracker_client import TrackerClient
from tuner.options import TuneOptions
from tuner.search.base import RandomSearch
from tuner.task import Task

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_notebook_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's Python block (at most six lines) runs as written and finds a best config."""
    text = README.read_text()
    [code] = re.findall(r"<!-- notebook -->\n```python\n(.*?)```", text, re.S)
    assert len(code.strip().splitlines()) <= 6
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), scope)
    best = scope["best"]
    assert best.result.ok and best.gflops > 0
    assert [r for r in rec.load(tmp_path / "r.jsonl") if r.result.ok]  # the records it wrote


class BrokenMatmul(MatmulTemplate):
    """matmul whose unrolled configs drop the last k term: a wrong answer the check must catch."""

    name = "matmul_broken"

    def instantiate(self, shape: tuple[int, ...], config: Config) -> tuple[Schedule, list[Any]]:
        if not config["unroll"]:
            return super().instantiate(shape, config)
        m, n, k = _workload(shape)
        a = te.placeholder((m, k), "float32", name="A")
        b = te.placeholder((k, n), "float32", name="B")
        r = te.reduce_axis((0, k - 1), name="k")  # the bug
        c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
        return create_schedule(c), [a, b, c]


@pytest.fixture
def broken_template(monkeypatch: pytest.MonkeyPatch) -> Iterator[Task]:
    monkeypatch.setitem(ops._TEMPLATES, BrokenMatmul.name, BrokenMatmul())
    yield Task(rec.Workload(BrokenMatmul.name, (16, 16, 16)))


def _tune_broken(task: Task, check: bool) -> list[rec.Record]:
    size = len(task.space)
    with Pool() as pool, closing(pool.runner()) as runner:
        builder = LocalBuilder(target=pool.target, workers=1, per_unit=4)
        try:
            progress = tune(
                task,
                builder,
                runner,
                TuneOptions(trials=min(size, 32), batch_size=16, tuner="random", check=check),
                searcher=RandomSearch(size, seed=0),
            )
        finally:
            builder.close()
    assert progress.best is not None
    if check:
        assert not task.space.get(progress.best.config_index)["unroll"]
    return progress.history


def test_a_config_that_computes_the_wrong_answer_never_wins(broken_template: Task) -> None:
    history = _tune_broken(broken_template, check=True)
    unrolled = [r for r in history if r.knobs["unroll"]]
    assert unrolled and all(r.result.status.value == "WRONG_ANSWER" for r in unrolled)
    assert "differs from the reference" in unrolled[0].result.error
    assert all(r.result.ok for r in history if not r.knobs["unroll"])


def test_without_the_check_the_wrong_configs_pass_as_ok(broken_template: Task) -> None:
    """What the check guards against: unchecked, a wrong kernel is an OK record like any other."""
    history = _tune_broken(broken_template, check=False)
    assert all(r.result.ok for r in history)


def test_tune_op_gives_its_devices_back_when_it_returns() -> None:
    """A second call on the same pool gets the device at once, not after the lease's TTL."""
    import kiln

    options = TuneOptions(trials=4, batch_size=4, tuner="random")
    with Pool() as pool:
        kiln.tune_op(pool, "matmul", (16, 16, 16), options=options)
        assert pool.config is not None
        client = TrackerClient(pool.config.tracker, pool.config.token)
        try:
            [device] = client.list_devices(pool.config.key).devices
        finally:
            client.close()
        assert tracker_pb2.DeviceState.Name(device.state) == "FREE"


def test_a_mistyped_key_fails_at_once_through_the_cli(tmp_path: Path) -> None:
    with LocalPool(key="sys-cpu") as pool:
        started = time.monotonic()
        out = kiln(
            "tune-op",
            "matmul",
            "--shape",
            "16,16,16",
            "--tracker",
            pool.tracker_address,
            "--key",
            "sys-cpux",
            "--token-file",
            str(pool.secrets_path),
            "--records",
            str(tmp_path / "r.jsonl"),
        )
        elapsed = time.monotonic() - started
    assert out.returncode == 1, out.stderr
    assert "no registered device matches key='sys-cpux'" in out.stderr
    assert "Traceback" not in out.stderr
    # 0.3 s here, process start included; the acquire timeout it must not wait for is 60 s
    assert elapsed < 5
    assert not (tmp_path / "r.jsonl").exists()


def test_a_new_local_pool_answers_an_unknown_key_at_once() -> None:
    """A local pool's tracker runs with --startup-grace-s 0 (its agents registered before it is
    handed out): an Acquire for a key nobody registered is NO_DEVICE at once, not after the
    10 s a restarted tracker gives its agents."""
    with LocalPool(key="sys-cpu") as pool:
        client = TrackerClient(pool.tracker_address, pool.client_token)
        try:
            started = time.monotonic()
            reply = client.acquire("sys-cpux", {}, "test", 0, timeout_s=30.0, lease_ttl_s=10.0)
            elapsed = time.monotonic() - started
        finally:
            client.close()
    assert reply.status == common_pb2.NO_DEVICE
    assert "no registered device matches key='sys-cpux'" in reply.reason
    assert elapsed < 5.0


def test_the_device_decides_the_target_and_a_wrong_one_is_refused() -> None:
    with LocalPool(key="sys-cpu") as local:
        common = {"key": "sys-cpu", "token_file": local.secrets_path}
        with Pool(local.tracker_address, **common) as pool:  # type: ignore[arg-type]
            assert pool.target == "host"  # a device of this machine's kind
            assert pool.device_tags["backend"] == "cpu" and "features" in pool.device_tags
        with pytest.raises(ValueError, match=r"aarch64-neon \(aarch64\) cannot run on device"):
            Pool(local.tracker_address, target="aarch64-neon", **common).open()  # type: ignore[arg-type]

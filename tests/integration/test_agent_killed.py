"""An agent SIGKILLed in the middle of a measurement: its candidate is DEVICE_LOST, and the tuner's
PoolRunner completes the remaining candidates on the other agent. Real tracker and agent processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from kit_artifacts import kit_artifact

from compiler.artifact import Artifact
from device_agent.testing import (
    build_kernels,
    child_pids,
    cpu_ticks,
    wait_for_ready_file,
    wait_until_idle,
)
from protos import tracker_pb2, tracker_pb2_grpc
from tuner.measure import EvaluatorConfig, MeasureResult, Status
from tuner.measure.pool_runner import PoolConfig, PoolRunner

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

PROJECT_ROOT = Path(__file__).resolve().parents[2]
START_S = 30.0
KEY = "kill-test"


def artifact(data: bytes, first: str) -> Artifact:
    """The test kernels as a tuner artifact whose first entry (the one measured) is `first`."""
    return kit_artifact(data, first)


def spawn(args: list[str], ready: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args, "--ready-file", str(ready)],
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, wait_for_ready_file(proc, str(ready), START_S)


def device_states(tracker: str) -> dict[str, int]:
    with grpc.insecure_channel(tracker) as channel:
        reply = tracker_pb2_grpc.TrackerStub(channel).ListDevices(
            tracker_pb2.ListDevicesRequest(key=KEY), timeout=5.0
        )
    return {d.spec.agent_address: d.state for d in reply.devices}


def wait_for(condition: object, timeout_s: float = START_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_killed_agent_gives_device_lost_and_the_run_continues_elsewhere(tmp_path: Path) -> None:
    data, _ = build_kernels(str(tmp_path))
    hang, ok = artifact(data, "hang"), artifact(data, "add_one")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        tracker_proc, tracker = spawn(
            ["-m", "tracker", "--listen", "127.0.0.1:0", "--heartbeat-interval-s", "0.3"],
            tmp_path / "tracker.ready",
            tmp_path / "tracker.log",
        )
        procs.append(tracker_proc)
        agents: dict[str, subprocess.Popen[bytes]] = {}
        for i in range(2):
            cache = str(tmp_path / f"cache{i}")
            proc, address = spawn(
                ["-m", "device_agent", "--tracker", tracker, "--key", KEY, "--cache-dir", cache],
                tmp_path / f"agent{i}.ready",
                tmp_path / f"agent{i}.log",
            )
            procs.append(proc)
            agents[address] = proc
        assert wait_for(lambda: len(device_states(tracker)) == 2)

        evaluator = EvaluatorConfig(warmup=0, repeat=2, min_repeat_ms=0.0, timeout_s=60.0)
        runner = PoolRunner(
            PoolConfig(tracker=tracker, key=KEY, acquire_timeout_s=20.0, lease_ttl_s=10.0),
            evaluator,
            retry_lost=False,  # the hang kernel would only hang again on the survivor
        )
        try:
            # Executor children still importing would look busy: start from idle ones.
            children = [c for p in agents.values() for c in child_pids(p.pid)]
            assert len(children) == 2 and wait_until_idle(children)
            baseline = {c: cpu_ticks(c) for c in children}
            first: list[MeasureResult] = []
            thread = threading.Thread(target=lambda: first.extend(runner.run([hang])))
            thread.start()

            def leased() -> str | None:
                states = device_states(tracker)
                return next((a for a, s in states.items() if s == tracker_pb2.LEASED), None)

            assert wait_for(lambda: leased() is not None), f"nothing leased; {first}"
            victim = leased()
            assert victim is not None
            # The hang kernel spins in the victim's executor child: the Measure is running.
            [child] = child_pids(agents[victim].pid)
            spinning = wait_for(lambda: cpu_ticks(child) - baseline.get(child, 0) >= 20)
            assert spinning, f"the leased agent's executor never ran the kernel; {first}"
            os.kill(agents[victim].pid, signal.SIGKILL)
            agents[victim].wait(timeout=START_S)
            thread.join(timeout=START_S)
            assert not thread.is_alive()
            [lost] = first
            assert lost.status is Status.DEVICE_LOST, lost.error
            assert victim in lost.error

            # Once the tracker has noticed, every remaining candidate runs on the survivor.
            gone = wait_for(lambda: device_states(tracker).get(victim) in (None, tracker_pb2.LOST))
            assert gone, f"tracker still lists {victim}: {device_states(tracker)}"
            rest = runner.run([ok, ok, ok])
        finally:
            runner.close()
        assert [r.status for r in rest] == [Status.OK] * 3, [r.error for r in rest]
        survivor = next(a for a in agents if a != victim)
        assert all(len(r.samples_s) in (2, 4) for r in rest)  # 4: a noisy one measured again
        assert {r.device_id for r in rest} != {lost.device_id}
        assert device_states(tracker)[survivor] in (tracker_pb2.FREE, tracker_pb2.LEASED)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=15.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15.0)

"""The executor under stress, on real processes: parent-death kill, core pinning, one job at a time
per device, fast respawn after a crash, quarantine, and the cache bound with artifacts in use."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from device_agent import serde
from device_agent.__main__ import parse_pin_cores
from device_agent.agent import Agent
from device_agent.cache import footprint
from device_agent.config import AgentConfig
from device_agent.domain import ArtifactMeta
from device_agent.server import AgentServer, create_server
from device_agent.testing import (
    build_kernels,
    child_pids,
    is_gone,
    upload_chunks,
    wait_for_ready_file,
    wait_until_idle,
    wait_until_spinning,
)
from protos import agent_pb2, agent_pb2_grpc, common_pb2

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

RPC_S = 30.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CORES = sorted(os.sched_getaffinity(0))


@dataclass
class Env:
    server: AgentServer
    stub: agent_pb2_grpc.AgentStub
    agent: Agent
    data: bytes
    meta: ArtifactMeta

    def device(self, i: int = 0) -> str:
        return self.agent.devices[i].device_id

    def measure(self, symbol: str, device: int = 0, **config: Any) -> common_pb2.MeasureResult:
        request = agent_pb2.MeasureRequest(
            device_id=self.device(device),
            artifact_sha256=self.meta.sha256,
            symbol=symbol,
            config=common_pb2.EvaluatorConfig(**{"repeat": 2, **config}),
        )
        return self.stub.Measure(request, timeout=RPC_S)

    def run(self, symbol: str, device: int = 0, timeout: float = RPC_S) -> agent_pb2.RunResponse:
        request = agent_pb2.RunRequest(
            device_id=self.device(device), artifact_sha256=self.meta.sha256, symbol=symbol
        )
        return self.stub.Run(request, timeout=timeout)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, ArtifactMeta]:
    return build_kernels(str(tmp_path_factory.mktemp("kernels")))


def start(tmp_path: Path, kernels: tuple[bytes, ArtifactMeta], **overrides: object) -> Env:
    data, meta = kernels
    config = AgentConfig(
        **{"key": "ex", "devices": 2, "cache_dir": str(tmp_path / "cache"), **overrides}  # type: ignore[arg-type]
    )
    server, port, agent = create_server("127.0.0.1:0", config)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = agent_pb2_grpc.AgentStub(channel)
    stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
    return Env(server, stub, agent, data, meta)


@pytest.fixture
def env(tmp_path: Path, kernels: tuple[bytes, ArtifactMeta]) -> Iterator[Env]:
    e = start(tmp_path, kernels, pin_cores=(CORES[0], CORES[-1]))
    with e.server:
        yield e


def cpus_allowed(pid: int) -> str:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def test_executor_children_are_pinned_and_stay_pinned_after_respawn(env: Env) -> None:
    pids = env.agent.executor_pids()
    assert [cpus_allowed(pids[env.device(i)] or -1) for i in range(2)] == [
        str(CORES[0]),
        str(CORES[-1]),
    ]
    assert env.measure("crash", device=1).status == common_pb2.CRASH
    new_pid = env.agent.executor_pids()[env.device(1)]
    assert new_pid is not None and new_pid != pids[env.device(1)]
    assert cpus_allowed(new_pid) == str(CORES[-1])
    assert parse_pin_cores("auto", 3) == tuple(CORES[i % len(CORES)] for i in range(3))
    with pytest.raises(ValueError, match="not usable"):
        parse_pin_cores("4096", 1)


def test_one_job_at_a_time_per_device(env: Env) -> None:
    """Two concurrent Runs of a kernel that stamps its start and end: the intervals never overlap."""
    results: list[agent_pb2.RunResponse] = []
    measures: list[common_pb2.MeasureResult] = []
    lock = threading.Lock()

    def run_one() -> None:
        r = env.run("stamp")
        m = env.measure("add_one")
        with lock:
            results.append(r)
            measures.append(m)

    threads = [threading.Thread(target=run_one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=RPC_S)
    assert len(results) == 2 and all(r.status == common_pb2.OK for r in results)
    assert all(m.status == common_pb2.OK for m in measures)
    (a0, a1), (b0, b1) = sorted(tuple(serde.ndarray_from_pb(r.outputs[0])) for r in results)
    assert a0 < a1 <= b0 < b1, "two jobs ran at once on one device"


def test_the_next_request_is_answered_within_a_second_after_a_crash(env: Env) -> None:
    for symbol, signum in (("crash", signal.SIGSEGV), ("aborts", signal.SIGABRT)):
        result = env.measure(symbol)
        assert result.status == common_pb2.CRASH and result.signal == signum
        # The deadline is the requirement: the respawned executor serves at once.
        ok = env.run("add_one", timeout=1.0)
        assert ok.status == common_pb2.OK, ok.error


def test_quarantine_refuses_without_running(env: Env) -> None:
    assert env.measure("crash").status == common_pb2.CRASH
    assert env.run("crash", device=1).status == common_pb2.CRASH  # counted across devices
    assert env.measure("crash").status == common_pb2.CRASH
    pid = env.agent.executor_pids()[env.device(0)]
    refused = env.measure("crash")
    assert refused.status == common_pb2.RUNTIME_ERROR
    assert refused.error.startswith("quarantined:") and "3 times" in refused.error
    run = env.run("crash", device=1)  # the quarantine is per artifact entry, on every device
    assert run.status == common_pb2.RUNTIME_ERROR and "quarantined" in run.error
    assert env.agent.executor_pids()[env.device(0)] == pid, "the executor ran it anyway"
    assert env.measure("add_one").status == common_pb2.OK  # its sibling still runs


def test_an_artifact_in_use_survives_eviction(
    tmp_path: Path, kernels: tuple[bytes, ArtifactMeta]
) -> None:
    data, meta = kernels
    # Room for two artifacts, not three (their meta files count too).
    bound = 2 * footprint(meta) + 100
    e = start(tmp_path, kernels, devices=1, cache_max_bytes=bound)
    with e.server:
        pid = e.agent.executor_pids()[e.device()]
        assert pid is not None
        assert wait_until_idle([pid])  # so that spinning below means the kernel, not imports
        hung = e.stub.Measure.future(
            agent_pb2.MeasureRequest(
                device_id=e.device(),
                artifact_sha256=meta.sha256,
                symbol="hang",
                config=common_pb2.EvaluatorConfig(timeout_s=20.0),
            ),
            timeout=RPC_S,
        )
        try:
            assert wait_until_spinning(pid)
            others = []
            for i in (1, 2):
                pb = serde.meta_to_pb(meta)
                other = data + bytes(i)
                pb.sha256, pb.size_bytes = hashlib.sha256(other).hexdigest(), len(other)
                e.stub.Upload(upload_chunks(other, pb), timeout=RPC_S)
                others.append(pb.sha256)
            # The hung artifact is the least recently used, but in use: the next one went.
            present = [
                e.stub.Has(agent_pb2.HasRequest(sha256=s), timeout=RPC_S).present for s in others
            ]
            assert present == [False, True]
            assert os.path.exists(tmp_path / "cache" / meta.sha256)
        finally:
            hung.cancel()
    # A restarted agent re-reads the bounded cache.
    again = start(tmp_path, kernels, devices=1, cache_max_bytes=bound)
    with again.server:
        assert again.agent.cache.total_bytes <= bound
        assert again.stub.Has(agent_pb2.HasRequest(sha256=others[1]), timeout=RPC_S).present
        assert again.measure("add_one").status == common_pb2.OK


def test_a_hung_kernel_dies_with_a_sigkilled_agent(
    tmp_path: Path, kernels: tuple[bytes, ArtifactMeta]
) -> None:
    data, meta = kernels
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "device_agent",
            "--key",
            "doomed",
            "--listen",
            "127.0.0.1:0",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--ready-file",
            str(ready),
        ],
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    executors: list[int] = []
    try:
        address = wait_for_ready_file(proc, str(ready))
        with grpc.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
            info = stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S)
            executors = child_pids(proc.pid)
            assert len(executors) == 1 and wait_until_idle(executors)
            hung = stub.Measure.future(
                agent_pb2.MeasureRequest(
                    device_id=info.devices[0].device_id,
                    artifact_sha256=meta.sha256,
                    symbol="hang",
                    config=common_pb2.EvaluatorConfig(timeout_s=120.0),
                ),
                timeout=RPC_S,
            )
            assert wait_until_spinning(executors[0])
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=RPC_S)
            with pytest.raises(grpc.RpcError):
                hung.result(timeout=RPC_S)
        deadline = time.monotonic() + 10.0
        while not is_gone(executors[0]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert is_gone(executors[0]), "the hung executor outlived its SIGKILLed agent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=RPC_S)
        for pid in executors:  # only if the test failed: never leave a spinning child behind
            if not is_gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_outputs_of_the_stamp_kernel_are_int64(env: Env) -> None:
    out = serde.ndarray_from_pb(env.run("stamp").outputs[0])
    assert out.dtype == np.int64 and out.shape == (2,) and out[1] > out[0]

"""Waiting for a busy device costs no thread, and no job outlives its lease or the agent's cap.

(a) A real `kiln-agent` process with a kernel hung on device /0 and 30 Measures queued behind it
by clients that then leave: device /1 still answers at once, the agent's thread count does not
grow with the waiters, and no abandoned waiter runs once the hang ends (the respawned executor
child keeps its pid across the next Measure). (b) A secured in-process agent kills a hang asked
to run for 1e6 s when its lease ends, and a request waiting behind it gives up when its own lease
ends. (c) `max_job_s` caps a dev-mode job; the flag is checked. Every wait here is bounded.
"""

from __future__ import annotations

import gc
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from device_agent import serde
from device_agent.__main__ import config_from_args, parse_args
from device_agent.config import AgentConfig
from device_agent.domain import ArtifactMeta
from device_agent.server import create_server
from device_agent.testing import (
    build_kernels,
    child_pids,
    cpu_ticks,
    is_gone,
    thread_count,
    upload_chunks,
    wait_for_ready_file,
    wait_until_idle,
)
from protos import agent_pb2, agent_pb2_grpc, common_pb2
from protos.auth import Role, call_metadata, write_secrets
from protos.fencing import LeaseClaims, sign

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

RPC_S = 30.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]
WAITERS = 30
HANG_S = 4.0
# The job pool's most threads for two devices (one per device and four spare), plus two for
# whatever gRPC starts under load: a bound that does not depend on the number of waiters.
THREAD_BOUND = 2 + 4 + 2


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, ArtifactMeta]:
    return build_kernels(str(tmp_path_factory.mktemp("kernels")))


def measure_request(
    device: str, sha: str, symbol: str, timeout_s: float, lease: tuple[str, str] = ("", "")
) -> agent_pb2.MeasureRequest:
    """A Measure of `symbol`; `lease` is (lease id, token)."""
    return agent_pb2.MeasureRequest(
        device_id=device,
        artifact_sha256=sha,
        symbol=symbol,
        config=common_pb2.EvaluatorConfig(repeat=2, timeout_s=timeout_s),
        lease_id=lease[0],
        lease_token=lease[1],
    )


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    ready = tmp_path / "ready"
    with open(tmp_path / "agent.log", "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "device_agent",
                "--key",
                "waiters",
                "--devices",
                "2",
                "--cache-dir",
                str(tmp_path / "cache"),
                "--ready-file",
                str(ready),
            ],
            cwd=PROJECT_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    children: list[int] = []
    try:
        yield proc, wait_for_ready_file(proc, str(ready))
    finally:
        children = child_pids(proc.pid)
        proc.terminate()
        try:
            proc.wait(timeout=RPC_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=RPC_S)
        deadline = time.monotonic() + 10.0
        while not all(is_gone(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.02)


def spinning_child(children: list[int], timeout_s: float = RPC_S) -> int:
    """The one of `children` that starts burning CPU (the executor running the hang kernel)."""
    start = {c: cpu_ticks(c) for c in children}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in children:
            if cpu_ticks(c) - start[c] >= 20:
                return c
        time.sleep(0.02)
    raise AssertionError("no executor child ran the hang kernel")


def test_abandoned_waiters_hold_no_thread_and_never_run(
    agent_process: tuple[subprocess.Popen[bytes], str], kernels: tuple[bytes, ArtifactMeta]
) -> None:
    proc, address = agent_process
    data, meta = kernels
    with grpc.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
        info = stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S)
        dev0, dev1 = (d.device_id for d in info.devices)
        children = child_pids(proc.pid)
        assert len(children) == 2 and wait_until_idle(children)
        ok = stub.Measure(measure_request(dev1, meta.sha256, "add_one", 5.0), timeout=RPC_S)
        assert ok.status == common_pb2.OK, ok.error
        threads_before = thread_count(proc.pid)

        hung = stub.Measure.future(
            measure_request(dev0, meta.sha256, "hang", HANG_S), timeout=RPC_S
        )
        hung_child = spinning_child(children)
        # Had any of them run, it would spin (or, cancelled, kill) the next executor child.
        waiters = [
            stub.Measure.future(measure_request(dev0, meta.sha256, "hang", 20.0), timeout=RPC_S)
            for _ in range(WAITERS)
        ]
        time.sleep(0.5)  # they reach the agent and queue for device /0
        assert not any(w.done() for w in waiters) and not hung.done()
        threads_waiting = thread_count(proc.pid)
        started = time.monotonic()
        stub.Info(agent_pb2.InfoRequest(), timeout=1.0)
        other = stub.Measure(measure_request(dev1, meta.sha256, "add_one", 5.0), timeout=1.0)
        assert other.status == common_pb2.OK, other.error
        assert time.monotonic() - started < 1.0
        assert threads_waiting <= threads_before + THREAD_BOUND, (
            f"{threads_before} threads idle, {threads_waiting} with {WAITERS} waiters"
        )
        for w in waiters:
            w.cancel()

        timed_out = hung.result(timeout=RPC_S)
        assert timed_out.status == common_pb2.TIMEOUT, timed_out.error
        assert f"ran past {HANG_S:g} s" in timed_out.error
        assert is_gone(hung_child)
        [fresh] = [c for c in child_pids(proc.pid) if c not in children]
        # Were a waiter to run now, it would find this idle child and spin it.
        assert wait_until_idle([fresh], quiet_s=1.0)
        good = stub.Measure(measure_request(dev0, meta.sha256, "add_one", 5.0), timeout=RPC_S)
        assert good.status == common_pb2.OK, good.error
        assert fresh in child_pids(proc.pid) and wait_until_idle([fresh])
        assert proc.poll() is None


def test_a_hang_is_killed_when_its_lease_ends(
    tmp_path: Path, kernels: tuple[bytes, ArtifactMeta]
) -> None:
    data, meta = kernels
    secrets = write_secrets(tmp_path / "pool.secrets")
    client = call_metadata(secrets.token(Role.CLIENT))
    leeway_s, ttl_s = 0.5, 3.0
    config = AgentConfig(
        key="leased",
        cache_dir=str(tmp_path / "cache"),
        secrets=secrets,
        lease_leeway_s=leeway_s,
    )
    server, port, agent = create_server("127.0.0.1:0", config)
    device = agent.devices[0].device_id
    fence = [0]

    def lease(name: str, ttl: float) -> tuple[tuple[str, str], float]:
        """(lease id, a token for it with the next fence), and when it expires."""
        fence[0] += 1
        expires = time.time() + ttl
        claims = LeaseClaims(name, device, fence[0], int(expires * 1000))
        return (name, sign(secrets.require_lease_key(), claims)), expires

    with server, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S, metadata=client)
        first, expires = lease("first", ttl_s)
        hung = stub.Measure.future(
            measure_request(device, meta.sha256, "hang", 1e6, first),
            timeout=RPC_S,
            metadata=client,
        )
        time.sleep(0.3)
        # A later holder's lease that ends while the hang still holds the device: it stops waiting.
        short, short_expires = lease("short", 0.5)
        waited = stub.Measure(
            measure_request(device, meta.sha256, "add_one", 5.0, short),
            timeout=RPC_S,
            metadata=client,
        )
        assert waited.status == common_pb2.UNAUTHORIZED, waited.error
        assert "ended while the request waited" in waited.error
        assert time.time() <= short_expires + leeway_s + 1.0

        killed = hung.result(timeout=ttl_s + leeway_s + RPC_S)
        ended = time.time()
        assert killed.status == common_pb2.TIMEOUT, killed.error
        assert "lease 'first'" in killed.error and "expired while the job ran" in killed.error
        assert expires - leeway_s <= ended <= expires + leeway_s + 2.0

        after, _ = lease("after", 60.0)
        started = time.monotonic()
        served = stub.Measure(
            measure_request(device, meta.sha256, "add_one", 5.0, after),
            timeout=2.0,
            metadata=client,
        )
        assert served.status == common_pb2.OK, served.error
        assert time.monotonic() - started < 2.0


def test_max_job_s_caps_a_dev_mode_job_and_nothing_is_left_behind(
    tmp_path: Path, kernels: tuple[bytes, ArtifactMeta]
) -> None:
    data, meta = kernels
    before = set(threading.enumerate())
    config = AgentConfig(key="capped", cache_dir=str(tmp_path / "cache"), max_job_s=1.0)
    server, port, agent = create_server("127.0.0.1:0", config)
    device = agent.devices[0].device_id
    with server, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
        for timeout_s in (0.0, 1e6):  # the default timeout (60 s), and a huge one
            started = time.monotonic()
            capped = stub.Measure(
                measure_request(device, meta.sha256, "hang", timeout_s), timeout=RPC_S
            )
            assert capped.status == common_pb2.TIMEOUT, capped.error
            assert "ran past the agent's cap of 1 s" in capped.error
            assert time.monotonic() - started < 1.0 + 3.0
        ran = stub.Run(
            agent_pb2.RunRequest(
                device_id=device, artifact_sha256=meta.sha256, symbol="hang", timeout_s=1e6
            ),
            timeout=RPC_S,
        )
        assert ran.status == common_pb2.TIMEOUT and "cap of 1 s" in ran.error
    assert server.wait(0.0)
    gc.collect()  # grpc's poller thread ends with the last aio server object
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert [n for n in left if "spawner" not in n] == []

    with pytest.raises(ValueError, match="max_job_s"):
        AgentConfig(max_job_s=0.0)
    with pytest.raises(SystemExit):
        parse_args(["--key", "k", "--max-job-s", "0"])
    assert config_from_args(parse_args(["--key", "k", "--max-job-s", "2.5"])).max_job_s == 2.5

"""The tuner's PoolRunner against a real local pool: tracker and agent processes on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tls_certs import make_certs

from protos import agent_pb2, agent_pb2_grpc, common_pb2
from protos.auth import Role, TlsFiles, call_metadata, open_channel, write_secrets
from tracker.model import DeviceSpec, LeaseRequest
from tracker.server import create_server
from tuner.measure import EvaluatorConfig, Status
from tuner.measure.builder import build_one
from tuner.measure.local_pool import LocalPool
from tuner.measure.pool_runner import PoolConfig, PoolRunner
from tuner.measure.tracker_client import ACQUIRE_RETRY_CAP_S, TrackerClient
from tuner.records import Workload

FAST = EvaluatorConfig(repeat=2, min_repeat_ms=1.0, timeout_s=10.0)


@pytest.fixture(scope="module")
def pool() -> Iterator[LocalPool]:
    with LocalPool(key="it-cpu", agents=1) as p:
        yield p


def test_measures_a_compiled_matmul_and_uploads_it_once(pool: LocalPool) -> None:
    built = build_one(Workload("matmul", (48, 40, 24)), 0, "host")
    assert built.artifact is not None, built.error
    runner = PoolRunner(
        PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token), FAST
    )
    try:
        first, second = runner.run([built.artifact, built.artifact])
    finally:
        runner.close()
    for r in (first, second):
        assert r.status is Status.OK, r.error
        assert len(r.samples_s) in (2, 4) and all(s > 0 for s in r.samples_s)  # 4: noisy, again
        assert r.device_id.endswith("/0")
    cache = pool.workdir / "cache0"
    stored = [p for p in cache.rglob("*") if p.name.startswith(built.artifact.sha256[:16])]
    assert stored, f"artifact not in agent cache {sorted(cache.rglob('*'))}"


def test_a_runner_that_sweeps_the_caches_marks_its_results_cold(pool: LocalPool) -> None:
    """Records keep the mark (`result.caches`), so a cold time is never compared with a warm one."""
    built = build_one(Workload("matmul", (48, 40, 24)), 0, "host")
    assert built.artifact is not None, built.error
    config = PoolConfig(tracker=pool.tracker_address, key=pool.key, token=pool.client_token)
    cold = EvaluatorConfig(repeat=2, min_repeat_ms=1.0, timeout_s=10.0, flush_cache_bytes=1 << 20)
    for evaluator, want in ((FAST, False), (cold, True)):
        runner = PoolRunner(config, evaluator)
        try:
            [result] = runner.run([built.artifact])
        finally:
            runner.close()
        assert result.status is Status.OK, result.error
        assert result.cold is want


def test_an_artifact_the_agent_evicted_is_uploaded_again() -> None:
    # The runner asks Has only once per (agent, artifact); later Measures go straight out. Here the
    # agent's cache holds one artifact at a time, so measuring b evicts a, and the third Measure
    # (of a) must come back "missing", be re-uploaded and measured, not end as LOAD_ERROR.
    a, b = (build_one(Workload("matmul", (n, 16, 16)), 0, "host") for n in (16, 24))
    assert a.artifact is not None and b.artifact is not None
    one = max(len(a.artifact.data), len(b.artifact.data))
    extra = ("--cache-max-bytes", str(int(one * 1.5)))
    with LocalPool(key="evicting", agents=1, extra_agent_args=extra) as p:
        runner = PoolRunner(
            PoolConfig(tracker=p.tracker_address, key=p.key, token=p.client_token), FAST
        )
        try:
            results = runner.run([a.artifact, b.artifact, a.artifact])
        finally:
            runner.close()
        cached = {f.name[:16] for f in (p.workdir / "cache0").rglob("*")}
    assert [r.status for r in results] == [Status.OK] * 3, [r.error for r in results]
    assert a.artifact.sha256[:16] in cached and b.artifact.sha256[:16] not in cached


def test_a_lease_kept_past_its_ttl_is_replaced_not_an_error(
    pool: LocalPool, caplog: pytest.LogCaptureFixture
) -> None:
    # After tuning, `kiln demo` builds the model (longer than a lease TTL) and then runs it on
    # the pool: the lease kept from the last batch has lapsed by then, and the run must take a
    # new one instead of failing with "the lease ended".
    built = build_one(Workload("matmul", (16, 16, 16)), 0, "host")
    assert built.artifact is not None
    config = PoolConfig(
        tracker=pool.tracker_address, key=pool.key, token=pool.client_token, lease_ttl_s=1.0
    )
    runner = PoolRunner(config, FAST)
    try:
        [first] = runner.run([built.artifact])
        assert first.status is Status.OK, first.error
        kept = runner.device_tags()[0]
        time.sleep(2.5)  # the kept lease expires (the tracker reaps it)
        with caplog.at_level(logging.INFO, logger="tuner.measure.pool_runner"):
            again = runner.measure_entry(built.artifact, built.artifact.entries[0].symbol)
            time.sleep(2.5)  # and again, before a batch (a tuner building its next candidates)
            [batch] = runner.run([built.artifact])
    finally:
        runner.close()
    assert again.status is Status.OK, again.error
    assert batch.status is Status.OK, batch.error
    assert again.device_id == kept  # the pool's only device, leased anew
    # an idle lease lapsing is expected: said at info, not warned about as a lost lease
    lapsed = [r for r in caplog.records if "lost" in r.getMessage()]
    assert len(lapsed) == 2 and all(r.levelno == logging.INFO for r in lapsed), caplog.text


def test_unknown_key_gives_no_device_within_the_deadline(pool: LocalPool) -> None:
    built = build_one(Workload("matmul", (8, 8, 8)), 0, "host")
    assert built.artifact is not None
    runner = PoolRunner(
        PoolConfig(
            tracker=pool.tracker_address,
            key="no-such-key",
            token=pool.client_token,
            acquire_timeout_s=0.5,
        ),
        FAST,
    )
    try:
        [result] = runner.run([built.artifact])
    finally:
        runner.close()
    assert result.status is Status.NO_DEVICE
    assert "no-such-key" in result.error


def test_a_killed_agent_yields_results_not_a_hang() -> None:
    built = build_one(Workload("matmul", (16, 16, 16)), 0, "host")
    assert built.artifact is not None
    with LocalPool(key="doomed", agents=1, heartbeat_interval_s=0.3) as p:
        runner = PoolRunner(
            PoolConfig(
                tracker=p.tracker_address, key=p.key, token=p.client_token, acquire_timeout_s=2.0
            ),
            FAST,
        )
        try:
            [ok] = runner.run([built.artifact])
            assert ok.status is Status.OK, ok.error
            os.kill(p.procs[1].pid, signal.SIGKILL)
            p.procs[1].wait(10)
            started = time.monotonic()
            results = runner.run([built.artifact, built.artifact])
        finally:
            runner.close()
        assert time.monotonic() - started < 30
        assert results[0].status is Status.DEVICE_LOST
        assert results[1].status in (Status.NO_DEVICE, Status.DEVICE_LOST)


# -- a secured pool: token auth and TLS on tracker and agent ------------------------------------


def _spawn(workdir: Path, name: str, args: list[str], procs: list[subprocess.Popen[bytes]]) -> str:
    """Start `python <args> --ready-file F` (appended to `procs`); the first line it writes."""
    ready = workdir / f"{name}.ready"
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *args, "--ready-file", str(ready)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    procs.append(proc)
    deadline = time.monotonic() + 30
    while not ready.exists():
        output = (workdir / f"{name}.log").read_text(errors="replace")
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{output}"
        assert time.monotonic() < deadline, f"{name} never became ready:\n{output}"
        time.sleep(0.02)
    return ready.read_text().splitlines()[0]


@pytest.fixture(scope="module")
def secured_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, str]]:
    """(tracker address, certs dir, client token) of a TLS + token pool with one null device."""
    workdir = tmp_path_factory.mktemp("secured")
    certs = make_certs(workdir)
    secrets_path = workdir / "pool.secrets"
    secrets = write_secrets(secrets_path)
    server_tls = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        tracker = _spawn(
            workdir,
            "tracker",
            ["-m", "tracker", "--listen", "127.0.0.1:0", "--token-file", str(secrets_path),
             *server_tls],
            procs,
        )  # fmt: skip
        _spawn(
            workdir,
            "agent",
            ["-m", "device_agent", "--tracker", tracker, "--key", "secure", "--backend", "null",
             "--listen", "127.0.0.1:0", "--token-file", str(secrets_path), *server_tls,
             "--tracker-tls-ca", str(certs / "ca.pem"), "--lease-leeway-s", "0",
             "--cache-dir", str(workdir / "cache")],
            procs,
        )  # fmt: skip
        client = TrackerClient(
            tracker, secrets.token(Role.CLIENT), TlsFiles(ca=str(certs / "ca.pem"))
        )
        try:
            deadline = time.monotonic() + 30
            while not client.list_devices("secure").devices:
                assert time.monotonic() < deadline, "the agent never registered"
                time.sleep(0.05)
        finally:
            client.close()
        yield tracker, certs, secrets.token(Role.CLIENT)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_secured_pool_measures_and_each_renewal_brings_a_token_the_agent_accepts(
    secured_pool: tuple[str, Path, str],
) -> None:
    tracker, certs, token = secured_pool
    built = build_one(Workload("matmul", (8, 8, 8)), 0, "host")
    assert built.artifact is not None, built.error
    tls = TlsFiles(ca=str(certs / "ca.pem"))
    ttl_s = 1.0
    runner = PoolRunner(
        PoolConfig(tracker=tracker, key="secure", token=token, tls=tls, lease_ttl_s=ttl_s), FAST
    )
    try:
        results = []
        started = time.monotonic()
        # Runs spread over several TTLs: a runner that kept its first token would be refused
        # once that token expired (the agent allows no clock leeway here).
        for _ in range(40):
            results.extend(runner.run([built.artifact]))
            if time.monotonic() - started > 3 * ttl_s:
                break
            time.sleep(ttl_s / 4)
    finally:
        runner.close()
    assert time.monotonic() - started > 3 * ttl_s, "the loop ended before the tokens would expire"
    assert [r.status for r in results] == [Status.OK] * len(results), [r.error for r in results]
    assert len({r.device_id for r in results}) == 1


def test_secured_agent_refuses_an_expired_lease_token(secured_pool: tuple[str, Path, str]) -> None:
    """The control for the test above: the agent does check expiry."""
    tracker, certs, token = secured_pool
    tls = TlsFiles(ca=str(certs / "ca.pem"))
    client = TrackerClient(tracker, token, tls)
    try:
        lease = client.acquire("secure", {}, "tester", 0, 10.0, 0.3).lease
        time.sleep(0.6)
        with open_channel(lease.device.agent_address, tls) as channel:
            reply = agent_pb2_grpc.AgentStub(channel).Measure(
                agent_pb2.MeasureRequest(
                    device_id=lease.device.device_id,
                    lease_id=lease.lease_id,
                    lease_token=lease.token,
                    artifact_sha256="0" * 64,
                    symbol="main",
                ),
                timeout=10,
                metadata=call_metadata(token),
            )
    finally:
        client.close()
    assert reply.status == common_pb2.UNAUTHORIZED
    assert "expired" in reply.error


def test_secured_pool_without_token_or_tls_gets_clear_errors(
    secured_pool: tuple[str, Path, str],
) -> None:
    tracker, certs, token = secured_pool
    built = build_one(Workload("matmul", (8, 8, 8)), 0, "host")
    assert built.artifact is not None
    tls = TlsFiles(ca=str(certs / "ca.pem"))
    for config, expected in (
        (
            PoolConfig(tracker=tracker, key="secure", tls=tls, acquire_timeout_s=1),
            "UNAUTHENTICATED",
        ),
        (
            PoolConfig(tracker=tracker, key="secure", token=token, acquire_timeout_s=1),
            "UNAVAILABLE",
        ),
    ):
        runner = PoolRunner(config, FAST)
        try:
            [result] = runner.run([built.artifact])
        finally:
            runner.close()
        assert result.status is Status.NO_DEVICE
        assert expected in result.error


# -- Acquire across a tracker restart -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_acquire_retries_while_the_tracker_restarts() -> None:
    """A queued Acquire answered UNAVAILABLE by a stopping tracker is sent again until one serves."""
    address = f"127.0.0.1:{_free_port()}"
    first = create_server(address)
    first.run(first.pool.register("a", "h:1", [DeviceSpec("", "k")]))
    held = first.run(first.pool.acquire(LeaseRequest(key="k"))).lease
    assert held is not None
    attempts: list[float] = []

    def sleep(seconds: float) -> None:
        attempts.append(seconds)
        time.sleep(seconds)

    client = TrackerClient(address, sleep=sleep)
    outcome: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: outcome.update(response=client.acquire("k", {}, "me", 0, 30.0, 5.0))
    )
    worker.start()
    second = None
    try:
        deadline = time.monotonic() + 10
        while first.run(first.pool.queue_depths()).get("k") != 1:
            assert time.monotonic() < deadline, "the acquire never queued"
            time.sleep(0.02)
        first.stop(grace_s=0.5)
        deadline = time.monotonic() + 10
        while len(attempts) < 2:  # failed at least twice: the tracker is really gone for a while
            assert time.monotonic() < deadline, "the client did not retry"
            time.sleep(0.01)
        second = create_server(address)
        second.run(second.pool.register("b", "h:2", [DeviceSpec("", "k")]))
        worker.join(30)
        assert not worker.is_alive()
    finally:
        client.close()
        if second is not None:
            second.stop(grace_s=0.5)
    response = outcome["response"]
    assert response.status == common_pb2.OK, response.reason
    assert response.lease.device.device_id == "b/0"
    assert attempts == sorted(attempts) and max(attempts) <= ACQUIRE_RETRY_CAP_S

"""The real `python -m tracker` process: ready file, serving, clean exit on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc
from protos.auth import Role, call_metadata, write_secrets

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 10.0


def wait_for_file(path: Path, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not path.exists():
        assert process.poll() is None, f"tracker exited early with {process.returncode}"
        assert time.monotonic() < deadline, "tracker never wrote its ready file"
        time.sleep(0.05)
    return path.read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_process_serves_and_exits_zero_on_signal(tmp_path: Path, signum: signal.Signals) -> None:
    ready = tmp_path / "ready"
    process = subprocess.Popen(
        [sys.executable, "-m", "tracker", "--listen", "127.0.0.1:0", "--ready-file", str(ready)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        content = wait_for_file(ready, process)
        assert content.endswith("\n")
        address = content.strip()
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        with grpc.insecure_channel(address) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            device = common_pb2.DeviceSpec(key="x86", backend="null")
            stub.Register(
                tracker_pb2.RegisterRequest(agent_id="a", agent_address="h:1", devices=[device]),
                timeout=10,
            )
            listed = stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=10).devices
            assert [(d.spec.device_id, d.state) for d in listed] == [("a/0", tracker_pb2.FREE)]
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=EXIT_TIMEOUT_S)
        assert process.returncode == 0, stderr.decode()
        assert f"received {signum.name}".encode() in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(EXIT_TIMEOUT_S)


def test_sigterm_answers_waiting_acquires_reports_not_serving_and_exits_zero(
    tmp_path: Path,
) -> None:
    """Graceful stop with a waiting Acquire and a health watcher; metrics named in the ready file."""
    ready = tmp_path / "ready"
    process = subprocess.Popen(
        [sys.executable, "-m", "tracker", "--listen", "127.0.0.1:0", "--metrics-port", "0",
         "--ready-file", str(ready)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        address, metrics_url = wait_for_file(ready, process).splitlines()
        assert metrics_url.startswith("http://127.0.0.1:") and metrics_url.endswith("/metrics")
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            assert b"kiln_tracker_lease_grants_total 0.0" in response.read()
        with grpc.insecure_channel(address) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            device = common_pb2.DeviceSpec(key="x86", backend="null")
            stub.Register(tracker_pb2.RegisterRequest(agent_id="a", devices=[device]), timeout=10)
            held = stub.Acquire(tracker_pb2.AcquireRequest(key="x86"), timeout=10)
            assert held.status == common_pb2.OK
            waiting = stub.Acquire.future(
                tracker_pb2.AcquireRequest(key="x86", timeout_s=60), timeout=60
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            while (
                stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=10)
                .devices[0]
                .queue_depth
                != 1
            ):
                assert time.monotonic() < deadline, "the second Acquire never queued"
                time.sleep(0.02)
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service="kiln.v1.Tracker"), timeout=60
            )
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            process.send_signal(signal.SIGTERM)
            # Answered at once, UNAVAILABLE: a client retries it (on a restarted tracker).
            with pytest.raises(grpc.RpcError) as answer:
                waiting.result(timeout=EXIT_TIMEOUT_S)
            assert answer.value.code() == grpc.StatusCode.UNAVAILABLE
            assert answer.value.details() == "tracker shutting down"
            statuses = []
            with pytest.raises(grpc.RpcError):
                for response in watch:
                    statuses.append(response.status)
            assert statuses == [health_pb2.HealthCheckResponse.NOT_SERVING]
        _, stderr = process.communicate(timeout=EXIT_TIMEOUT_S)
        assert process.returncode == 0, stderr.decode()
        assert b"stopped" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(EXIT_TIMEOUT_S)


def test_token_file_enables_auth_and_logs_rejections(tmp_path: Path) -> None:
    secrets = write_secrets(tmp_path / "pool.secrets")
    ready = tmp_path / "ready"
    process = subprocess.Popen(
        [sys.executable, "-m", "tracker", "--listen", "127.0.0.1:0",
         "--token-file", str(tmp_path / "pool.secrets"), "--ready-file", str(ready)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        address = wait_for_file(ready, process).strip()
        with grpc.insecure_channel(address) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            with pytest.raises(grpc.RpcError) as error:
                stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=10)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            listed = stub.ListDevices(
                tracker_pb2.ListDevicesRequest(),
                timeout=10,
                metadata=call_metadata(secrets.token(Role.CLIENT)),
            )
            assert list(listed.devices) == []
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=EXIT_TIMEOUT_S)
        assert process.returncode == 0
        log = stderr.decode()
        assert "rejected /kiln.v1.Tracker/ListDevices from ipv4:127.0.0.1" in log
        assert "UNAUTHENTICATED: missing bearer token (role none)" in log
        assert all(token not in log for token in secrets.tokens.values())
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(EXIT_TIMEOUT_S)

"""The real `python -m tracker` process: ready file, serving, clean exit on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc

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

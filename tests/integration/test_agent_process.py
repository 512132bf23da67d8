"""The agent as a real process (`python -m device_agent`), and the null backend."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from device_agent import serde
from device_agent.__main__ import parse_args
from device_agent.backends.null import NULL_SAMPLE_S
from device_agent.config import AgentConfig
from device_agent.domain import ArtifactMeta
from device_agent.server import create_server
from device_agent.testing import N, kernel_entry
from protos import agent_pb2, agent_pb2_grpc, common_pb2

RPC_S = 10.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DATA = b"never loaded by the null backend"
META = ArtifactMeta(
    sha256=hashlib.sha256(DATA).hexdigest(),
    format="SHARED_OBJECT",
    entries=(kernel_entry("add_one"),),
)


def upload_and_measure(stub: agent_pb2_grpc.AgentStub, device_id: str) -> common_pb2.MeasureResult:
    chunk = agent_pb2.UploadChunk(meta=serde.meta_to_pb(META), data=DATA)
    stub.Upload(iter([chunk]), timeout=RPC_S)
    request = agent_pb2.MeasureRequest(
        device_id=device_id,
        artifact_sha256=META.sha256,
        symbol="add_one",
        config=common_pb2.EvaluatorConfig(number=7, repeat=5),
    )
    return stub.Measure(request, timeout=RPC_S)


def test_null_backend_fakes_timings_and_outputs(tmp_path: Path) -> None:
    config = AgentConfig(backend="null", devices=3, cache_dir=str(tmp_path))
    server, port, agent = create_server("127.0.0.1:0", config)
    with server, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        result = upload_and_measure(stub, agent.devices[2].device_id)
        assert result.status == common_pb2.OK
        assert list(result.samples_s) == [NULL_SAMPLE_S] * 5 and result.number_used == 7
        run = stub.Run(
            agent_pb2.RunRequest(
                device_id=agent.devices[0].device_id, artifact_sha256=META.sha256, symbol="add_one"
            ),
            timeout=RPC_S,
        )
        assert run.status == common_pb2.OK
        np.testing.assert_array_equal(
            serde.ndarray_from_pb(run.outputs[0]), np.zeros(N, np.float32)
        )


def test_bad_tag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--key", "k", "--tag", "no-equals-sign"])
    assert exit_info.value.code == 2
    assert "key=value" in capsys.readouterr().err
    assert dict(parse_args(["--key", "k", "--tag", "board=rk3399"]).tag) == {"board": "rk3399"}


def test_process_serves_until_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    cmd = [
        sys.executable,
        "-m",
        "device_agent",
        "--backend",
        "null",
        "--key",
        "k",
        "--tag",
        "board=test",
        "--listen",
        "127.0.0.1:0",
        "--ready-file",
        str(ready),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--agent-id",
        "proc-agent",
    ]
    proc = subprocess.Popen(
        cmd, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30.0
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), f"no ready file; agent exited with {proc.poll()}"
        address = ready.read_text().strip()
        assert address.startswith("127.0.0.1:")
        with grpc.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            info = stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S)
            assert info.agent_id == "proc-agent"
            assert [d.device_id for d in info.devices] == ["proc-agent/0"]
            assert info.devices[0].tags["board"] == "test" and info.devices[0].tags["arch"]
            assert info.devices[0].agent_address == address
            assert upload_and_measure(stub, "proc-agent/0").status == common_pb2.OK
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20.0)
        assert proc.returncode == 0, stderr.decode()
        assert b"stopped" in stderr
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10.0)

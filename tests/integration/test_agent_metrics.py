"""The agent's Prometheus endpoint (`kiln-agent --metrics-port`), scraped over HTTP.

A real agent process with the cpu backend and the test kit's gcc-built kernels: uploads, Measures
and Runs (one of them crashing its executor, which quarantines the entry) move the counters; the
ready file names the endpoint on its second line. In-process agents each serve their own registry.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from device_agent import serde
from device_agent.__main__ import parse_args
from device_agent.config import AgentConfig
from device_agent.server import create_server
from device_agent.testing import build_kernels, upload_chunks
from protos import agent_pb2, agent_pb2_grpc, common_pb2

prometheus_parser = pytest.importorskip("prometheus_client.parser")

REPO_ROOT = Path(__file__).resolve().parents[2]
RPC_S = 30.0
WAIT_S = 30.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """(sample name, labels) -> value of every kiln_agent_* sample at `url`."""
    with urllib.request.urlopen(url, timeout=RPC_S) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in prometheus_parser.text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("kiln_agent_")
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(agent address, metrics URL) of a standalone cpu agent started with --metrics-port 0."""
    ready = tmp_path / "agent.ready"
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "device_agent", "--key", "metrics", "--backend", "cpu",
             "--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path / "cache"),
             "--quarantine-after", "1", "--metrics-port", "0", "--ready-file", str(ready)],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_S
        while not ready.exists():
            assert proc.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "no ready file"
            time.sleep(0.02)
        lines = ready.read_text().splitlines()
        assert len(lines) == 2, lines
        yield lines[0], lines[1]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(WAIT_S)
    assert proc.returncode == 0, log_path.read_text(errors="replace")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_counters_move_with_uploads_measures_runs_and_crashes(
    agent_process: tuple[str, str], tmp_path: Path
) -> None:
    address, url = agent_process
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    before = scrape(url)
    assert value(before, "kiln_agent_uploads_total", outcome="stored") == 0
    assert value(before, "kiln_agent_upload_bytes_total") == 0
    assert value(before, "kiln_agent_cache_artifacts") == 0
    assert value(before, "kiln_agent_devices", state="idle") == 1

    data, meta = build_kernels(str(tmp_path))
    with grpc.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
        # Bytes that hash to something else than the meta says: refused, counted, not stored.
        wrong = serde.meta_to_pb(meta)
        wrong.sha256 = hashlib.sha256(b"other").hexdigest()
        with pytest.raises(grpc.RpcError) as refused:
            stub.Upload(upload_chunks(data, wrong), timeout=RPC_S)
        assert refused.value.code() == grpc.StatusCode.DATA_LOSS
        device = stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S).devices[0].device_id

        def measure(symbol: str) -> int:
            request = agent_pb2.MeasureRequest(
                device_id=device,
                artifact_sha256=meta.sha256,
                symbol=symbol,
                config=common_pb2.EvaluatorConfig(number=1, repeat=2, timeout_s=30.0),
            )
            status: int = stub.Measure(request, timeout=RPC_S).status
            return status

        assert measure("add_one") == common_pb2.OK
        assert measure("crash") == common_pb2.CRASH
        assert measure("crash") == common_pb2.RUNTIME_ERROR  # quarantined after one death
        run = agent_pb2.RunRequest(
            device_id=device, artifact_sha256=meta.sha256, symbol="add_one", timeout_s=30.0
        )
        assert stub.Run(run, timeout=RPC_S).status == common_pb2.OK
    after = scrape(url)

    assert value(after, "kiln_agent_measurements_total", method="measure", status="OK") == 1
    assert value(after, "kiln_agent_measurements_total", method="measure", status="CRASH") == 1
    runtime_error = {"method": "measure", "status": "RUNTIME_ERROR"}
    assert value(after, "kiln_agent_measurements_total", **runtime_error) == 1
    assert value(after, "kiln_agent_measurements_total", method="run", status="OK") == 1
    assert value(after, "kiln_agent_uploads_total", outcome="stored") == 1
    assert value(after, "kiln_agent_uploads_total", outcome="hash_mismatch") == 1
    assert value(after, "kiln_agent_upload_bytes_total") == len(data)
    assert value(after, "kiln_agent_cache_artifacts") == 1
    cache_bytes = value(after, "kiln_agent_cache_bytes")
    assert cache_bytes is not None and cache_bytes > len(data)  # the meta file counts too
    assert value(after, "kiln_agent_quarantined_entries") == 1
    assert value(after, "kiln_agent_executor_restarts_total", reason="died") == 1
    assert value(after, "kiln_agent_devices", state="busy") == 0


def test_agents_in_one_process_serve_their_own_registries(tmp_path: Path) -> None:
    servers = []
    urls: list[str] = []
    try:
        for name in ("one", "two"):
            config = AgentConfig(
                key="k", backend="null", agent_id=name, cache_dir=str(tmp_path / name)
            )
            server, _, _ = create_server("127.0.0.1:0", config, metrics_port=0)
            servers.append(server)
        urls = [server.metrics_url for server in servers]
        assert len(set(urls)) == 2
        for name, url in zip(("one", "two"), urls, strict=True):
            infos = [
                dict(labels) for (sample, labels) in scrape(url) if sample == "kiln_agent_info"
            ]
            assert [info["agent_id"] for info in infos] == [name]
            assert infos[0]["backend"] == "null"
    finally:
        for server in servers:
            server.stop(grace_s=0.5)
    for url in urls:
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(url, timeout=RPC_S)


def test_no_metrics_port_no_endpoint(tmp_path: Path) -> None:
    config = AgentConfig(key="k", backend="null", agent_id="quiet", cache_dir=str(tmp_path))
    server, _, _ = create_server("127.0.0.1:0", config)
    with server:
        assert server.metrics_url == ""


def test_metrics_port_without_prometheus_client_is_a_bad_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "prometheus_client" else real(name, *args),
    )
    assert parse_args(["--key", "k"]).metrics_port is None  # not needed without the flag
    with pytest.raises(SystemExit) as exited:
        parse_args(["--key", "k", "--metrics-port", "0"])
    assert exited.value.code == 2
    assert "pip install prometheus-client" in capsys.readouterr().err

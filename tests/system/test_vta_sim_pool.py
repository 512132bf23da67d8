"""`kiln-agent --backend vta_sim --key vta-sim` registers with a real tracker and measures an
accelerator program through a lease, checked against a host reference.

Real `python -m tracker` and `python -m device_agent` processes on 127.0.0.1 (port 0), secured
with a pool secrets file; every wait bounded; both ended by pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from device_agent import serde
from device_agent.testing import upload_chunks
from device_agent.vta.testing import build_gemm_reference, gemm_program, program_artifact
from protos import agent_pb2, agent_pb2_grpc, common_pb2, tracker_pb2, tracker_pb2_grpc
from protos.auth import Role, call_metadata, load_secrets, write_secrets
from protos.vta import VtaSpec
from tuner.measure.tracker_client import TrackerClient

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

REPO_ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0
RPC_S = 30.0
M, N, K = 96, 64, 64


def spawn(
    workdir: Path, name: str, args: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `python -m <args> --ready-file F` (with `env` added to the environment); return it
    and the address it serves."""
    ready = workdir / f"{name}.ready"
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args, "--ready-file", str(ready)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    deadline = time.monotonic() + WAIT_S
    while not ready.exists():
        log_text = (workdir / f"{name}.log").read_text(errors="replace")
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{log_text}"
        assert time.monotonic() < deadline, f"{name} never became ready:\n{log_text}"
        time.sleep(0.05)
    return proc, ready.read_text().splitlines()[0]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(WAIT_S)


def wait_registered(tracker_address: str, secrets_path: Path, key: str) -> None:
    """Wait (bounded) until the tracker lists a device of `key`: an agent's ready file means it
    serves, and the pool sees its device only once it has registered."""
    client = TrackerClient(tracker_address, load_secrets(secrets_path).token(Role.CLIENT))
    try:
        deadline = time.monotonic() + WAIT_S
        while not client.list_devices(key).devices:
            assert time.monotonic() < deadline, f"no agent of key {key!r} ever registered"
            time.sleep(0.05)
    finally:
        client.close()


@contextmanager
def vta_pool(
    workdir: Path, secrets_path: Path, agent_env: dict[str, str] | None = None
) -> Iterator[str]:
    """A real tracker and a `--backend vta_sim --key vta-sim` agent secured by `secrets_path`
    (`agent_env`: e.g. KILN_VTA_SPEC for another spec); yields the tracker's address and ends
    both by pid."""
    procs = []
    try:
        tracker, tracker_address = spawn(
            workdir, "tracker",
            ["tracker", "--listen", "127.0.0.1:0", "--token-file", str(secrets_path)],
        )  # fmt: skip
        procs.append(tracker)
        agent, _ = spawn(
            workdir, "agent",
            ["device_agent", "--tracker", tracker_address, "--key", "vta-sim", "--backend",
             "vta_sim", "--listen", "127.0.0.1:0", "--token-file", str(secrets_path),
             "--cache-dir", str(workdir / "cache")],
            agent_env,
        )  # fmt: skip
        procs.append(agent)
        wait_registered(tracker_address, secrets_path, "vta-sim")
        yield tracker_address
    finally:
        for proc in reversed(procs):
            stop(proc)


def test_a_vta_sim_agent_serves_the_pool(tmp_path: Path) -> None:
    secrets_path = tmp_path / "pool.secrets"
    secrets = write_secrets(secrets_path)
    client = call_metadata(secrets.token(Role.CLIENT))
    program = gemm_program(M, N, K, tile_rows=16, double_buffer=True)
    data, meta = program_artifact({"gemm": program}, {"gemm": (M, N, K)})
    ref_data, ref_meta = build_gemm_reference(str(tmp_path), M, N, K)
    with vta_pool(tmp_path, secrets_path) as tracker_address:
        with grpc.insecure_channel(tracker_address) as channel:
            reply = tracker_pb2_grpc.TrackerStub(channel).Acquire(
                tracker_pb2.AcquireRequest(
                    key="vta-sim", tag_selector={"arch": "vta"}, timeout_s=RPC_S, lease_ttl_s=60
                ),
                timeout=RPC_S + 5,
                metadata=client,
            )
        assert reply.status == common_pb2.OK, reply.reason
        lease = reply.lease
        assert lease.device.backend == "vta_sim"
        assert lease.device.tags["vta_spec"] == VtaSpec().key()
        with grpc.insecure_channel(lease.device.agent_address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            for blob, m in ((data, meta), (ref_data, ref_meta)):
                stub.Upload(
                    upload_chunks(blob, serde.meta_to_pb(m)), timeout=RPC_S, metadata=client
                )
            result = stub.Measure(
                agent_pb2.MeasureRequest(
                    device_id=lease.device.device_id,
                    artifact_sha256=meta.sha256,
                    symbol="gemm",
                    seed=3,
                    config=common_pb2.EvaluatorConfig(repeat=2, timeout_s=60.0),
                    check=common_pb2.CheckSpec(
                        reference_sha256=ref_meta.sha256, reference_symbol="gemm_ref"
                    ),
                    lease_id=lease.lease_id,
                    lease_token=lease.token,
                ),
                timeout=RPC_S,
                metadata=client,
            )
        assert result.status == common_pb2.OK, result.error
        assert result.emulated and result.device_id == lease.device.device_id
        cycles = result.samples_s[0] * result.telemetry.cpu_mhz * 1e6
        assert cycles > M * (N // 16) * (K // 16)  # at least the GEMM's own cycles

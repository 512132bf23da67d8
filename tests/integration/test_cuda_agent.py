"""`kiln-agent --backend cuda --devices all` as a real process beside a real tracker, on the fake
driver (`KILN_CUDA_DRIVER=fake`, two fake GPUs; it stands in for the GPUs only): one device per
GPU listed by `kiln devices` with its tags, each executor child seeing only its GPU, a checked
measurement of a container, and a faulting kernel answered RUNTIME_ERROR with the next
measurement on that device served by a fresh child within seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from device_agent import serde
from device_agent.arrays import make_args
from device_agent.backends.cuda_fake import fake_image
from device_agent.domain import ArgRole, ArtifactMeta, EntryPoint, TensorSpec
from device_agent.testing import (
    N,
    build_kernels,
    child_pids,
    upload_chunks,
    wait_for_ready_file,
)
from kiln import cli
from protos import agent_pb2, agent_pb2_grpc, common_pb2, tracker_pb2, tracker_pb2_grpc
from protos.cuda_program import CudaModule, CudaProgram, Launch, LaunchArg, encode_module

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

PROJECT_ROOT = Path(__file__).resolve().parents[2]
KEY = "fake-h100"
START_S = 30.0
RPC_S = 30.0
LAUNCH_US = 50
ARGS = (
    TensorSpec("x", (N,), "float32", ArgRole.INPUT),
    TensorSpec("y", (N,), "float32", ArgRole.OUTPUT),
)


def program(kernel: str) -> CudaProgram:
    args = (LaunchArg.entry(0), LaunchArg.entry(1))
    return CudaProgram((Launch(kernel, (N // 256, 1, 1), (256, 1, 1), args),))


def container() -> tuple[bytes, ArtifactMeta]:
    programs = {"add_one_k": program("fake_add_one"), "fault_k": program("fault_now")}
    image = fake_image(["fake_add_one", "fault_now"])
    data = encode_module(CudaModule("sm_90", "ptx", image, programs))
    entries = tuple(EntryPoint(s, s, ARGS, flop=float(N)) for s in programs)
    meta = ArtifactMeta(hashlib.sha256(data).hexdigest(), "PTX", "sm_90", entries)
    return data, meta


def spawn(
    args: list[str], ready: Path, log: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args, "--ready-file", str(ready)],
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return proc, wait_for_ready_file(proc, str(ready), START_S)


def gpu_of(pid: int) -> str:
    """The $CUDA_VISIBLE_DEVICES of process `pid`."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    values = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
    return values[0].decode() if values else ""


@dataclass
class Pool:
    tracker: str
    agent: subprocess.Popen[bytes]
    stub: agent_pb2_grpc.AgentStub
    sha: str
    ref_sha: str
    log: Path

    def children(self) -> dict[str, int]:
        """GPU index -> pid of the executor child that sees only that GPU."""
        return {gpu_of(pid): pid for pid in child_pids(self.agent.pid)}

    def measure(self, device: int, symbol: str, reference: str = "") -> common_pb2.MeasureResult:
        request = agent_pb2.MeasureRequest(
            device_id=f"cuda-agent/{device}",
            artifact_sha256=self.sha,
            symbol=symbol,
            seed=4,
            config=common_pb2.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=2.0),
        )
        if reference:
            request.check.CopyFrom(
                common_pb2.CheckSpec(reference_sha256=self.ref_sha, reference_symbol=reference)
            )
        return self.stub.Measure(request, timeout=RPC_S)


def wait_for(condition: object, timeout_s: float = START_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def registered(tracker: str) -> int:
    with grpc.insecure_channel(tracker) as channel:
        reply = tracker_pb2_grpc.TrackerStub(channel).ListDevices(
            tracker_pb2.ListDevicesRequest(key=KEY), timeout=5.0
        )
    return len(reply.devices)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    root = tmp_path_factory.mktemp("cuda-agent")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        tracker_proc, tracker = spawn(
            ["-m", "tracker", "--listen", "127.0.0.1:0", "--heartbeat-interval-s", "0.3"],
            root / "tracker.ready",
            root / "tracker.log",
        )
        procs.append(tracker_proc)
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env.update(
            KILN_CUDA_DRIVER="fake",
            KILN_CUDA_FAKE_GPUS="2",
            KILN_CUDA_FAKE_LAUNCH_US=str(LAUNCH_US),
        )
        agent_args = ["-m", "device_agent", "--backend", "cuda", "--devices", "all"]
        agent_args += ["--tracker", tracker, "--key", KEY, "--agent-id", "cuda-agent"]
        agent_args += ["--cache-dir", str(root / "cache")]
        log = root / "agent.log"
        agent, address = spawn(agent_args, root / "agent.ready", log, env)
        procs.append(agent)
        assert wait_for(lambda: registered(tracker) == 2), log.read_text()
        data, meta = container()
        ref_data, ref_meta = build_kernels(str(root))
        with grpc.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
            stub.Upload(upload_chunks(ref_data, serde.meta_to_pb(ref_meta)), timeout=RPC_S)
            yield Pool(tracker, agent, stub, meta.sha256, ref_meta.sha256, log)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10.0)


def test_kiln_devices_lists_one_device_per_gpu_with_its_tags(
    pool: Pool, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["devices", "--tracker", pool.tracker, "--key", KEY, "--json"])
    output = capsys.readouterr()
    assert info.value.code == 0, output.err
    rows = json.loads(output.out)
    assert [r["device"] for r in rows] == ["cuda-agent/0", "cuda-agent/1"]
    for index, row in enumerate(rows):
        tags = row["tags"]
        assert row["backend"] == "cuda" and tags["arch"] == "cuda", row
        assert tags["gpu"] == f"Kiln Fake GPU {index}" and tags["gpu_index"] == str(index)
        assert tags["sm"] == "90" and tags["memory_mib"] == "81920"
        assert tags["sm_clock_mhz"] == "1980" and tags["driver"] == "fake"


def test_each_executor_child_sees_only_its_gpu_without_an_address_space_cap(pool: Pool) -> None:
    assert wait_for(lambda: set(pool.children()) == {"0", "1"}), pool.children()
    # cuInit fails under the RLIMIT_AS an agent gives other backends' children.
    for pid in pool.children().values():
        [line] = [x for x in Path(f"/proc/{pid}/limits").read_text().splitlines()
                  if x.startswith("Max address space")]  # fmt: skip
        assert line.split()[3] == "unlimited", line


def test_a_checked_measurement_is_emulated_with_gpu_telemetry(pool: Pool) -> None:
    result = pool.measure(1, "add_one_k", reference="add_one")
    assert result.status == common_pb2.OK, result.error
    assert result.emulated and len(result.samples_s) == 3
    assert result.samples_s == pytest.approx([LAUNCH_US * 1e-6] * 3)
    assert result.number_used * LAUNCH_US * 1e-3 >= 2.0
    assert result.telemetry.cpu_mhz == 1980.0 and result.telemetry.temperature_c == 41.0
    wrong = pool.measure(0, "add_one_k", reference="add_two")
    assert wrong.status == common_pb2.WRONG_ANSWER, wrong.error


def test_run_returns_the_gpu_outputs(pool: Pool) -> None:
    request = agent_pb2.RunRequest(
        device_id="cuda-agent/0", artifact_sha256=pool.sha, symbol="add_one_k", seed=8
    )
    result = pool.stub.Run(request, timeout=RPC_S)
    assert result.status == common_pb2.OK, result.error
    x, _ = make_args(ARGS, seed=8)
    np.testing.assert_array_equal(serde.ndarray_from_pb(result.outputs[0]), x + np.float32(1))


def test_a_fault_is_a_runtime_error_and_a_fresh_child_serves_the_next_job(pool: Pool) -> None:
    assert wait_for(lambda: set(pool.children()) == {"0", "1"})
    before = pool.children()
    fault = pool.measure(1, "fault_k")
    assert fault.status == common_pb2.RUNTIME_ERROR
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in fault.error, fault.error
    started = time.monotonic()
    after = pool.measure(1, "add_one_k", reference="add_one")
    assert after.status == common_pb2.OK, after.error
    assert time.monotonic() - started < 10.0
    now = pool.children()
    assert now["1"] != before["1"] and now["0"] == before["0"]
    assert "retiring" in pool.log.read_text()

"""The qemu backend: hand-written kernels cross-compiled for aarch64, run under qemu-user.

Correctness is checked for real (outputs and CheckSpec), results are labelled emulated, and the
executor's supervision (crash signal, timeout) applies as for the cpu backend.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from device_agent import serde
from device_agent.agent import Agent
from device_agent.arrays import make_args
from device_agent.backends.qemu import CROSS_CC, QEMU, SYSROOT
from device_agent.config import AgentConfig
from device_agent.domain import ArtifactMeta
from device_agent.server import create_server
from device_agent.testing import N, build_kernels, kernel_entry, upload_chunks
from protos import agent_pb2, agent_pb2_grpc, common_pb2

pytestmark = pytest.mark.skipif(
    shutil.which(CROSS_CC) is None or shutil.which(QEMU) is None or not os.path.isdir(SYSROOT),
    reason=f"needs {CROSS_CC}, {QEMU} and {SYSROOT} (scripts/setup.sh installs them)",
)

RPC_S = 60.0


@dataclass
class Env:
    stub: agent_pb2_grpc.AgentStub
    agent: Agent
    meta: ArtifactMeta
    host_sha: str

    def measure(
        self, symbol: str, reference: str = "", sha: str = "", **config: Any
    ) -> common_pb2.MeasureResult:
        request = agent_pb2.MeasureRequest(
            device_id=self.agent.devices[0].device_id,
            artifact_sha256=sha or self.meta.sha256,
            symbol=symbol,
            seed=11,
            config=common_pb2.EvaluatorConfig(**{"number": 2, "repeat": 3, **config}),
        )
        if reference:
            request.check.CopyFrom(
                common_pb2.CheckSpec(
                    reference_sha256=self.meta.sha256,
                    reference_symbol=reference,
                    rtol=1e-6,
                    atol=1e-6,
                )
            )
        return self.stub.Measure(request, timeout=RPC_S)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("qemu")
    data, meta = build_kernels(str(root), cc=CROSS_CC)
    (root / "host").mkdir()
    host_data, host_meta = build_kernels(str(root / "host"))
    config = AgentConfig(
        key="aarch64-qemu",
        backend="qemu",
        cache_dir=str(root / "cache"),
        executor_address_space_bytes=2 << 30,
    )
    server, port, agent = create_server("127.0.0.1:0", config)
    with server, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
        stub.Upload(upload_chunks(host_data, serde.meta_to_pb(host_meta)), timeout=RPC_S)
        yield Env(stub, agent, meta, host_meta.sha256)


def test_devices_say_aarch64_and_the_runner_was_cross_built(env: Env) -> None:
    info = env.stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S)
    device = info.devices[0]
    assert device.backend == "qemu" and device.key == "aarch64-qemu"
    assert device.tags["arch"] == "aarch64" and device.tags["emulated"] == "qemu-user"
    runners = list(Path(env.agent.cache.directory, "backends", "qemu").glob("kiln-qemu-runner-*"))
    assert len(runners) == 1
    with open(runners[0], "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183


def test_measure_is_ok_emulated_and_checked(env: Env) -> None:
    result = env.measure("add_one", reference="add_one", min_repeat_ms=1.0)
    assert result.status == common_pb2.OK, result.error
    assert result.emulated
    assert len(result.samples_s) == 3 and all(s > 0 for s in result.samples_s)
    assert result.number_used >= 2


def test_run_returns_the_emulated_outputs(env: Env) -> None:
    request = agent_pb2.RunRequest(
        device_id=env.agent.devices[0].device_id,
        artifact_sha256=env.meta.sha256,
        symbol="add_one",
        seed=7,
    )
    result = env.stub.Run(request, timeout=RPC_S)
    assert result.status == common_pb2.OK, result.error
    x = make_args(kernel_entry("add_one").args, seed=7)[0]
    np.testing.assert_array_equal(serde.ndarray_from_pb(result.outputs[0]), x + 1)
    x = np.arange(N, dtype=np.float32)
    request.inputs.append(serde.ndarray_to_pb(x))
    result = env.stub.Run(request, timeout=RPC_S)
    np.testing.assert_array_equal(serde.ndarray_from_pb(result.outputs[0]), x + 1)


def test_a_wrong_kernel_is_wrong_answer(env: Env) -> None:
    result = env.measure("add_one", reference="add_two")
    assert result.status == common_pb2.WRONG_ANSWER and "max abs error 1" in result.error
    assert result.emulated


def test_crash_abort_and_hang_are_supervised(env: Env) -> None:
    crash = env.measure("crash")
    assert crash.status == common_pb2.CRASH and crash.signal == 11 and "SIGSEGV" in crash.error
    aborted = env.measure("aborts")
    assert aborted.status == common_pb2.CRASH and aborted.signal == 6
    hang = env.measure("hang", timeout_s=1.0)
    assert hang.status == common_pb2.TIMEOUT
    assert env.measure("add_one").status == common_pb2.OK


def test_failures_are_typed(env: Env) -> None:
    fail = env.measure("fail")
    assert fail.status == common_pb2.RUNTIME_ERROR and "returned 1" in fail.error
    huge = env.stub.Run(
        agent_pb2.RunRequest(
            device_id=env.agent.devices[0].device_id,
            artifact_sha256=env.meta.sha256,
            symbol="alloc_huge",
        ),
        timeout=RPC_S,
    )
    assert huge.status == common_pb2.RUNTIME_ERROR and "returned 3" in huge.error
    absent = env.measure("absent")
    assert absent.status == common_pb2.LOAD_ERROR and "absent__time" in absent.error
    host = env.measure("add_one", sha=env.host_sha)
    assert host.status == common_pb2.LOAD_ERROR and "not aarch64" in host.error

"""The vta_sim backend behind a real agent (gRPC on 127.0.0.1, a real executor child, real gcc).

Programs are checked against a host C reference and against each other, results are labelled
emulated with the spec's clock as telemetry, a hazard is a RUNTIME_ERROR naming its cause, and Run
returns the simulated outputs.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from device_agent import serde
from device_agent.agent import Agent
from device_agent.arrays import make_args
from device_agent.config import AgentConfig
from device_agent.server import create_server
from device_agent.testing import upload_chunks
from device_agent.vta.testing import (
    build_gemm_reference,
    gemm_entry,
    gemm_program,
    gemm_reference,
    program_artifact,
)
from protos import agent_pb2, agent_pb2_grpc, common_pb2
from protos.vta import Deps, VtaSpec

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

RPC_S = 60.0
M, N, K = 64, 48, 80
SHAPE = (M, N, K)


@dataclass
class Env:
    stub: agent_pb2_grpc.AgentStub
    agent: Agent
    programs_sha: str
    reference_sha: str

    def measure(
        self, symbol: str, reference: str = "", ref_sha: str = ""
    ) -> common_pb2.MeasureResult:
        request = agent_pb2.MeasureRequest(
            device_id=self.agent.devices[0].device_id,
            artifact_sha256=self.programs_sha,
            symbol=symbol,
            seed=5,
            config=common_pb2.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=5.0),
        )
        if reference:
            request.check.CopyFrom(
                common_pb2.CheckSpec(
                    reference_sha256=ref_sha or self.reference_sha, reference_symbol=reference
                )
            )
        return self.stub.Measure(request, timeout=RPC_S)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("vta-agent")
    programs = {
        "gemm_db": gemm_program(M, N, K, tile_rows=16, double_buffer=True),
        "gemm_serial": gemm_program(M, N, K, tile_rows=16),
        "gemm_wrong": gemm_program(M, N, K, tile_rows=16, shift=3),
    }
    data, meta = program_artifact(programs, dict.fromkeys(programs, SHAPE))
    ref_data, ref_meta = build_gemm_reference(str(root), M, N, K)
    config = AgentConfig(
        key="vta-sim",
        backend="vta_sim",
        cache_dir=str(root / "cache"),
        executor_address_space_bytes=4 << 30,
    )
    server, port, agent = create_server("127.0.0.1:0", config)
    with server, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
        stub.Upload(upload_chunks(ref_data, serde.meta_to_pb(ref_meta)), timeout=RPC_S)
        yield Env(stub, agent, meta.sha256, ref_meta.sha256)


def test_the_device_says_what_it_simulates_and_the_simulator_was_built(env: Env) -> None:
    info = env.stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S)
    device = info.devices[0]
    assert device.backend == "vta_sim" and device.key == "vta-sim"
    assert device.tags["arch"] == "vta" and device.tags["emulated"] == "vta-sim"
    assert device.tags["vta_spec"] == VtaSpec().key() and device.tags["clock_mhz"] == "100"
    assert info.telemetry.cpu_mhz == 100.0
    libraries = list(Path(env.agent.cache.directory, "backends", "vta_sim").glob("kiln-vta-sim-*"))
    assert len(libraries) == 1


def test_measure_is_simulated_checked_and_double_buffering_wins(env: Env) -> None:
    db = env.measure("gemm_db", reference="gemm_ref")
    serial = env.measure("gemm_serial", reference="gemm_ref")
    for result in (db, serial):
        assert result.status == common_pb2.OK, result.error
        assert result.emulated
        assert len(set(result.samples_s)) == 1 and result.number_used == 1
    cycles = [round(r.samples_s[0] * r.telemetry.cpu_mhz * 1e6) for r in (db, serial)]
    assert 0 < cycles[0] < cycles[1]
    # A program is a reference too (the same ACCEL_PROGRAM artifact).
    versus = env.measure("gemm_db", reference="gemm_serial", ref_sha=env.programs_sha)
    assert versus.status == common_pb2.OK, versus.error


def test_a_wrong_program_is_a_wrong_answer(env: Env) -> None:
    result = env.measure("gemm_wrong", reference="gemm_ref")
    assert result.status == common_pb2.WRONG_ANSWER, result.error
    assert "differs from the reference" in result.error


def test_run_returns_the_simulated_outputs(env: Env) -> None:
    request = agent_pb2.RunRequest(
        device_id=env.agent.devices[0].device_id,
        artifact_sha256=env.programs_sha,
        symbol="gemm_db",
        seed=9,
    )
    result = env.stub.Run(request, timeout=RPC_S)
    assert result.status == common_pb2.OK, result.error
    x, w, bias, _ = make_args(gemm_entry("gemm_db", *SHAPE).args, seed=9)
    expected = gemm_reference(x, w, bias, 2)
    np.testing.assert_array_equal(serde.ndarray_from_pb(result.outputs[0]), expected)


def test_a_hazard_is_a_runtime_error_naming_its_cause(tmp_path: Path, env: Env) -> None:
    program = gemm_program(M, N, K)  # one tile
    insns = list(program.insns)
    insns[2] = dataclasses.replace(insns[2], deps=Deps(push_next=True))  # token after the weights
    insns[3] = dataclasses.replace(insns[3], deps=Deps())  # ...not after the inputs
    broken = dataclasses.replace(program, insns=tuple(insns))
    data, meta = program_artifact({"racy": broken}, {"racy": SHAPE})
    env.stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
    request = agent_pb2.MeasureRequest(
        device_id=env.agent.devices[0].device_id, artifact_sha256=meta.sha256, symbol="racy"
    )
    result = env.stub.Measure(request, timeout=RPC_S)
    assert result.status == common_pb2.RUNTIME_ERROR
    assert result.error.startswith("hazard UNSYNCED_READ: compute insn 5 (GEMM) reads INP[0]")


def test_a_shared_object_is_a_reference_never_a_timing(env: Env) -> None:
    request = agent_pb2.MeasureRequest(
        device_id=env.agent.devices[0].device_id,
        artifact_sha256=env.reference_sha,
        symbol="gemm_ref",
    )
    result = env.stub.Measure(request, timeout=RPC_S)
    assert result.status == common_pb2.LOAD_ERROR
    assert "times accelerator programs" in result.error


def test_a_program_for_another_spec_is_refused(env: Env) -> None:
    other = gemm_program(M, N, K, spec=VtaSpec(clock_mhz=250))
    data, meta = program_artifact({"fast": other}, {"fast": SHAPE})
    env.stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
    request = agent_pb2.MeasureRequest(
        device_id=env.agent.devices[0].device_id, artifact_sha256=meta.sha256, symbol="fast"
    )
    result = env.stub.Measure(request, timeout=RPC_S)
    assert result.status == common_pb2.LOAD_ERROR
    assert "compiled for spec" in result.error

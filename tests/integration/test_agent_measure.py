"""A real agent on 127.0.0.1 over gRPC, with hand-written C kernels built by gcc.

Upload, Has, Measure and Run, and the executor's failure statuses: a kernel that crashes, hangs or
fails is reported and the same device serves the next request.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest

from device_agent import serde, telemetry
from device_agent.agent import Agent
from device_agent.arrays import make_args
from device_agent.config import AgentConfig
from device_agent.domain import ArtifactMeta
from device_agent.server import create_server
from device_agent.testing import N, build_kernels, kernel_entry
from protos import agent_pb2, agent_pb2_grpc, common_pb2

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

RPC_S = 20.0
MAX_ARTIFACT_BYTES = 64 * 1024


@dataclass
class Env:
    stub: agent_pb2_grpc.AgentStub
    agent: Agent
    data: bytes
    meta: ArtifactMeta
    cache_dir: str

    @property
    def device(self) -> str:
        return self.agent.devices[0].device_id


def chunks(
    data: bytes, meta: common_pb2.ArtifactMeta | None, size: int = 1024
) -> Iterator[agent_pb2.UploadChunk]:
    """The upload stream: meta on the first chunk, then `size`-byte chunks."""
    yield agent_pb2.UploadChunk(meta=meta, data=data[:size])
    for i in range(size, len(data), size):
        yield agent_pb2.UploadChunk(data=data[i : i + size])


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("agent")
    data, meta = build_kernels(str(root))
    config = AgentConfig(
        key="test-cpu",
        devices=2,
        cache_dir=str(root / "cache"),
        max_artifact_bytes=MAX_ARTIFACT_BYTES,
        executor_address_space_bytes=2 << 30,
        default_timeout_s=30.0,
    )
    server, port, agent = create_server("127.0.0.1:0", config)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = agent_pb2_grpc.AgentStub(channel)
        stub.Upload(chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S)
        yield Env(stub, agent, data, meta, config.cache_dir)
    finally:
        channel.close()
        server.stop(grace_s=1.0)


def measure(
    env: Env, symbol: str, device: str | None = None, **config: Any
) -> common_pb2.MeasureResult:
    request = agent_pb2.MeasureRequest(
        device_id=device or env.device,
        lease_id="lease-1",
        lease_token="unchecked",
        artifact_sha256=env.meta.sha256,
        symbol=symbol,
        seed=42,
        config=common_pb2.EvaluatorConfig(**{"number": 3, "repeat": 4, **config}),
    )
    return env.stub.Measure(request, timeout=RPC_S)


def assert_ok(result: common_pb2.MeasureResult) -> None:
    assert result.status == common_pb2.OK, result.error
    assert len(result.samples_s) == 4 and all(s > 0 for s in result.samples_s)


def test_chunked_upload_is_cached(env: Env, tmp_path: os.PathLike[str]) -> None:
    assert env.stub.Has(agent_pb2.HasRequest(sha256=env.meta.sha256), timeout=RPC_S).present
    other = env.data + b"\0" * 10
    meta = serde.meta_to_pb(env.meta)
    meta.sha256 = hashlib.sha256(other).hexdigest()
    meta.size_bytes = len(other)
    assert not env.stub.Has(agent_pb2.HasRequest(sha256=meta.sha256), timeout=RPC_S).present
    reply = env.stub.Upload(chunks(other, meta, size=1000), timeout=RPC_S)
    assert (reply.sha256, reply.size_bytes) == (meta.sha256, len(other))
    assert env.stub.Has(agent_pb2.HasRequest(sha256=meta.sha256), timeout=RPC_S).present


def test_measure_ok(env: Env) -> None:
    result = measure(env, "add_one", flush_cache_bytes=1 << 16)
    assert_ok(result)
    assert result.number_used == 3
    assert result.device_id == env.device
    assert result.telemetry.load_1m >= 0 and not result.emulated


def test_telemetry_carries_what_this_machine_exposes(env: Env) -> None:
    """Readings this host has are set in MeasureResult and Info; ones it lacks are left unset."""
    result = measure(env, "add_one")
    info = env.stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S)
    for t in (result.telemetry, info.telemetry):
        assert (t.cpu_mhz > 0) == (telemetry.cpu_mhz() is not None)
        assert (t.temperature_c != 0) == (telemetry.temperature_c() is not None)
        assert t.load_1m > 0 or os.getloadavg()[0] < 0.05  # zero only on an idle host


def test_min_repeat_ms_grows_number(env: Env) -> None:
    result = measure(env, "add_one", number=1, min_repeat_ms=5.0)
    assert_ok(result)
    assert result.number_used > 1


def test_unknown_artifact_is_load_error_naming_the_missing_hash(env: Env) -> None:
    request = agent_pb2.MeasureRequest(device_id=env.device, artifact_sha256="ab" * 32, symbol="k")
    result = env.stub.Measure(request, timeout=RPC_S)
    assert result.status == common_pb2.LOAD_ERROR
    assert "ab" * 32 in result.error and "not in cache" in result.error
    assert list(result.missing_sha256) == ["ab" * 32]  # so a client that skipped Has re-uploads


def test_missing_entry_or_symbol_is_load_error(env: Env) -> None:
    assert measure(env, "not_an_entry").status == common_pb2.LOAD_ERROR
    result = measure(env, "absent")
    assert result.status == common_pb2.LOAD_ERROR and "absent__time" in result.error


def test_unloadable_object_is_load_error(env: Env) -> None:
    junk = b"not an ELF file" * 10
    meta = serde.meta_to_pb(env.meta)
    meta.sha256 = hashlib.sha256(junk).hexdigest()
    meta.size_bytes = len(junk)
    env.stub.Upload(chunks(junk, meta), timeout=RPC_S)
    request = agent_pb2.MeasureRequest(
        device_id=env.device, artifact_sha256=meta.sha256, symbol="add_one"
    )
    result = env.stub.Measure(request, timeout=RPC_S)
    assert result.status == common_pb2.LOAD_ERROR and "cannot load" in result.error


def test_hash_mismatch_is_rejected_and_not_stored(env: Env) -> None:
    meta = serde.meta_to_pb(env.meta)
    meta.sha256 = "cd" * 32
    with pytest.raises(grpc.RpcError) as err:
        env.stub.Upload(chunks(env.data, meta), timeout=RPC_S)
    assert err.value.code() == grpc.StatusCode.DATA_LOSS
    assert "cd" * 32 in err.value.details() and env.meta.sha256 in err.value.details()
    assert not env.stub.Has(agent_pb2.HasRequest(sha256="cd" * 32), timeout=RPC_S).present


def test_oversize_upload_is_rejected_and_not_stored(env: Env) -> None:
    big = os.urandom(MAX_ARTIFACT_BYTES + 1)
    meta = serde.meta_to_pb(env.meta)
    meta.sha256 = hashlib.sha256(big).hexdigest()
    meta.size_bytes = 0  # unannounced: the limit must catch it while streaming
    with pytest.raises(grpc.RpcError) as err:
        env.stub.Upload(chunks(big, meta, size=16 * 1024), timeout=RPC_S)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not env.stub.Has(agent_pb2.HasRequest(sha256=meta.sha256), timeout=RPC_S).present


def test_upload_without_meta_is_invalid(env: Env) -> None:
    with pytest.raises(grpc.RpcError) as err:
        env.stub.Upload(iter([agent_pb2.UploadChunk(data=b"x")]), timeout=RPC_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_cancelled_upload_stores_nothing(env: Env) -> None:
    data = os.urandom(8 * 1024)
    meta = serde.meta_to_pb(env.meta)
    meta.sha256 = hashlib.sha256(data).hexdigest()
    sent_two, release = threading.Event(), threading.Event()

    def stream() -> Iterator[agent_pb2.UploadChunk]:
        for i, chunk in enumerate(chunks(data, meta)):
            if i == 2:
                sent_two.set()
                release.wait(timeout=RPC_S)
            yield chunk

    tmp_dir = os.path.join(env.cache_dir, "tmp")
    future = env.stub.Upload.future(stream(), timeout=RPC_S)
    assert sent_two.wait(timeout=RPC_S)
    deadline = time.monotonic() + 10.0
    while not os.listdir(tmp_dir) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.listdir(tmp_dir), "the agent never started storing the upload"
    future.cancel()
    release.set()
    deadline = time.monotonic() + 10.0
    while os.listdir(tmp_dir) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.listdir(tmp_dir) == []
    assert not env.stub.Has(agent_pb2.HasRequest(sha256=meta.sha256), timeout=RPC_S).present


def test_crash_is_reported_and_the_device_serves_the_next_request(env: Env) -> None:
    result = measure(env, "crash")
    assert result.status == common_pb2.CRASH
    assert result.signal == 11 and "SIGSEGV" in result.error
    assert_ok(measure(env, "add_one"))


def test_hang_times_out_and_the_device_serves_the_next_request(env: Env) -> None:
    result = measure(env, "hang", timeout_s=1.0)
    assert result.status == common_pb2.TIMEOUT
    assert_ok(measure(env, "add_one"))


def test_cancelled_measure_frees_the_device(env: Env) -> None:
    device = env.agent.devices[1].device_id
    request = agent_pb2.MeasureRequest(
        device_id=device, artifact_sha256=env.meta.sha256, symbol="hang"
    )
    future = env.stub.Measure.future(request, timeout=RPC_S)
    time.sleep(0.3)
    future.cancel()
    # Without the cancel, the hang would hold this device for the agent's 30 s default timeout.
    request = agent_pb2.MeasureRequest(
        device_id=device,
        artifact_sha256=env.meta.sha256,
        symbol="add_one",
        config=common_pb2.EvaluatorConfig(repeat=4),
    )
    assert_ok(env.stub.Measure(request, timeout=10.0))


def test_nonzero_return_is_runtime_error(env: Env) -> None:
    result = measure(env, "fail")
    assert result.status == common_pb2.RUNTIME_ERROR and "returned 1" in result.error


def test_address_space_limit_makes_a_huge_malloc_fail(env: Env) -> None:
    request = agent_pb2.RunRequest(
        device_id=env.device, artifact_sha256=env.meta.sha256, symbol="alloc_big"
    )
    result = env.stub.Run(request, timeout=RPC_S)
    assert result.status == common_pb2.RUNTIME_ERROR and "returned 3" in result.error


def test_run_from_seed_and_from_inputs(env: Env) -> None:
    request = agent_pb2.RunRequest(
        device_id=env.device, artifact_sha256=env.meta.sha256, symbol="add_one", seed=5
    )
    result = env.stub.Run(request, timeout=RPC_S)
    assert result.status == common_pb2.OK, result.error
    x = make_args(kernel_entry("add_one").args, seed=5)[0]
    np.testing.assert_array_equal(serde.ndarray_from_pb(result.outputs[0]), x + 1)

    x = np.linspace(-1, 1, N, dtype=np.float32)
    request.inputs.append(serde.ndarray_to_pb(x))
    result = env.stub.Run(request, timeout=RPC_S)
    np.testing.assert_array_equal(serde.ndarray_from_pb(result.outputs[0]), x + 1)


def test_run_with_mismatched_inputs_is_invalid(env: Env) -> None:
    request = agent_pb2.RunRequest(
        device_id=env.device,
        artifact_sha256=env.meta.sha256,
        symbol="add_one",
        inputs=[serde.ndarray_to_pb(np.zeros(3, np.float32))],
    )
    with pytest.raises(grpc.RpcError) as err:
        env.stub.Run(request, timeout=RPC_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_check_against_a_reference(env: Env) -> None:
    def checked(
        reference_symbol: str, reference_sha256: str = env.meta.sha256
    ) -> common_pb2.MeasureResult:
        request = agent_pb2.MeasureRequest(
            device_id=env.device,
            artifact_sha256=env.meta.sha256,
            symbol="add_one",
            seed=3,
            config=common_pb2.EvaluatorConfig(repeat=4),
            check=common_pb2.CheckSpec(
                reference_sha256=reference_sha256,
                reference_symbol=reference_symbol,
                rtol=1e-6,
                atol=1e-6,
            ),
        )
        return env.stub.Measure(request, timeout=RPC_S)

    assert_ok(checked("add_one"))
    wrong = checked("add_two")
    assert wrong.status == common_pb2.WRONG_ANSWER and "max abs error 1" in wrong.error
    assert checked("add_one", "ef" * 32).status == common_pb2.LOAD_ERROR


def test_bad_requests_are_rpc_errors(env: Env) -> None:
    with pytest.raises(grpc.RpcError) as err:
        measure(env, "add_one", device="nobody/0")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    request = agent_pb2.MeasureRequest(device_id=env.device, artifact_sha256="../../etc/passwd")
    with pytest.raises(grpc.RpcError) as err:
        env.stub.Measure(request, timeout=RPC_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        env.stub.Has(agent_pb2.HasRequest(sha256="../x"), timeout=RPC_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_info_lists_the_devices(env: Env) -> None:
    info = env.stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S)
    assert info.agent_id == env.agent.agent_id
    assert [d.device_id for d in info.devices] == [f"{info.agent_id}/0", f"{info.agent_id}/1"]
    assert all(d.key == "test-cpu" and d.backend == "cpu" and d.tags["arch"] for d in info.devices)
    assert info.version

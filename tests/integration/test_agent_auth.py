"""Access to a real agent on 127.0.0.1: role tokens, lease fencing tokens, TLS, names off the wire.

Tokens are made with `protos.fencing.sign` directly (no tracker needed); certificates with the
openssl CLI in tmp_path.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from device_agent import serde
from device_agent.agent import Agent
from device_agent.config import AgentConfig
from device_agent.domain import ArtifactMeta
from device_agent.server import create_server
from device_agent.testing import build_kernels, upload_chunks, write_tls_files
from protos import agent_pb2, agent_pb2_grpc, common_pb2, tracker_pb2, tracker_pb2_grpc
from protos.auth import PoolSecrets, Role, TlsFiles, call_metadata, open_channel, write_secrets
from protos.fencing import LeaseClaims, sign

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

RPC_S = 20.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Env:
    stub: agent_pb2_grpc.AgentStub
    agent: Agent
    secrets: PoolSecrets
    meta: ArtifactMeta
    data: bytes
    channel: grpc.Channel

    @property
    def client(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(self.secrets.token(Role.CLIENT))

    def token(self, lease: str, device: str, fence: int = 100, ttl_s: float = 60.0) -> str:
        expires_ms = int((time.time() + ttl_s) * 1000)
        return sign(self.secrets.require_lease_key(), LeaseClaims(lease, device, fence, expires_ms))

    def measure(
        self, lease: str, token: str, device: str | None = None
    ) -> common_pb2.MeasureResult:
        request = agent_pb2.MeasureRequest(
            device_id=device or self.agent.devices[0].device_id,
            lease_id=lease,
            lease_token=token,
            artifact_sha256=self.meta.sha256,
            symbol="add_one",
            config=common_pb2.EvaluatorConfig(repeat=2),
        )
        return self.stub.Measure(request, timeout=RPC_S, metadata=self.client)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("secured")
    secrets = write_secrets(root / "pool.secrets")
    data, meta = build_kernels(str(root))
    config = AgentConfig(
        key="sec", devices=2, cache_dir=str(root / "cache"), secrets=secrets, lease_leeway_s=0.0
    )
    server, port, agent = create_server("127.0.0.1:0", config)
    with server, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        stub.Upload(
            upload_chunks(data, serde.meta_to_pb(meta)),
            timeout=RPC_S,
            metadata=call_metadata(secrets.token(Role.CLIENT)),
        )
        yield Env(stub, agent, secrets, meta, data, channel)


def test_every_rpc_needs_the_client_or_admin_token(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    device = env.agent.devices[0].device_id
    sha = env.meta.sha256
    Metadata = tuple[tuple[str, str], ...]
    calls = {
        "Info": lambda m: env.stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S, metadata=m),
        "Has": lambda m: env.stub.Has(agent_pb2.HasRequest(sha256=sha), timeout=RPC_S, metadata=m),
        "Upload": lambda m: env.stub.Upload(
            upload_chunks(env.data, serde.meta_to_pb(env.meta)), timeout=RPC_S, metadata=m
        ),
        "Measure": lambda m: env.stub.Measure(
            agent_pb2.MeasureRequest(device_id=device, artifact_sha256=sha, symbol="add_one"),
            timeout=RPC_S,
            metadata=m,
        ),
        "Run": lambda m: env.stub.Run(
            agent_pb2.RunRequest(device_id=device, artifact_sha256=sha, symbol="add_one"),
            timeout=RPC_S,
            metadata=m,
        ),
    }
    agent_token = env.secrets.token(Role.AGENT)
    cases: list[tuple[Metadata, grpc.StatusCode, str]] = [
        ((), grpc.StatusCode.UNAUTHENTICATED, "missing bearer token"),
        (call_metadata("not-a-pool-token-at-all"), grpc.StatusCode.UNAUTHENTICATED, "unknown"),
        (call_metadata(agent_token), grpc.StatusCode.PERMISSION_DENIED, "role 'agent'"),
    ]
    with caplog.at_level(logging.WARNING, logger="device_agent"):
        for metadata, code, message in cases:
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as err:
                    call(metadata)
                assert err.value.code() == code, name
                assert message in err.value.details(), name
    assert "PERMISSION_DENIED" in caplog.text and "/kiln.v1.Agent/Upload" in caplog.text
    assert agent_token not in caplog.text
    # The health service answers without a token, so a deploy script can probe the agent.
    health = health_pb2_grpc.HealthStub(env.channel).Check(
        health_pb2.HealthCheckRequest(service="kiln.v1.Agent"), timeout=RPC_S
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    for role in (Role.CLIENT, Role.ADMIN):
        m = call_metadata(env.secrets.token(role))
        assert calls["Info"](m).agent_id == env.agent.agent_id
        assert calls["Has"](m).present
        assert calls["Upload"](m).sha256 == sha
        # Authenticated, but without a lease: a result, not an RPC error.
        assert calls["Measure"](m).status == common_pb2.UNAUTHORIZED
        assert calls["Run"](m).status == common_pb2.UNAUTHORIZED


def test_a_valid_lease_token_measures_and_runs(env: Env) -> None:
    device = env.agent.devices[0].device_id
    result = env.measure("lease-ok", env.token("lease-ok", device))
    assert result.status == common_pb2.OK, result.error
    run = env.stub.Run(
        agent_pb2.RunRequest(
            device_id=device,
            lease_id="lease-ok",
            lease_token=env.token("lease-ok", device),
            artifact_sha256=env.meta.sha256,
            symbol="add_one",
        ),
        timeout=RPC_S,
        metadata=env.client,
    )
    assert run.status == common_pb2.OK, run.error


def test_bad_lease_tokens_are_unauthorized_with_the_reason(env: Env) -> None:
    device, other = (d.device_id for d in env.agent.devices)
    key = env.secrets.require_lease_key()
    now_ms = int(time.time() * 1000)
    cases = {
        "expired": env.token("L", other, ttl_s=-5.0),
        "signature does not match": sign(b"f" * 32, LeaseClaims("L", other, 1, now_ms + 60_000)),
        "malformed": "k1.not.a.token",
    }
    for reason, token in cases.items():
        result = env.measure("L", token, other)
        assert result.status == common_pb2.UNAUTHORIZED and reason in result.error, reason
        assert not result.samples_s
    # A genuine token, but for the other device or another lease.
    mine = env.token("L", device)
    for lease, dev in (("L", other), ("L2", device)):
        result = env.measure(lease, mine, dev)
        assert result.status == common_pb2.UNAUTHORIZED
        assert "signature does not match" in result.error
    # A newer lease on the device fences out the older one, even before the older expires.
    assert env.measure("L-new", env.token("L-new", other, fence=500), other).status == common_pb2.OK
    stale = env.measure("L-old", env.token("L-old", other, fence=499), other)
    assert stale.status == common_pb2.UNAUTHORIZED
    assert "superseded by a newer lease" in stale.error
    assert sign(key, LeaseClaims("x", other, 1, now_ms))  # the key itself is a real one


def test_names_from_the_wire_are_never_paths(env: Env) -> None:
    device = env.agent.devices[0].device_id
    bad_hashes = ["../" + "a" * 61, "a" * 63, "A" * 63 + "/", "g" * 64, ""]
    for sha in bad_hashes:
        with pytest.raises(grpc.RpcError) as err:
            env.stub.Has(agent_pb2.HasRequest(sha256=sha), timeout=RPC_S, metadata=env.client)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for symbol in ("../../etc/passwd", "lib/add_one", "add_one.so", ".."):
        with pytest.raises(grpc.RpcError) as err:
            env.stub.Measure(
                agent_pb2.MeasureRequest(
                    device_id=device, artifact_sha256=env.meta.sha256, symbol=symbol
                ),
                timeout=RPC_S,
                metadata=env.client,
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "C identifier" in err.value.details()
        meta = serde.meta_to_pb(env.meta)
        meta.entries[0].symbol = symbol
        with pytest.raises(grpc.RpcError) as err:
            env.stub.Upload(upload_chunks(env.data, meta), timeout=RPC_S, metadata=env.client)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("flush_cache_bytes", 1 << 40),
        ("repeat", 1_000_000_000),
        ("warmup", 100_000),
        ("min_repeat_ms", float("inf")),
        ("cooldown_ms", -1.0),
        ("timeout_s", float("nan")),
    ],
)
def test_a_timing_config_out_of_bounds_is_refused_naming_the_field(
    env: Env, field: str, value: float
) -> None:
    """Checked before the lease and before anything runs: a 1 TiB sweep buffer or a billion
    repeats would take the executor child's memory or the device for good."""
    device = env.agent.devices[0].device_id
    config = common_pb2.EvaluatorConfig()
    setattr(config, field, value)
    with pytest.raises(grpc.RpcError) as err:
        env.stub.Measure(
            agent_pb2.MeasureRequest(
                device_id=device, artifact_sha256=env.meta.sha256, symbol="add_one", config=config
            ),
            timeout=RPC_S,
            metadata=env.client,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"timing config {field} must be 0.." in (err.value.details() or "")


def test_secured_agent_needs_a_lease_key(tmp_path: Path) -> None:
    secrets = PoolSecrets({Role.CLIENT: "c" * 20, Role.AGENT: "a" * 20}, lease_key=None)
    config = AgentConfig(backend="null", cache_dir=str(tmp_path), secrets=secrets)
    with pytest.raises(ValueError, match="lease_key"):
        create_server("127.0.0.1:0", config)


def test_tls_and_mutual_tls(tmp_path: Path) -> None:
    tls = write_tls_files(str(tmp_path / "pki"))
    for mutual in (False, True):
        config = AgentConfig(
            backend="null",
            cache_dir=str(tmp_path / "cache"),
            tls=TlsFiles(tls["server_cert"], tls["server_key"], tls["ca"] if mutual else None),
        )
        server, port, agent = create_server("127.0.0.1:0", config)
        address = f"127.0.0.1:{port}"
        with server:
            with grpc.insecure_channel(address) as plain:
                with pytest.raises(grpc.RpcError) as err:
                    agent_pb2_grpc.AgentStub(plain).Info(agent_pb2.InfoRequest(), timeout=5.0)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            client = TlsFiles(
                tls["client_cert"] if mutual else None,
                tls["client_key"] if mutual else None,
                tls["ca"],
            )
            with open_channel(address, client) as channel:
                info = agent_pb2_grpc.AgentStub(channel).Info(
                    agent_pb2.InfoRequest(), timeout=RPC_S
                )
                assert info.agent_id == agent.agent_id
            if mutual:
                with open_channel(address, TlsFiles(ca=tls["ca"])) as channel:
                    with pytest.raises(grpc.RpcError) as err:
                        agent_pb2_grpc.AgentStub(channel).Info(agent_pb2.InfoRequest(), timeout=5.0)
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


class RecordingTracker(tracker_pb2_grpc.TrackerServicer):
    """Keeps the bearer metadata of every Register and Heartbeat."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def _note(self, method: str, context: grpc.ServicerContext) -> None:
        auth = dict(context.invocation_metadata()).get("authorization", "")
        self.seen.append((method, str(auth)))

    def Register(
        self, request: tracker_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.RegisterResponse:
        self._note("Register", context)
        return tracker_pb2.RegisterResponse(heartbeat_interval_s=0.05)

    def Heartbeat(
        self, request: tracker_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.HeartbeatResponse:
        self._note("Heartbeat", context)
        return tracker_pb2.HeartbeatResponse(known=True)


def test_registration_sends_the_agent_token_over_tls(tmp_path: Path) -> None:
    from protos.auth import server_credentials

    tls = write_tls_files(str(tmp_path / "pki"))
    secrets = write_secrets(tmp_path / "pool.secrets")
    tracker = RecordingTracker()
    tracker_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    tracker_pb2_grpc.add_TrackerServicer_to_server(tracker, tracker_server)
    port = tracker_server.add_secure_port(
        "127.0.0.1:0", server_credentials(TlsFiles(tls["server_cert"], tls["server_key"]))
    )
    tracker_server.start()
    try:
        config = AgentConfig(
            backend="null",
            cache_dir=str(tmp_path / "cache"),
            secrets=secrets,
            tracker_address=f"127.0.0.1:{port}",
            tracker_tls=TlsFiles(ca=tls["ca"]),
        )
        server, _, _ = create_server("127.0.0.1:0", config)
        with server:
            deadline = time.monotonic() + 20.0
            while len(tracker.seen) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        tracker_server.stop(None)
    assert [m for m, _ in tracker.seen[:2]] == ["Register", "Heartbeat"]
    bearer = f"Bearer {secrets.token(Role.AGENT)}"
    assert all(auth == bearer for _, auth in tracker.seen)


def test_open_agent_refuses_a_non_loopback_address(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "device_agent", "--key", "k", "--backend", "null"]
    proc = subprocess.run(
        [*base, "--listen", "0.0.0.0:0", "--cache-dir", str(tmp_path)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert b"without --token-file" in proc.stderr and b"--insecure" in proc.stderr
    from device_agent.__main__ import is_loopback, parse_args

    assert parse_args(["--key", "k", "--listen", "0.0.0.0:0", "--insecure"]).insecure
    assert parse_args(["--key", "k", "--listen", "0.0.0.0:0", "--token-file", "f"]).token_file
    assert is_loopback("127.0.0.1:1") and is_loopback("[::1]:1") and is_loopback("localhost:1")
    assert not is_loopback("0.0.0.0:1") and not is_loopback("10.1.2.3:1")
    assert not is_loopback("[::]:9191")


def test_a_second_agent_on_a_taken_port_fails_instead_of_sharing_it(tmp_path: Path) -> None:
    """gRPC binds with SO_REUSEPORT by default: a second agent would have taken half of the
    first one's connections."""
    first = AgentConfig(backend="null", cache_dir=str(tmp_path / "a"))
    server, port, _ = create_server("127.0.0.1:0", first)
    with server:
        second = AgentConfig(backend="null", cache_dir=str(tmp_path / "b"))
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            create_server(f"127.0.0.1:{port}", second)


@pytest.mark.parametrize(("key", "agent_id"), [("x86 avx512", ""), ("k", "a|b")])
def test_an_agent_with_a_key_or_id_the_tracker_would_refuse_does_not_start(
    tmp_path: Path, key: str, agent_id: str
) -> None:
    config = AgentConfig(backend="null", cache_dir=str(tmp_path), key=key, agent_id=agent_id)
    with pytest.raises(
        ValueError, match=r"must be 1 to 128 characters .*\(the tracker refuses it\)"
    ):
        create_server("127.0.0.1:0", config)


@pytest.mark.parametrize("dtype", ["O", "U8", "datetime64[s]", "float32,int32", "no-such-type"])
def test_an_input_of_a_dtype_no_kernel_takes_is_invalid_argument_naming_it(
    env: Env, dtype: str
) -> None:
    """An object array ("O") used to come back UNKNOWN with numpy's own text."""
    device = env.agent.devices[0].device_id
    with pytest.raises(grpc.RpcError) as err:
        env.stub.Run(
            agent_pb2.RunRequest(
                device_id=device,
                lease_id="lease-ok",
                lease_token=env.token("lease-ok", device),
                artifact_sha256=env.meta.sha256,
                symbol="add_one",
                inputs=[common_pb2.NDArray(shape=[1], dtype=dtype, data=b"\0" * 8)],
            ),
            timeout=RPC_S,
            metadata=env.client,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a number or bool type" in (err.value.details() or "")


def test_malformed_bytes_are_invalid_argument_and_the_agent_keeps_serving(env: Env) -> None:
    """As on the tracker (protos.decoding): the agent said INTERNAL "Exception deserializing"."""
    raw_info = env.channel.unary_unary("/kiln.v1.Agent/Info")
    with pytest.raises(grpc.RpcError) as err:
        raw_info(b"\x0a\xff\x01\x02", timeout=RPC_S, metadata=env.client)  # truncated field 1
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request to /kiln.v1.Agent/Info" in (err.value.details() or "")
    info = env.stub.Info(agent_pb2.InfoRequest(), timeout=RPC_S, metadata=env.client)
    assert info.agent_id == env.agent.agent_id

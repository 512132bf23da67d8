"""Token auth by role and TLS / mutual TLS on a real tracker server on 127.0.0.1, port 0.

Certificates are made for each test module with the real `openssl` CLI: a throwaway CA, a server
certificate for IP 127.0.0.1 and a client certificate, all signed by that CA.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tls_certs import make_certs

from protos import common_pb2, fencing, tracker_pb2, tracker_pb2_grpc
from protos.auth import PoolSecrets, Role, TlsFiles, call_metadata, open_channel, write_secrets
from tracker.config import TrackerConfig
from tracker.server import ServingTracker, create_server

RPC_TIMEOUT_S = 10.0


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem, server.pem/.key (SAN IP:127.0.0.1), client.pem/.key, other_ca.pem."""
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> PoolSecrets:
    return write_secrets(tmp_path_factory.mktemp("secrets") / "pool.secrets")


@pytest.fixture
def tracker(secrets: PoolSecrets) -> Iterator[ServingTracker]:
    serving = create_server(
        "127.0.0.1:0", TrackerConfig(heartbeat_interval_s=5.0), secrets=secrets, metrics_port=0
    )
    try:
        yield serving
    finally:
        serving.stop(grace_s=0.5)


@pytest.fixture
def channel(tracker: ServingTracker) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(tracker.address) as ch:
        yield ch


def _register_request(agent_id: str = "a1") -> tracker_pb2.RegisterRequest:
    return tracker_pb2.RegisterRequest(
        agent_id=agent_id,
        agent_address="127.0.0.1:7000",
        devices=[common_pb2.DeviceSpec(key="x86")],
    )


# Each method with a valid request and the roles that may call it.
CALLS: dict[str, tuple[Any, set[Role]]] = {
    "Register": (_register_request(), {Role.AGENT, Role.ADMIN}),
    "Heartbeat": (tracker_pb2.HeartbeatRequest(agent_id="a1"), {Role.AGENT, Role.ADMIN}),
    "Deregister": (tracker_pb2.DeregisterRequest(agent_id="gone"), {Role.AGENT, Role.ADMIN}),
    "Acquire": (tracker_pb2.AcquireRequest(key="x86"), {Role.CLIENT, Role.ADMIN}),
    "Renew": (tracker_pb2.RenewRequest(lease_id="nope"), {Role.CLIENT, Role.ADMIN}),
    "Release": (tracker_pb2.ReleaseRequest(lease_id="nope"), {Role.CLIENT, Role.ADMIN}),
    "ListDevices": (tracker_pb2.ListDevicesRequest(), {Role.CLIENT, Role.ADMIN}),
}


def _call(channel: grpc.Channel, method: str, token: str | None) -> grpc.StatusCode:
    request, _ = CALLS[method]
    stub = tracker_pb2_grpc.TrackerStub(channel)
    try:
        getattr(stub, method)(request, timeout=RPC_TIMEOUT_S, metadata=call_metadata(token))
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        return code
    return grpc.StatusCode.OK


def _list_as_admin(channel: grpc.Channel, secrets: PoolSecrets) -> list[Any]:
    stub = tracker_pb2_grpc.TrackerStub(channel)
    return list(
        stub.ListDevices(
            tracker_pb2.ListDevicesRequest(),
            timeout=RPC_TIMEOUT_S,
            metadata=call_metadata(secrets.token(Role.ADMIN)),
        ).devices
    )


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=RPC_TIMEOUT_S) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


# -- roles --------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", list(Role))
def test_each_role_may_call_exactly_its_methods(
    channel: grpc.Channel, secrets: PoolSecrets, role: Role
) -> None:
    outcomes = {method: _call(channel, method, secrets.token(role)) for method in CALLS}
    expected = {
        method: grpc.StatusCode.OK if role in allowed else grpc.StatusCode.PERMISSION_DENIED
        for method, (_, allowed) in CALLS.items()
    }
    assert outcomes == expected


@pytest.mark.parametrize("token", [None, "not-a-pool-token-at-all"])
def test_missing_or_unknown_token_is_unauthenticated_everywhere(
    channel: grpc.Channel, token: str | None
) -> None:
    assert {method: _call(channel, method, token) for method in CALLS} == {
        method: grpc.StatusCode.UNAUTHENTICATED for method in CALLS
    }


def test_client_token_cannot_register_and_rejections_are_logged_and_counted(
    tracker: ServingTracker,
    channel: grpc.Channel,
    secrets: PoolSecrets,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client_token = secrets.token(Role.CLIENT)
    stub = tracker_pb2_grpc.TrackerStub(channel)
    with caplog.at_level(logging.WARNING, logger="tracker.auth"):
        with pytest.raises(grpc.RpcError) as denied:
            stub.Register(
                _register_request("evil"),
                timeout=RPC_TIMEOUT_S,
                metadata=call_metadata(client_token),
            )
        with pytest.raises(grpc.RpcError) as missing:
            stub.Register(_register_request("evil"), timeout=RPC_TIMEOUT_S)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "role 'client' may not call /kiln.v1.Tracker/Register" in denied.value.details()
    assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _list_as_admin(channel, secrets) == []  # nothing registered
    logged = [r.getMessage() for r in caplog.records if r.name == "tracker.auth"]
    assert len(logged) == 2
    assert "/kiln.v1.Tracker/Register" in logged[0] and "ipv4:127.0.0.1" in logged[0]
    assert "PERMISSION_DENIED" in logged[0] and "(role client)" in logged[0]
    assert "UNAUTHENTICATED" in logged[1] and "(role none)" in logged[1]
    assert all(client_token not in message for message in logged)
    metrics = _scrape(tracker.metrics_url)
    method = ("method", "/kiln.v1.Tracker/Register")
    assert (
        metrics[("kiln_tracker_auth_rejections_total", (("code", "PERMISSION_DENIED"), method))]
        == 1
    )
    assert (
        metrics[("kiln_tracker_auth_rejections_total", (("code", "UNAUTHENTICATED"), method))] == 1
    )


def test_agent_token_registers_and_client_token_leases(
    channel: grpc.Channel, secrets: PoolSecrets
) -> None:
    stub = tracker_pb2_grpc.TrackerStub(channel)
    agent = call_metadata(secrets.token(Role.AGENT))
    client = call_metadata(secrets.token(Role.CLIENT))
    stub.Register(_register_request(), timeout=RPC_TIMEOUT_S, metadata=agent)
    response = stub.Acquire(
        tracker_pb2.AcquireRequest(key="x86", user="bob"), timeout=RPC_TIMEOUT_S, metadata=client
    )
    assert response.status == common_pb2.OK, response.reason
    # The lease token is signed with the pool's lease key: an agent can check it on its own.
    lease = response.lease
    claims = fencing.verify(
        secrets.require_lease_key(),
        lease.token,
        lease.lease_id,
        lease.device.device_id,
        time.time(),
    )
    assert claims.expires_at_ms == round(lease.expires_at_unix * 1000)
    with pytest.raises(grpc.RpcError) as denied:
        stub.Acquire(tracker_pb2.AcquireRequest(key="x86"), timeout=RPC_TIMEOUT_S, metadata=agent)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    [device] = _list_as_admin(channel, secrets)
    assert (device.state, device.lease_holder) == (tracker_pb2.LEASED, "bob")


def test_health_needs_no_token(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "kiln.v1.Tracker"):
        response = health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S
        )
        assert response.status == health_pb2.HealthCheckResponse.SERVING


# -- TLS ----------------------------------------------------------------------------------------


def _list_over(address: str, tls: TlsFiles | None, secrets: PoolSecrets) -> grpc.StatusCode:
    with open_channel(address, tls) as ch:
        try:
            tracker_pb2_grpc.TrackerStub(ch).ListDevices(
                tracker_pb2.ListDevicesRequest(),
                timeout=5.0,
                metadata=call_metadata(secrets.token(Role.CLIENT)),
            )
        except grpc.RpcError as error:
            code: grpc.StatusCode = error.code()
            return code
    return grpc.StatusCode.OK


def test_tls_client_connects_and_plaintext_or_untrusting_clients_fail(
    certs: Path, secrets: PoolSecrets
) -> None:
    server_tls = TlsFiles(cert=str(certs / "server.pem"), key=str(certs / "server.key"))
    serving = create_server("127.0.0.1:0", secrets=secrets, tls=server_tls)
    try:
        trusted = TlsFiles(ca=str(certs / "ca.pem"))
        assert _list_over(serving.address, trusted, secrets) == grpc.StatusCode.OK
        assert _list_over(serving.address, None, secrets) == grpc.StatusCode.UNAVAILABLE
        untrusting = TlsFiles(ca=str(certs / "other_ca.pem"))
        assert _list_over(serving.address, untrusting, secrets) == grpc.StatusCode.UNAVAILABLE
    finally:
        serving.stop(grace_s=0.5)


def test_mutual_tls_needs_a_client_certificate_from_the_ca(
    certs: Path, secrets: PoolSecrets
) -> None:
    server_tls = TlsFiles(
        cert=str(certs / "server.pem"), key=str(certs / "server.key"), ca=str(certs / "ca.pem")
    )
    serving = create_server("127.0.0.1:0", secrets=secrets, tls=server_tls)
    try:
        with_cert = TlsFiles(
            cert=str(certs / "client.pem"), key=str(certs / "client.key"), ca=str(certs / "ca.pem")
        )
        assert _list_over(serving.address, with_cert, secrets) == grpc.StatusCode.OK
        without_cert = TlsFiles(ca=str(certs / "ca.pem"))
        assert _list_over(serving.address, without_cert, secrets) == grpc.StatusCode.UNAVAILABLE
        # A server certificate presented as a client one is signed by the CA but not for clients.
        wrong_use = TlsFiles(
            cert=str(certs / "server.pem"), key=str(certs / "server.key"), ca=str(certs / "ca.pem")
        )
        assert _list_over(serving.address, wrong_use, secrets) == grpc.StatusCode.UNAVAILABLE
    finally:
        serving.stop(grace_s=0.5)

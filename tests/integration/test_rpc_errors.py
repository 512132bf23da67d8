"""protos.rpc_errors against real TLS mismatches: real gRPC servers on 127.0.0.1, port 0.

Each server serves only the standard health service; each call has a 2 s deadline.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tls_certs import make_certs

from protos.auth import TlsFiles, open_channel, server_credentials
from protos.rpc_errors import explain_rpc_error
from tracker.testing import free_port

DEADLINE_S = 2.0
TLS_BLAMED = "TLS is the likely cause"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem, server.pem/.key (SAN IP:127.0.0.1), client.pem/.key, other_ca.pem."""
    return make_certs(tmp_path_factory.mktemp("tls"))


@contextmanager
def health_server(credentials: grpc.ServerCredentials | None) -> Iterator[str]:
    """A server of the health service on 127.0.0.1, port 0; yields its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


@pytest.fixture(scope="module")
def tls_server(certs: Path) -> Iterator[str]:
    tls = TlsFiles(cert=str(certs / "server.pem"), key=str(certs / "server.key"))
    with health_server(server_credentials(tls)) as address:
        yield address


@pytest.fixture(scope="module")
def mutual_tls_server(certs: Path) -> Iterator[str]:
    tls = TlsFiles(str(certs / "server.pem"), str(certs / "server.key"), str(certs / "ca.pem"))
    with health_server(server_credentials(tls)) as address:
        yield address


@pytest.fixture(scope="module")
def plain_server() -> Iterator[str]:
    with health_server(None) as address:
        yield address


def failure(address: str, tls: TlsFiles) -> str:
    """The explained error of a health check on `address` (which must fail)."""
    with open_channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
    return explain_rpc_error(caught.value, address, tls.enabled)


def test_matching_tls_works(certs: Path, tls_server: str) -> None:
    """The mismatches below fail for TLS alone: the same server answers a matching client."""
    with open_channel(tls_server, TlsFiles(ca=str(certs / "ca.pem"))) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=DEADLINE_S
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_client_to_a_tls_server(tls_server: str) -> None:
    message = failure(tls_server, TlsFiles())
    assert message.startswith(f"{tls_server}: UNAVAILABLE: ")
    assert TLS_BLAMED in message and "pass --tls-ca" in message
    assert "\n" not in message


def test_tls_client_to_a_plaintext_server(certs: Path, plain_server: str) -> None:
    message = failure(plain_server, TlsFiles(ca=str(certs / "ca.pem")))
    assert message.startswith(f"{plain_server}: UNAVAILABLE: ")
    assert TLS_BLAMED in message and "does not speak TLS" in message


def test_tls_client_trusting_another_ca(certs: Path, tls_server: str) -> None:
    message = failure(tls_server, TlsFiles(ca=str(certs / "other_ca.pem")))
    assert message.startswith(f"{tls_server}: UNAVAILABLE: ")
    assert TLS_BLAMED in message and "not signed by the CA this client trusts" in message


def test_tls_client_without_a_certificate_to_a_mutual_tls_server(
    certs: Path, mutual_tls_server: str
) -> None:
    message = failure(mutual_tls_server, TlsFiles(ca=str(certs / "ca.pem")))
    assert TLS_BLAMED in message and "--tls-cert and --tls-key" in message


@pytest.mark.parametrize("use_tls", [False, True])
def test_a_refused_connection_does_not_blame_tls(certs: Path, use_tls: bool) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    tls = TlsFiles(ca=str(certs / "ca.pem")) if use_tls else TlsFiles()
    message = failure(address, tls)
    assert message.startswith(f"{address}: UNAVAILABLE: ")
    assert "Connection refused" in message
    assert "TLS" not in message


def test_an_answer_from_the_server_does_not_blame_tls(plain_server: str) -> None:
    with open_channel(plain_server) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")  # raw bytes in and out
        with pytest.raises(grpc.RpcError) as caught:
            check(b"\xff", timeout=DEADLINE_S)  # not a HealthCheckRequest
    message = explain_rpc_error(caught.value, plain_server, tls_enabled=False)
    assert message.startswith(f"{plain_server}: ") and "TLS" not in message

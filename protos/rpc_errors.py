"""One-line explanations of failed gRPC calls, naming TLS when it is the likely cause.

A TLS mismatch reaches the caller as a bare UNAVAILABLE. These are the `details()` texts grpcio
(1.85, BoringSSL) gives for each mismatch, and the advice given for each:

    plaintext client, TLS server      "... Socket closed"
        -> pass --tls-ca (the server expects TLS)
    TLS client, plaintext server      "... Tls handshake failed ... WRONG_VERSION_NUMBER ..."
        -> drop the TLS flags (the server speaks plaintext)
    TLS client, CA not trusted        "... CERTIFICATE_VERIFY_FAILED: unable to get local issuer ..."
        -> pass --tls-ca with the CA that signed the server's certificate
    TLS client, name not in the cert  "... Hostname Verification Check failed."
        -> connect by a name or address the certificate lists
    TLS client without a certificate  "... Socket closed"
      to a mutual-TLS server             -> pass --tls-cert and --tls-key

The flag names are the `kiln` CLI's. A refused connection, an unknown host or a deadline carries
none of these texts and gets no TLS advice.
"""

from __future__ import annotations

import grpc

_SOCKET_CLOSED = "Socket closed"
_PLAINTEXT_PEER = "WRONG_VERSION_NUMBER"
_UNTRUSTED = "CERTIFICATE_VERIFY_FAILED"
_HOSTNAME = "Hostname Verification"
_HANDSHAKE = ("Tls handshake failed", "SSL_ERROR", "Handshake failed")


def explain_rpc_error(exc: grpc.RpcError, address: str, tls_enabled: bool) -> str:
    """`<address>: <STATUS>: <details>` on one line, and why TLS is the likely cause when it is.

    Args:
        exc: the error a call raised.
        address: the host:port the channel was opened to.
        tls_enabled: whether the channel was opened with TLS credentials.
    """
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    status = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    text = " ".join(str(details or exc).split())  # one line, whatever grpc put in it
    message = f"{address}: {status}: {text}"
    hint = tls_hint(text, address, tls_enabled)
    return f"{message}; TLS is the likely cause: {hint}" if hint else message


def tls_hint(details: str, address: str, tls_enabled: bool) -> str | None:
    """What to do when `details` of a failed call look like a TLS mismatch, else None."""
    host = address.rsplit(":", 1)[0]
    if not tls_enabled:
        if _SOCKET_CLOSED in details:
            return (
                f"{address} closed a plaintext connection, so it probably expects TLS; "
                "pass --tls-ca with the CA that signed its certificate"
            )
        return None
    if _PLAINTEXT_PEER in details:
        return (
            f"{address} does not speak TLS; drop --tls-ca/--tls-cert/--tls-key, "
            "or start it with a certificate"
        )
    if _UNTRUSTED in details:
        return (
            f"the certificate of {address} is not signed by the CA this client trusts; "
            "pass --tls-ca with the CA that signed it"
        )
    if _HOSTNAME in details:
        return (
            f"the certificate of {address} does not name {host}; connect by a host name or IP "
            "address it lists (subjectAltName)"
        )
    if _SOCKET_CLOSED in details:
        return (
            f"{address} closed the connection during the TLS handshake; if it requires client "
            "certificates (mutual TLS), pass --tls-cert and --tls-key signed by a CA it trusts"
        )
    if any(marker in details for marker in _HANDSHAKE):
        return "the TLS handshake failed; check --tls-ca, --tls-cert and --tls-key"
    return None

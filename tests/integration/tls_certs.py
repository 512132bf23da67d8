"""Throwaway TLS material for tests, made with the real `openssl` CLI.

`make_certs(directory)` writes, all with P-256 keys and valid for two days:

    ca.pem / ca.key              the pool's CA
    other_ca.pem / other_ca.key  a CA nobody trusts
    server.pem / server.key      signed by ca, SAN IP:127.0.0.1, for servers (tracker, agents)
    client.pem / client.key      signed by ca, for clients (mutual TLS)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)


def _signed_pair(directory: Path, name: str, extensions: str) -> None:
    _openssl(directory, "req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN=kiln-test-{name}")  # fmt: skip
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext")  # fmt: skip


def make_certs(directory: Path) -> Path:
    """Write the files above into `directory`; returns it."""
    for ca in ("ca", "other_ca"):
        _openssl(directory, "req", "-x509", *_EC, "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "2", "-subj", f"/CN=kiln-test-{ca}")  # fmt: skip
    _signed_pair(directory, "server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _signed_pair(directory, "client", "extendedKeyUsage=clientAuth\n")
    return directory

"""A real secured `kiln-agent` process through every fault of the issue, in sequence.

Segfault, abort, divide by zero, an infinite loop with a short timeout, a 100 GB allocation, a
truncated upload, an upload whose bytes do not match its hash, a measure of an unknown hash, an
expired and a forged lease token; after all of them the same process still measures a correct
kernel OK, with a correct result.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from device_agent import serde
from device_agent.arrays import make_args
from device_agent.testing import build_kernels, kernel_entry, upload_chunks, wait_for_ready_file
from protos import agent_pb2, agent_pb2_grpc, common_pb2
from protos.auth import Role, call_metadata, write_secrets
from protos.fencing import LeaseClaims, sign

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

RPC_S = 30.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_the_agent_survives_every_fault(tmp_path: Path) -> None:
    secrets = write_secrets(tmp_path / "pool.secrets")
    key = secrets.require_lease_key()
    client = call_metadata(secrets.token(Role.CLIENT))
    data, meta = build_kernels(str(tmp_path))
    ready = tmp_path / "ready"
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "device_agent",
                "--key",
                "faults",
                "--token-file",
                str(tmp_path / "pool.secrets"),
                "--listen",
                "127.0.0.1:0",
                "--cache-dir",
                str(tmp_path / "cache"),
                "--ready-file",
                str(ready),
                "--executor-address-space-bytes",
                str(4 << 30),
                "--agent-id",
                "faulty",
            ],
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        address = wait_for_ready_file(proc, str(ready))
        device = "faulty/0"
        with grpc.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S, metadata=client)
            fence = [0]

            def token(lease: str, ttl_s: float = 60.0) -> str:
                fence[0] += 1
                expires_ms = int((time.time() + ttl_s) * 1000)
                return sign(key, LeaseClaims(lease, device, fence[0], expires_ms))

            def measure(
                symbol: str,
                sha: str = meta.sha256,
                lease_token: str | None = None,
                check: str = "",
                **config: Any,
            ) -> common_pb2.MeasureResult:
                request = agent_pb2.MeasureRequest(
                    device_id=device,
                    lease_id="lease",
                    lease_token=token("lease") if lease_token is None else lease_token,
                    artifact_sha256=sha,
                    symbol=symbol,
                    seed=9,
                    config=common_pb2.EvaluatorConfig(**{"repeat": 3, "timeout_s": 20.0, **config}),
                )
                if check:
                    request.check.CopyFrom(
                        common_pb2.CheckSpec(
                            reference_sha256=meta.sha256, reference_symbol=check, atol=1e-6
                        )
                    )
                return stub.Measure(request, timeout=RPC_S, metadata=client)

            def run(symbol: str) -> agent_pb2.RunResponse:
                request = agent_pb2.RunRequest(
                    device_id=device,
                    lease_id="lease",
                    lease_token=token("lease"),
                    artifact_sha256=meta.sha256,
                    symbol=symbol,
                    seed=9,
                )
                return stub.Run(request, timeout=RPC_S, metadata=client)

            segv = measure("crash")
            assert (segv.status, segv.signal) == (common_pb2.CRASH, signal.SIGSEGV), segv.error
            abrt = measure("aborts")
            assert (abrt.status, abrt.signal) == (common_pb2.CRASH, signal.SIGABRT), abrt.error
            fpe = measure("divzero")
            assert (fpe.status, fpe.signal) == (common_pb2.CRASH, signal.SIGFPE), fpe.error
            loop = measure("hang", timeout_s=1.0)
            assert loop.status == common_pb2.TIMEOUT and "ran past 1 s" in loop.error
            huge = measure("alloc_huge")  # malloc fails under RLIMIT_AS; the timing loop says 1
            assert huge.status == common_pb2.RUNTIME_ERROR and "returned" in huge.error
            huge_run = run("alloc_huge")
            assert huge_run.status == common_pb2.RUNTIME_ERROR and "returned 3" in huge_run.error

            junk = os.urandom(20_000)
            truncated = serde.meta_to_pb(meta)
            truncated.sha256, truncated.size_bytes = hashlib.sha256(junk).hexdigest(), len(junk)
            with pytest.raises(grpc.RpcError) as err:
                stub.Upload(upload_chunks(junk[:12_000], truncated), timeout=RPC_S, metadata=client)
            assert err.value.code() == grpc.StatusCode.DATA_LOSS
            assert "ended after 12000 of 20000 bytes" in err.value.details()
            mismatch = serde.meta_to_pb(meta)
            mismatch.sha256 = hashlib.sha256(b"something else").hexdigest()
            with pytest.raises(grpc.RpcError) as err:
                stub.Upload(upload_chunks(data, mismatch), timeout=RPC_S, metadata=client)
            assert err.value.code() == grpc.StatusCode.DATA_LOSS
            for sha in (truncated.sha256, mismatch.sha256):
                has = stub.Has(agent_pb2.HasRequest(sha256=sha), timeout=RPC_S, metadata=client)
                assert not has.present

            unknown = measure("add_one", sha="0f" * 32)
            assert unknown.status == common_pb2.LOAD_ERROR and "not in cache" in unknown.error
            expired = measure("add_one", lease_token=token("lease", ttl_s=-10.0))
            assert expired.status == common_pb2.UNAUTHORIZED and "expired" in expired.error
            forged_token = sign(b"not-the-pool-key!", LeaseClaims("lease", device, 10**9, 2**40))
            forged = measure("add_one", lease_token=forged_token)
            assert forged.status == common_pb2.UNAUTHORIZED
            assert "signature does not match" in forged.error

            good = measure("add_one", check="add_one")
            assert good.status == common_pb2.OK, good.error
            assert len(good.samples_s) == 3 and all(s > 0 for s in good.samples_s)
            ran = run("add_one")
            assert ran.status == common_pb2.OK, ran.error
            x = make_args(kernel_entry("add_one").args, seed=9)[0]
            np.testing.assert_array_equal(serde.ndarray_from_pb(ran.outputs[0]), x + 1)
        assert proc.poll() is None, "the agent died"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=RPC_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=RPC_S)
    text = log.read_text(errors="replace")
    assert secrets.token(Role.CLIENT) not in text and "stopped" in text

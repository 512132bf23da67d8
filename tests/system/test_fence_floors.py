"""Leases the tracker ends reach the agents: a restarted tracker's fence floors stop old leases.

A tracker with the memory store forgets every lease when it restarts. Its agents register again
(their heartbeat is answered `known=false`), and the registration's answer carries each device's
fence floor: from then on the agent refuses the old leases' tokens, though they have not expired,
and kills a job still running under one. Real in-process tracker and agent on 127.0.0.1, a real
executor child; every wait bounded.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import grpc
import pytest

from device_agent import serde
from device_agent.config import AgentConfig
from device_agent.server import create_server as create_agent
from device_agent.testing import build_kernels, upload_chunks
from protos import agent_pb2, agent_pb2_grpc, common_pb2, tracker_pb2, tracker_pb2_grpc
from protos.auth import PoolSecrets, Role, call_metadata, write_secrets
from tracker.config import TrackerConfig
from tracker.server import ServingTracker
from tracker.server import create_server as create_tracker
from tracker.testing import free_port

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

RPC_S = 10.0
CONFIG = TrackerConfig(heartbeat_interval_s=0.2, startup_grace_s=0.0)


def measure(
    device: str, sha: str, symbol: str, lease: tracker_pb2.Lease
) -> agent_pb2.MeasureRequest:
    return agent_pb2.MeasureRequest(
        device_id=device,
        artifact_sha256=sha,
        symbol=symbol,
        config=common_pb2.EvaluatorConfig(repeat=2, timeout_s=60.0),
        lease_id=lease.lease_id,
        lease_token=lease.token,
    )


def acquire(address: str, secrets: PoolSecrets) -> tracker_pb2.Lease:
    """A 60 s lease on the pool's one device, waiting up to 10 s for the agent to register."""
    with grpc.insecure_channel(address) as channel:
        reply = tracker_pb2_grpc.TrackerStub(channel).Acquire(
            tracker_pb2.AcquireRequest(key="floors", timeout_s=RPC_S, lease_ttl_s=60.0),
            timeout=RPC_S + 1,
            metadata=call_metadata(secrets.token(Role.CLIENT)),
        )
    assert reply.status == common_pb2.OK, reply.reason
    return reply.lease


def start_tracker(address: str, secrets: PoolSecrets) -> ServingTracker:
    return create_tracker(address, CONFIG, secrets=secrets)


def test_a_restarted_tracker_ends_the_old_leases_on_the_agent(tmp_path: Path) -> None:
    data, meta = build_kernels(str(tmp_path))
    secrets = write_secrets(tmp_path / "pool.secrets")
    client = call_metadata(secrets.token(Role.CLIENT))
    address = f"127.0.0.1:{free_port()}"
    tracker = start_tracker(address, secrets)
    config = AgentConfig(
        key="floors",
        cache_dir=str(tmp_path / "cache"),
        secrets=secrets,
        tracker_address=address,
        reregister_backoff_initial_s=0.05,
        reregister_backoff_cap_s=0.2,
    )
    server, port, agent = create_agent("127.0.0.1:0", config)
    try:
        device = agent.devices[0].device_id
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            stub.Upload(upload_chunks(data, serde.meta_to_pb(meta)), timeout=RPC_S, metadata=client)
            old = acquire(address, secrets)
            ok = stub.Measure(
                measure(device, meta.sha256, "add_one", old), timeout=RPC_S, metadata=client
            )
            assert ok.status == common_pb2.OK, ok.error
            hung = stub.Measure.future(
                measure(device, meta.sha256, "hang", old), timeout=3 * RPC_S, metadata=client
            )
            time.sleep(0.3)
            tracker.stop(grace_s=0.1)
            tracker = start_tracker(address, secrets)
            # The agent registers again within a few heartbeats and gets its floors: the hang
            # under the forgotten lease is stopped long before the lease's 60 s are up.
            stopped = hung.result(timeout=RPC_S)
            assert stopped.status == common_pb2.UNAUTHORIZED, stopped.error
            assert "ended by the tracker" in stopped.error
            refused = stub.Measure(
                measure(device, meta.sha256, "add_one", old), timeout=RPC_S, metadata=client
            )
            assert refused.status == common_pb2.UNAUTHORIZED
            assert "superseded" in refused.error, refused.error
            new = acquire(address, secrets)
            assert new.fence > old.fence
            served = stub.Measure(
                measure(device, meta.sha256, "add_one", new), timeout=RPC_S, metadata=client
            )
            assert served.status == common_pb2.OK, served.error
    finally:
        server.stop(0.5)
        tracker.stop(grace_s=0.1)

"""Measure candidates on devices leased from a tracker, through the agents' gRPC services.

Per batch: acquire a lease for a device matching the key and tags, then for each artifact upload it
unless the agent already has its hash, measure, and renew the lease as it runs low. A device that
goes away mid-batch costs the candidate in flight a DEVICE_LOST result; the next candidate acquires
a fresh lease. Every call has a deadline, so a dead pool yields results, never a hang.
"""

from __future__ import annotations

import getpass
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from compiler.artifact import Artifact
from protos import agent_pb2, agent_pb2_grpc, common_pb2, tracker_pb2, tracker_pb2_grpc
from tuner import serde
from tuner.measure import EvaluatorConfig, MeasureResult, Status

_LOG = logging.getLogger(__name__)

# gRPC's default message limit is 4 MiB; 1 MiB chunks stay far below it with room for the meta.
UPLOAD_CHUNK_BYTES = 1 << 20
# Deadline for control calls (acquire excluded): a healthy tracker or agent answers in milliseconds.
CONTROL_RPC_TIMEOUT_S = 10.0
# Slack added to a measurement's own timeout for the agent to kill, report and respawn.
MEASURE_RPC_SLACK_S = 10.0


@dataclass(frozen=True)
class PoolConfig:
    """Where and how to lease devices."""

    tracker: str
    key: str
    tags: dict[str, str] = field(default_factory=dict)
    user: str = field(default_factory=getpass.getuser)
    priority: int = 0
    acquire_timeout_s: float = 60.0
    lease_ttl_s: float = 60.0


class _NoDevice(Exception):
    pass


class PoolRunner:
    """A Runner over a real pool: one tracker, any number of agents."""

    def __init__(self, pool: PoolConfig, evaluator: EvaluatorConfig | None = None) -> None:
        self.pool = pool
        self.evaluator = evaluator or EvaluatorConfig()
        self._tracker_channel = grpc.insecure_channel(pool.tracker)
        self._tracker = tracker_pb2_grpc.TrackerStub(self._tracker_channel)
        self._agents: dict[str, tuple[grpc.Channel, agent_pb2_grpc.AgentStub]] = {}
        self._lease: tracker_pb2.Lease | None = None

    def run(self, artifacts: Sequence[Artifact]) -> list[MeasureResult]:
        results = []
        for art in artifacts:
            try:
                lease = self._current_lease()
            except _NoDevice as exc:
                results.append(MeasureResult.failed(Status.NO_DEVICE, str(exc)))
                continue
            result = self._measure_one(lease, art)
            if result.status is Status.DEVICE_LOST:
                self._drop_lease()
            results.append(result)
        return results

    def close(self) -> None:
        self._drop_lease()
        for channel, _ in self._agents.values():
            channel.close()
        self._agents.clear()
        self._tracker_channel.close()

    # -- leases ---------------------------------------------------------------------------------

    def _current_lease(self) -> tracker_pb2.Lease:
        lease = self._lease
        if lease is not None and lease.expires_at_unix - time.time() < self.pool.lease_ttl_s / 2:
            lease = self._renew(lease)
        if lease is None:
            lease = self._acquire()
        self._lease = lease
        return lease

    def _renew(self, lease: tracker_pb2.Lease) -> tracker_pb2.Lease | None:
        """The renewed lease, or None when the tracker says it is gone or cannot be reached."""
        req = tracker_pb2.RenewRequest(lease_id=lease.lease_id, lease_ttl_s=self.pool.lease_ttl_s)
        try:
            resp = self._tracker.Renew(req, timeout=CONTROL_RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            _LOG.warning("renewing lease %s failed: %s", lease.lease_id, _describe(exc))
            return None
        if resp.status != common_pb2.OK:
            _LOG.warning("lease %s lost: %s", lease.lease_id, resp.reason)
            return None
        renewed: tracker_pb2.Lease = resp.lease
        return renewed

    def _acquire(self) -> tracker_pb2.Lease:
        p = self.pool
        req = tracker_pb2.AcquireRequest(
            key=p.key,
            tag_selector=p.tags,
            priority=p.priority,
            user=p.user,
            timeout_s=p.acquire_timeout_s,
            lease_ttl_s=p.lease_ttl_s,
        )
        try:
            resp = self._tracker.Acquire(req, timeout=p.acquire_timeout_s + CONTROL_RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise _NoDevice(f"tracker {p.tracker}: {_describe(exc)}") from exc
        if resp.status != common_pb2.OK:
            raise _NoDevice(f"tracker {p.tracker} has no device for key={p.key!r}: {resp.reason}")
        _LOG.info(
            "leased %s (%s) as %s",
            resp.lease.device.device_id,
            resp.lease.device.agent_address,
            resp.lease.lease_id,
        )
        return resp.lease

    def _drop_lease(self) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        try:
            self._tracker.Release(
                tracker_pb2.ReleaseRequest(lease_id=lease.lease_id), timeout=CONTROL_RPC_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            # The tracker expires the lease by itself; nothing is lost by failing to release it.
            _LOG.warning("releasing lease %s failed: %s", lease.lease_id, _describe(exc))

    # -- one candidate --------------------------------------------------------------------------

    def _agent(self, address: str) -> agent_pb2_grpc.AgentStub:
        if address not in self._agents:
            channel = grpc.insecure_channel(address)
            self._agents[address] = (channel, agent_pb2_grpc.AgentStub(channel))
        return self._agents[address][1]

    def _measure_one(self, lease: tracker_pb2.Lease, art: Artifact) -> MeasureResult:
        device = lease.device
        agent = self._agent(device.agent_address)
        try:
            has = agent.Has(agent_pb2.HasRequest(sha256=art.sha256), timeout=CONTROL_RPC_TIMEOUT_S)
            if not has.present:
                agent.Upload(_chunks(art), timeout=CONTROL_RPC_TIMEOUT_S + len(art.data) / 1e6)
        except grpc.RpcError as exc:
            status = Status.DEVICE_LOST if _is_gone(exc) else Status.UPLOAD_ERROR
            return MeasureResult.failed(
                status, f"upload to {device.agent_address}: {_describe(exc)}", device.device_id
            )
        req = agent_pb2.MeasureRequest(
            device_id=device.device_id,
            lease_id=lease.lease_id,
            lease_token=lease.token,
            artifact_sha256=art.sha256,
            symbol=art.entries[0].symbol,
            seed=0,
            config=serde.evaluator_config(self.evaluator),
        )
        try:
            msg = agent.Measure(req, timeout=self.evaluator.timeout_s + MEASURE_RPC_SLACK_S)
        except grpc.RpcError as exc:
            status = Status.DEVICE_LOST if _is_gone(exc) else Status.RUNTIME_ERROR
            return MeasureResult.failed(
                status, f"measure on {device.agent_address}: {_describe(exc)}", device.device_id
            )
        return serde.measure_result(msg)


def _chunks(art: Artifact) -> Iterator[agent_pb2.UploadChunk]:
    meta = serde.artifact_meta(art)
    data = art.data
    yield agent_pb2.UploadChunk(meta=meta, data=data[:UPLOAD_CHUNK_BYTES])
    for start in range(UPLOAD_CHUNK_BYTES, len(data), UPLOAD_CHUNK_BYTES):
        yield agent_pb2.UploadChunk(data=data[start : start + UPLOAD_CHUNK_BYTES])


def _is_gone(exc: grpc.RpcError) -> bool:
    return exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    )


def _describe(exc: grpc.RpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"

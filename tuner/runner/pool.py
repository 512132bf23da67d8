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
from protos import agent_pb2, agent_pb2_grpc, common_pb2, tracker_pb2
from protos.auth import TlsFiles, call_metadata, open_channel
from tuner import serde
from tuner.measure import EvaluatorConfig, MeasureResult, Status
from tuner.tracker_client import CONTROL_RPC_TIMEOUT_S, TrackerClient

_LOG = logging.getLogger(__name__)

# gRPC's default message limit is 4 MiB; 1 MiB chunks stay far below it with room for the meta.
UPLOAD_CHUNK_BYTES = 1 << 20
# Slack added to a measurement's own timeout for the agent to kill, report and respawn.
MEASURE_RPC_SLACK_S = 10.0
# A lease whose renewal failed (tracker unreachable) is still used while this much of it is left.
RENEW_FAILURE_KEEP_S = 2.0


@dataclass(frozen=True)
class PoolConfig:
    """Where and how to lease devices, and the credentials for the tracker and its agents.

    `token` (the pool's client token) goes as bearer metadata on every call to the tracker and to
    agents; `tls` (the CA of the pool's certificates, and a client certificate for mutual TLS)
    secures both channels.
    """

    tracker: str
    key: str
    tags: dict[str, str] = field(default_factory=dict)
    user: str = field(default_factory=getpass.getuser)
    priority: int = 0
    acquire_timeout_s: float = 60.0
    lease_ttl_s: float = 60.0
    token: str | None = field(default=None, repr=False)
    tls: TlsFiles | None = None


class _NoDevice(Exception):
    pass


class PoolRunner:
    """A Runner over a real pool: one tracker, any number of agents."""

    def __init__(self, pool: PoolConfig, evaluator: EvaluatorConfig | None = None) -> None:
        self.pool = pool
        self.evaluator = evaluator or EvaluatorConfig()
        self._tracker = TrackerClient(pool.tracker, pool.token, pool.tls)
        self._metadata = call_metadata(pool.token)
        self._agents: dict[str, tuple[grpc.Channel, agent_pb2_grpc.AgentStub]] = {}
        self._held: set[tuple[str, str]] = set()  # (agent address, sha256) the agent holds
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
        self._tracker.close()

    # -- leases ---------------------------------------------------------------------------------

    def _current_lease(self) -> tracker_pb2.Lease:
        lease = self._lease
        if lease is not None and lease.expires_at_unix - time.time() < self.pool.lease_ttl_s / 2:
            lease = self._renew(lease)
        if lease is None:
            self._drop_lease()
            lease = self._acquire()
        self._lease = lease
        return lease

    def _renew(self, lease: tracker_pb2.Lease) -> tracker_pb2.Lease | None:
        """The renewed lease (with its fresh token), the same lease while a tracker outage leaves
        it time, or None when it is gone."""
        try:
            resp = self._tracker.renew(lease.lease_id, self.pool.lease_ttl_s)
        except grpc.RpcError as exc:
            _LOG.warning("renewing lease %s failed: %s", lease.lease_id, _describe(exc))
            if lease.expires_at_unix - time.time() > RENEW_FAILURE_KEEP_S:
                return lease  # a restarting tracker keeps the lease; try again next candidate
            return None
        if resp.status != common_pb2.OK:
            _LOG.warning("lease %s lost: %s", lease.lease_id, resp.reason)
            self._lease = None  # nothing left to release
            return None
        renewed: tracker_pb2.Lease = resp.lease
        return renewed

    def _acquire(self) -> tracker_pb2.Lease:
        p = self.pool
        try:
            resp = self._tracker.acquire(
                p.key, p.tags, p.user, p.priority, p.acquire_timeout_s, p.lease_ttl_s
            )
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
            self._tracker.release(lease.lease_id)
        except grpc.RpcError as exc:
            # The tracker expires the lease by itself; nothing is lost by failing to release it.
            _LOG.warning("releasing lease %s failed: %s", lease.lease_id, _describe(exc))

    # -- one candidate --------------------------------------------------------------------------

    def _agent(self, address: str) -> agent_pb2_grpc.AgentStub:
        if address not in self._agents:
            channel = open_channel(address, self.pool.tls)
            self._agents[address] = (channel, agent_pb2_grpc.AgentStub(channel))
        return self._agents[address][1]

    def _measure_one(self, lease: tracker_pb2.Lease, art: Artifact) -> MeasureResult:
        """Upload unless the agent holds `art`, then measure it under `lease`.

        Has is asked only the first time an (agent, artifact) pair is seen; later the Measure goes
        straight out, and if the agent answers that it no longer holds the artifact (evicted, or
        the agent restarted) it is uploaded and measured once more.
        """
        device = lease.device
        held = (device.agent_address, art.sha256)
        if held not in self._held:
            failed = self._upload(lease, art, ask_first=True)
            if failed is not None:
                return failed
        msg, failed = self._measure_rpc(lease, art)
        if msg is not None and art.sha256 in msg.missing_sha256:
            self._held.discard(held)
            failed = self._upload(lease, art, ask_first=False)
            if failed is not None:
                return failed
            msg, failed = self._measure_rpc(lease, art)
        if msg is None:
            assert failed is not None
            return failed
        return serde.measure_result(msg)

    def _upload(
        self, lease: tracker_pb2.Lease, art: Artifact, ask_first: bool
    ) -> MeasureResult | None:
        """Make the lease's agent hold `art` (asking Has first if `ask_first`); None when it does."""
        device = lease.device
        agent = self._agent(device.agent_address)
        try:
            present = ask_first and (
                agent.Has(
                    agent_pb2.HasRequest(sha256=art.sha256),
                    timeout=CONTROL_RPC_TIMEOUT_S,
                    metadata=self._metadata,
                ).present
            )
            if not present:
                agent.Upload(
                    _chunks(art),
                    timeout=CONTROL_RPC_TIMEOUT_S + len(art.data) / 1e6,
                    metadata=self._metadata,
                )
        except grpc.RpcError as exc:
            status = Status.DEVICE_LOST if _is_gone(exc) else Status.UPLOAD_ERROR
            return MeasureResult.failed(
                status, f"upload to {device.agent_address}: {_describe(exc)}", device.device_id
            )
        self._held.add((device.agent_address, art.sha256))
        return None

    def _measure_rpc(
        self, lease: tracker_pb2.Lease, art: Artifact
    ) -> tuple[common_pb2.MeasureResult | None, MeasureResult | None]:
        """(the agent's answer, None) or (None, the failure when the call itself failed)."""
        device = lease.device
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
            msg = self._agent(device.agent_address).Measure(
                req,
                timeout=self.evaluator.timeout_s + MEASURE_RPC_SLACK_S,
                metadata=self._metadata,
            )
        except grpc.RpcError as exc:
            status = Status.DEVICE_LOST if _is_gone(exc) else Status.RUNTIME_ERROR
            return None, MeasureResult.failed(
                status, f"measure on {device.agent_address}: {_describe(exc)}", device.device_id
            )
        return msg, None


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

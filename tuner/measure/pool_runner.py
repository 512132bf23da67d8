"""Measure candidates on devices leased from a tracker, through the agents' gRPC services.

`PoolRunner(pool, evaluator, devices=N)` holds up to N leases (kept between batches). A batch:
make sure one lease is held (acquiring with the pool's normal timeout), then try for the missing
ones with `extra_acquire_timeout_s` (0: only devices free right now, so a smaller pool costs one
quick call per missing device); then one worker thread per lease pulls candidates from a shared
queue, so every device stays busy until the batch is done, and results come back in input order.

Per candidate: upload unless the agent already holds its hash (Has asked once per agent and
artifact; a Measure answered with the hash in missing_sha256 re-uploads), measure its first entry,
and renew the lease as it runs low. A result whose samples spread past `max_spread` (noise, such
as a neighbour's burst) is measured again, up to `remeasure` times, the samples pooled; one that
still spreads is flagged `noisy`, for the tuner and the reader to see. A device that goes away
mid-batch (DEVICE_LOST) does not cost its candidate: the candidate goes back in the queue once
(`retry_lost`) to be measured on another device, and that lease is dropped without a Release so
the tracker cannot grant the dead device again before it notices (the lease ends by itself at
its TTL); the device is acquired again by a later batch if it comes back. When every lease of a
batch is gone, a new one is acquired with the normal timeout; only if none can be had by then do
the remaining candidates end NO_DEVICE (or DEVICE_LOST, for one whose retry found no device).
Every call has a deadline: no hangs.

`run_entry` and `measure_entry` serve `kiln run`: one entry of one artifact, on the first held
lease, with the inputs sent (Run) or made on the device (Measure).

Threads: stubs and channels are shared (one channel per agent); each lease is used by one worker
at a time; the batch's queue and results sit behind one lock.
"""

from __future__ import annotations

import dataclasses
import getpass
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from compiler.artifact import Artifact
from protos import agent_pb2, agent_pb2_grpc, common_pb2, tracker_pb2
from protos.auth import TlsFiles, call_metadata, open_channel
from tuner.measure import serde
from tuner.measure.result import NOISY_SPREAD, EvaluatorConfig, MeasureResult, Status, spread
from tuner.measure.runner import Reference
from tuner.measure.tracker_client import CONTROL_RPC_TIMEOUT_S, TrackerClient

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


class NoDeviceError(Exception):
    """No lease could be had for the pool's key: the message says why."""


_NoDevice = NoDeviceError


@dataclass(frozen=True)
class RunOutput:
    """One Run of an entry: its status, the OUTPUT arrays in arg order, the error, the device."""

    status: Status
    outputs: tuple[np.ndarray, ...]
    error: str
    device_id: str


class _Batch:
    """One run's shared state: the queue of candidate positions and the results, under a lock."""

    def __init__(self, n: int) -> None:
        self.cond = threading.Condition()
        self.pending: deque[int] = deque(range(n))
        self.results: list[MeasureResult | None] = [None] * n
        self.lost: dict[int, MeasureResult] = {}  # position -> its DEVICE_LOST, retried once
        self.active = 0  # workers running

    def take(self) -> int | None:
        with self.cond:
            return self.pending.popleft() if self.pending else None

    def finish(self, pos: int, result: MeasureResult) -> None:
        with self.cond:
            self.results[pos] = result

    def retry(self, pos: int, lost: MeasureResult) -> None:
        with self.cond:
            self.lost[pos] = lost
            self.pending.appendleft(pos)

    def worker_done(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify_all()


class PoolRunner:
    """A Runner over a real pool: one tracker, any number of agents, up to `devices` leases.

    Args:
        pool: the tracker, key, tags and credentials.
        evaluator: how each candidate is timed.
        devices: the most leases held at once (each measures one candidate at a time).
        extra_acquire_timeout_s: how long to wait for each lease beyond the first.
        retry_lost: measure a candidate whose device was lost once more on another device.
        max_spread: a result whose samples spread more than this (interquartile range over
            median) is measured again, up to `remeasure` times, and the samples pooled; still
            past it, the result is flagged `noisy`.
        remeasure: the most extra measurements of one noisy candidate (0: flag only).
    """

    def __init__(
        self,
        pool: PoolConfig,
        evaluator: EvaluatorConfig | None = None,
        devices: int = 1,
        extra_acquire_timeout_s: float = 0.0,
        retry_lost: bool = True,
        max_spread: float = NOISY_SPREAD,
        remeasure: int = 1,
    ) -> None:
        if devices < 1:
            raise ValueError(f"devices must be at least 1, got {devices}")
        if extra_acquire_timeout_s < 0:
            raise ValueError(f"extra_acquire_timeout_s must be >= 0, got {extra_acquire_timeout_s}")
        self.pool = pool
        self.evaluator = evaluator or EvaluatorConfig()
        self.devices = devices
        self.extra_acquire_timeout_s = extra_acquire_timeout_s
        self.retry_lost = retry_lost
        if max_spread <= 0 or remeasure < 0:
            raise ValueError(
                f"max_spread must be > 0 and remeasure >= 0, got {max_spread}, {remeasure}"
            )
        self.max_spread = max_spread
        self.remeasure = remeasure
        self.remeasured = 0  # extra measurements of noisy candidates (under _count_lock)
        self._count_lock = threading.Lock()
        self._tracker = TrackerClient(pool.tracker, pool.token, pool.tls)
        self._metadata = call_metadata(pool.token)
        self._agents: dict[str, tuple[grpc.Channel, agent_pb2_grpc.AgentStub]] = {}
        self._agents_lock = threading.Lock()
        self._held: set[tuple[str, str]] = set()  # (agent address, sha256) the agent holds
        self._leases: list[tracker_pb2.Lease] = []  # touched only by run()'s own thread
        self.lost_devices: list[str] = []  # every device lost mid-batch, in order
        self.retried = 0  # candidates measured again after their device was lost

    @property
    def leased_devices(self) -> list[str]:
        """The device ids of the leases held now (between batches)."""
        return [lease.device.device_id for lease in self._leases]

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        """One result per artifact, in order; measures each artifact's first entry, checked on
        the device against its reference when `references` (one per artifact) gives one."""
        if not artifacts:
            return []
        if references and len(references) != len(artifacts):
            raise ValueError(f"{len(references)} references for {len(artifacts)} artifacts")
        refs: Sequence[Reference | None] = references or [None] * len(artifacts)
        batch = _Batch(len(artifacts))
        error = self._fill_leases(first_timeout_s=self.pool.acquire_timeout_s)
        threads: list[threading.Thread] = []
        # Each round starts a worker per held lease; a new round comes only when every worker
        # of the last one ended with candidates left (their devices were lost). Each round
        # either ends a candidate for good or uses a retry, so rounds are bounded.
        for _ in range(2 * len(artifacts) + 2):
            with batch.cond:
                if not batch.pending:
                    break
            if not self._leases:
                break
            leases, self._leases = self._leases, []
            kept: list[tracker_pb2.Lease] = []
            with batch.cond:
                batch.active = len(leases)
            for lease in leases:
                t = threading.Thread(
                    target=self._work, args=(batch, artifacts, refs, lease, kept), daemon=True
                )
                t.start()
                threads.append(t)
            with batch.cond:
                while batch.active > 0:
                    batch.cond.wait()
            self._leases = kept
            with batch.cond:
                left = bool(batch.pending)
            if left:
                error = self._fill_leases(first_timeout_s=self.pool.acquire_timeout_s)
        for t in threads:
            t.join()
        with batch.cond:
            for pos in batch.pending:
                batch.results[pos] = batch.lost.get(pos) or MeasureResult.failed(
                    Status.NO_DEVICE, error or f"no device for key={self.pool.key!r}"
                )
            batch.pending.clear()
        out = [r for r in batch.results if r is not None]
        assert len(out) == len(artifacts)
        return out

    def device_tags(self) -> tuple[str, dict[str, str]]:
        """The id and tags of the device `run_entry` and `measure_entry` use (leased if needed).

        Raises:
            NoDeviceError: no device could be leased.
        """
        lease = self._one_lease()
        return lease.device.device_id, dict(lease.device.tags)

    def run_entry(
        self, art: Artifact, symbol: str, inputs: Sequence[np.ndarray], timeout_s: float = 60.0
    ) -> RunOutput:
        """Run `symbol` of `art` once on the leased device with `inputs` (in INPUT arg order).

        Raises:
            NoDeviceError: no device could be leased.
        """
        lease = self._one_lease()
        device = lease.device
        failed = self._ensure_uploaded(lease, art)
        if failed is not None:
            return RunOutput(failed.status, (), failed.error, device.device_id)
        req = agent_pb2.RunRequest(
            device_id=device.device_id,
            lease_id=lease.lease_id,
            lease_token=lease.token,
            artifact_sha256=art.sha256,
            symbol=symbol,
            inputs=[_ndarray_pb(a) for a in inputs],
            timeout_s=timeout_s,
        )
        try:
            msg = self._agent(device.agent_address).Run(
                req, timeout=timeout_s + MEASURE_RPC_SLACK_S, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            status = Status.DEVICE_LOST if _is_gone(exc) else Status.RUNTIME_ERROR
            error = f"run on {device.agent_address}: {_describe(exc)}"
            return RunOutput(status, (), error, device.device_id)
        name = (
            common_pb2.Status.Name(msg.status) if msg.status in common_pb2.Status.values() else ""
        )
        try:
            status = Status(name)
        except ValueError:
            return RunOutput(Status.RUNTIME_ERROR, (), f"agent sent status {msg.status}", "")
        outputs = tuple(_ndarray(o) for o in msg.outputs)
        return RunOutput(status, outputs, msg.error, device.device_id)

    def measure_entry(
        self, art: Artifact, symbol: str, evaluator: EvaluatorConfig | None = None
    ) -> MeasureResult:
        """Time `symbol` of `art` on the leased device (inputs made there) with `evaluator`
        (default: this runner's).

        Raises:
            NoDeviceError: no device could be leased.
        """
        lease = self._one_lease()
        failed = self._ensure_uploaded(lease, art)
        if failed is not None:
            return failed
        msg, failed = self._measure_rpc(lease, art, symbol, evaluator=evaluator)
        if msg is None:
            assert failed is not None
            return failed
        return self._mode(serde.measure_result(msg), evaluator)

    def _mode(
        self, result: MeasureResult, evaluator: EvaluatorConfig | None = None
    ) -> MeasureResult:
        """`result`, marked `cold` when the evaluator it was timed with sweeps the caches."""
        if (evaluator or self.evaluator).flush_cache_bytes > 0:
            return dataclasses.replace(result, cold=True)
        return result

    def _one_lease(self) -> tracker_pb2.Lease:
        """A live lease: a kept one renewed, or a new one. A lease kept from an earlier batch
        may have lapsed while the caller did other work (building a model takes longer than a
        TTL); nothing was running on it, so another lease serves as well."""
        while self._leases:
            lease = self._fresh(self._leases[0], idle=True)
            if lease is not None:
                self._leases[0] = lease
                return lease
            _LOG.info("kept lease %s ended; acquiring another", self._leases[0].lease_id)
            self._leases.pop(0)
        lease = self._acquire(self.pool.acquire_timeout_s)
        self._leases.append(lease)
        return lease

    def _ensure_uploaded(self, lease: tracker_pb2.Lease, art: Artifact) -> MeasureResult | None:
        if (lease.device.agent_address, art.sha256) in self._held:
            return None
        return self._upload(lease, art, ask_first=True)

    def close(self) -> None:
        """Release every lease and close every channel."""
        leases, self._leases = self._leases, []
        for lease in leases:
            self._release(lease)
        with self._agents_lock:
            for channel, _ in self._agents.values():
                channel.close()
            self._agents.clear()
        self._tracker.close()

    # -- workers --------------------------------------------------------------------------------

    def _work(
        self,
        batch: _Batch,
        artifacts: Sequence[Artifact],
        references: Sequence[Reference | None],
        lease: tracker_pb2.Lease,
        kept: list[tracker_pb2.Lease],
    ) -> None:
        """Measure candidates from the queue on `lease` until it is empty or the device is lost;
        a lease still good at the end goes into `kept`."""
        current: tracker_pb2.Lease | None = lease
        idle = True  # kept from an earlier batch: it may have lapsed while the caller built
        try:
            while True:
                current = self._fresh(current, idle)
                idle = False
                if current is None:
                    return  # the lease ended; run() acquires another if work is left
                pos = batch.take()
                if pos is None:
                    return
                result = self._measure_one(current, artifacts[pos], references[pos])
                if result.status is Status.DEVICE_LOST:
                    _LOG.warning("device %s lost: %s", current.device.device_id, result.error)
                    # No Release: the tracker would hand the dead device out again at once.
                    with batch.cond:
                        self.lost_devices.append(current.device.device_id)
                        retry = self.retry_lost and pos not in batch.lost
                        if retry:
                            self.retried += 1
                    current = None
                    if retry:
                        batch.retry(pos, result)
                    else:
                        batch.finish(pos, result)
                    return
                batch.finish(pos, result)
        except Exception as exc:  # a bug must not leave run() waiting for this worker
            _LOG.exception("measurement worker failed")
            if current is not None:
                self._release(current)
                current = None
            with batch.cond:
                for p in batch.pending:
                    batch.results[p] = MeasureResult.failed(Status.RUNTIME_ERROR, repr(exc))
                batch.pending.clear()
        finally:
            if current is not None:
                with batch.cond:
                    kept.append(current)
            batch.worker_done()

    # -- leases ---------------------------------------------------------------------------------

    def _fill_leases(self, first_timeout_s: float) -> str:
        """Hold up to `devices` leases: wait `first_timeout_s` for the first when none is held,
        then `extra_acquire_timeout_s` for each further one. Returns why the last acquire
        failed ("" when none did)."""
        error = ""
        while len(self._leases) < self.devices:
            timeout = first_timeout_s if not self._leases else self.extra_acquire_timeout_s
            try:
                self._leases.append(self._acquire(timeout))
            except _NoDevice as exc:
                error = str(exc)
                break
        return error

    def _fresh(
        self, lease: tracker_pb2.Lease | None, idle: bool = False
    ) -> tracker_pb2.Lease | None:
        """`lease`, renewed when less than half its TTL is left; None when it is gone. `idle`:
        the lease was kept between batches, where lapsing is expected (reported at info)."""
        if lease is None:
            return None
        if lease.expires_at_unix - time.time() >= self.pool.lease_ttl_s / 2:
            return lease
        return self._renew(lease, idle)

    def _renew(self, lease: tracker_pb2.Lease, idle: bool = False) -> tracker_pb2.Lease | None:
        """The renewed lease (with its fresh token), the same lease while a tracker outage leaves
        it time, or None when it is gone."""
        try:
            resp = self._tracker.renew(lease.lease_id, self.pool.lease_ttl_s)
        except grpc.RpcError as exc:
            _LOG.warning("renewing lease %s failed: %s", lease.lease_id, _describe(exc))
            if lease.expires_at_unix - time.time() > RENEW_FAILURE_KEEP_S:
                return lease  # a restarting tracker keeps the lease; try again next candidate
            self._release(lease)
            return None
        if resp.status != common_pb2.OK:
            # A kept lease that lapsed between batches (a model build outlasts a TTL) is no
            # loss: nothing ran on it. One that ends while measuring is.
            log = _LOG.info if idle else _LOG.warning
            log("lease %s lost: %s", lease.lease_id, resp.reason)
            return None  # nothing left to release
        renewed: tracker_pb2.Lease = resp.lease
        return renewed

    def _acquire(self, timeout_s: float) -> tracker_pb2.Lease:
        p = self.pool
        try:
            resp = self._tracker.acquire(
                p.key, p.tags, p.user, p.priority, timeout_s, p.lease_ttl_s
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
        lease: tracker_pb2.Lease = resp.lease
        return lease

    def _release(self, lease: tracker_pb2.Lease) -> None:
        try:
            self._tracker.release(lease.lease_id)
        except grpc.RpcError as exc:
            # The tracker expires the lease by itself; nothing is lost by failing to release it.
            _LOG.warning("releasing lease %s failed: %s", lease.lease_id, _describe(exc))

    # -- one candidate --------------------------------------------------------------------------

    def _agent(self, address: str) -> agent_pb2_grpc.AgentStub:
        with self._agents_lock:
            if address not in self._agents:
                channel = open_channel(address, self.pool.tls)
                self._agents[address] = (channel, agent_pb2_grpc.AgentStub(channel))
            return self._agents[address][1]

    def _measure_one(
        self, lease: tracker_pb2.Lease, art: Artifact, reference: Reference | None = None
    ) -> MeasureResult:
        """Upload unless the agent holds `art` (and its reference), then measure it under `lease`.

        Has is asked only the first time an (agent, artifact) pair is seen; later the Measure goes
        straight out, and if the agent answers that it no longer holds an artifact it names
        (evicted, or the agent restarted) that one is uploaded and the Measure sent once more.
        """
        device = lease.device
        needed = [art] if reference is None else [art, reference.artifact]
        for each in needed:
            if (device.agent_address, each.sha256) not in self._held:
                failed = self._upload(lease, each, ask_first=True)
                if failed is not None:
                    return failed
        msg, failed = self._measure_rpc(lease, art, reference=reference)
        missing = [a for a in needed if msg is not None and a.sha256 in msg.missing_sha256]
        if missing:
            for each in missing:
                self._held.discard((device.agent_address, each.sha256))
                failed = self._upload(lease, each, ask_first=False)
                if failed is not None:
                    return failed
            msg, failed = self._measure_rpc(lease, art, reference=reference)
        if msg is None:
            assert failed is not None
            return failed
        return self._mode(self._settle_noise(lease, art, serde.measure_result(msg)))

    def _settle_noise(
        self, lease: tracker_pb2.Lease, art: Artifact, result: MeasureResult
    ) -> MeasureResult:
        """`result`, or where its samples spread past `max_spread`, the samples of up to
        `remeasure` more measurements pooled with them (no second check: it passed), flagged
        `noisy` when the pool still spreads past it."""
        samples = list(result.samples_s)
        if not result.ok or spread(samples) <= self.max_spread:
            return result
        last = result
        for _ in range(self.remeasure):
            msg, _failed = self._measure_rpc(lease, art)
            again = serde.measure_result(msg) if msg is not None else None
            if again is None or not again.ok:
                break  # keep what was measured; a device lost now shows on the next candidate
            with self._count_lock:
                self.remeasured += 1
            samples += again.samples_s
            last = again
            if spread(samples) <= self.max_spread:
                break
        return dataclasses.replace(
            result,
            samples_s=tuple(samples),
            number_used=last.number_used,
            noisy=spread(samples) > self.max_spread,
        )

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
        self,
        lease: tracker_pb2.Lease,
        art: Artifact,
        symbol: str = "",
        reference: Reference | None = None,
        evaluator: EvaluatorConfig | None = None,
    ) -> tuple[common_pb2.MeasureResult | None, MeasureResult | None]:
        """(the agent's answer, None) or (None, the failure when the call itself failed)."""
        ev = evaluator or self.evaluator
        device = lease.device
        check = None
        if reference is not None:
            check = common_pb2.CheckSpec(
                reference_sha256=reference.artifact.sha256,
                reference_symbol=reference.symbol,
                rtol=reference.rtol,
                atol=reference.atol,
            )
        req = agent_pb2.MeasureRequest(
            device_id=device.device_id,
            lease_id=lease.lease_id,
            lease_token=lease.token,
            artifact_sha256=art.sha256,
            symbol=symbol or art.entries[0].symbol,
            seed=0,
            config=serde.evaluator_config(ev),
            check=check,
        )
        try:
            msg = self._agent(device.agent_address).Measure(
                req,
                timeout=ev.timeout_s + MEASURE_RPC_SLACK_S,
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


def _ndarray_pb(array: np.ndarray) -> common_pb2.NDArray:
    a = np.asarray(array, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
    data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return common_pb2.NDArray(shape=list(a.shape), dtype=a.dtype.name, data=data)


def _ndarray(msg: common_pb2.NDArray) -> np.ndarray:
    dtype = np.dtype(msg.dtype).newbyteorder("<")
    flat = np.frombuffer(msg.data, dtype=dtype)
    return flat.reshape(tuple(msg.shape)).astype(dtype.newbyteorder("="))


def _is_gone(exc: grpc.RpcError) -> bool:
    return exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    )


def _describe(exc: grpc.RpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"

"""The agent's core: devices, artifact cache and executors behind plain methods the servicer calls.

A Measure or Run comes in two steps: `admit_*` checks the request and its lease (quick, no I/O)
and returns an `Admission`; the caller then waits until it has the device to itself, for at most
`Admission.wait_s`, and calls `measure`/`run` with it (or with `Admission.stayed_busy()`).

A job never outlives its lease: it is killed at the earliest of its requested timeout (or
`default_timeout_s`), `max_job_s`, and its lease's end, with a TIMEOUT error naming which.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import importlib.metadata
import logging
import math
import os
import platform
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np

from device_agent import arrays
from device_agent.backends import get_backend
from device_agent.cache import ArtifactCache, PendingArtifact, validate_sha256
from device_agent.config import DEFAULT_CACHE_DIR, AgentConfig
from device_agent.domain import (
    AgentInfo,
    ArgRole,
    ArtifactMeta,
    DeviceSpec,
    EntryPoint,
    EvaluatorConfig,
    MeasureRequest,
    MeasureResult,
    RunRequest,
    RunResult,
    Status,
    Telemetry,
    TensorSpec,
)
from device_agent.errors import InvalidRequestError, UnknownDeviceError
from device_agent.executor import Executor, TimeLimit
from device_agent.jobs import MEASURE, RUN, Job, JobResult, ReferenceCheck, StopSignal
from device_agent.leases import AcceptAllLeases, FencingLeases, LeaseVerifier
from device_agent.quarantine import Quarantine
from device_agent.stats import AgentStats
from device_agent.telemetry import TelemetryReader
from protos.ids import ID_CHARS, MAX_ID_CHARS, identifier_problem
from protos.ratelimit import RateLimitedLog

_LOG = logging.getLogger(__name__)
# Refused requests cost a few log lines per device and window, however many arrive.
_REFUSED = RateLimitedLog(_LOG)
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
# What a default agent id may hold: an id's characters but "/", and room for "/<index>" after it.
_NOT_ID_CHARS = re.compile("[^" + re.escape("".join(sorted(ID_CHARS - {"/"}))) + "]+")
MAX_AGENT_ID_CHARS = MAX_ID_CHARS - 8
# A wait for the device that ends this close to the lease's end was cut short by the lease.
_TIMER_SLACK_S = 0.05


@dataclass(frozen=True)
class Admission:
    """A Measure or Run that passed its checks, waiting for its device.

    It may wait `wait_s` for the device: `device_wait_s`, cut to what is left of its lease.
    `lease_deadline` is the `time.monotonic()` at which its lease ends (None: never, dev mode).
    With `refused` set, the request is answered with that result and never runs.
    """

    device_id: str
    lease_id: str
    wait_s: float
    lease_deadline: float | None = None
    refused: JobResult | None = None
    fence: int | None = None

    def stayed_busy(self) -> Admission:
        """This request refused after its device stayed busy for all of `wait_s`."""
        if self.lease_deadline is not None and (
            self.lease_deadline - time.monotonic() <= _TIMER_SLACK_S
        ):
            error = (
                f"lease {self.lease_id!r} on {self.device_id} ended while the request waited "
                "for the busy device"
            )
            return replace(self, refused=JobResult(Status.UNAUTHORIZED, error=error))
        error = f"device {self.device_id} stayed busy"
        return replace(self, refused=JobResult(Status.RUNTIME_ERROR, error=error))


@runtime_checkable
class PerDeviceBackend(Protocol):
    """A backend whose devices are hardware of their own (cuda: a GPU each), with their own tags,
    telemetry and child environment. `index` is the backend's number of a device (a GPU's
    ordinal); an agent serves `all_devices` (`count_devices` of them) or its `device_indices`."""

    def count_devices(self) -> int:
        """How many devices this machine has for the backend."""
        ...

    def tags_of(self, index: int) -> dict[str, str]:
        """Device `index`'s tags (they replace `Backend.device_tags`)."""
        ...

    def child_env(self, index: int) -> dict[str, str]:
        """What device `index`'s executor child adds to its environment."""
        ...

    def telemetry_of(self, index: int, host: Telemetry) -> Telemetry:
        """Device `index`'s readings now, given the host's (in the agent process)."""
        ...


class _Unresolved(Exception):
    """A request names an artifact or entry this agent cannot use: a result, not an RPC error."""

    def __init__(self, status: Status, message: str, missing_sha256: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.missing_sha256 = missing_sha256


def default_agent_id(key: str, cache_dir: str = DEFAULT_CACHE_DIR) -> str:
    """ "<hostname>-<key>": the same after a restart, so a restarted agent replaces its devices.

    An agent whose cache dir is not the default gets "-<6 hex digits of the dir's path>" appended:
    two agents of one key on one host need caches of their own (each clears the cache's uploads in
    progress when it starts), and so get ids of their own. Runs of characters an id may not hold
    become one "-" ("/" too: device ids are "<agent id>/<index>"); an id longer than
    `MAX_AGENT_ID_CHARS` is cut and ends in a hash of the whole, so it stays unique and its device
    ids stay within `protos.ids.MAX_ID_CHARS`.
    """
    parts = [_id_part(socket.gethostname()) or "host", _id_part(key) or "agent"]
    if os.path.abspath(cache_dir) != os.path.abspath(DEFAULT_CACHE_DIR):
        parts.append(hashlib.sha256(os.path.abspath(cache_dir).encode()).hexdigest()[:6])
    agent_id = "-".join(parts)
    if len(agent_id) > MAX_AGENT_ID_CHARS:
        digest = hashlib.sha256(agent_id.encode()).hexdigest()[:6]
        agent_id = f"{agent_id[: MAX_AGENT_ID_CHARS - 7].rstrip('-')}-{digest}"
    return agent_id


def _id_part(text: str) -> str:
    """`text` with each run of characters an agent id may not hold replaced by one "-"."""
    return _NOT_ID_CHARS.sub("-", text).strip("-")


@functools.cache
def agent_version() -> str:
    """The installed kiln version, or "unknown" when running from an uninstalled checkout."""
    try:
        return importlib.metadata.version("kiln")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Agent:
    """Serves one backend's devices; every method is safe to call from many threads."""

    def __init__(
        self, config: AgentConfig, address: str, lease_verifier: LeaseVerifier | None = None
    ) -> None:
        """Set up the cache and the backend, and start one executor per device.

        Raises:
            ValueError: an unknown backend, or a pinned core this process may not use.
            RuntimeError: the backend cannot work on this machine.
        """
        self.config = config
        self.agent_id = config.agent_id or default_agent_id(config.key, config.cache_dir)
        for field, value in (("agent id", self.agent_id), ("key", config.key)):
            problem = identifier_problem(field, value)
            if problem is not None:
                raise ValueError(f"{problem} (the tracker refuses it)")
        self.backend = get_backend(config.backend)
        state_dir = os.path.join(os.path.abspath(config.cache_dir), "backends", self.backend.name)
        self.backend.prepare(state_dir)
        self.cache = ArtifactCache(
            config.cache_dir, config.max_artifact_bytes, config.cache_max_bytes
        )
        self._leases: LeaseVerifier = lease_verifier or _default_leases(config)
        self._quarantine = Quarantine(config.quarantine_after)
        self.stats = AgentStats()
        # The job running on each device, with the signal that stops it (end_leases_below).
        self._jobs: dict[str, tuple[Admission, StopSignal]] = {}
        self._jobs_lock = threading.Lock()
        self._telemetry = TelemetryReader()
        # The backend's tags override the host's (qemu's guest arch), the user's override both.
        host = {"arch": platform.machine(), "backend": self.backend.name}
        sets = config.core_sets
        indices = self._device_indices(config)
        # Device id -> the backend's index of it, for a backend whose devices differ.
        self._indices: dict[str, int] = {}
        backend = self.backend
        shared_tags = {} if isinstance(backend, PerDeviceBackend) else backend.device_tags()
        devices = []
        for i, index in enumerate(indices):
            own = backend.tags_of(index) if isinstance(backend, PerDeviceBackend) else shared_tags
            tags = {**host, **own, **config.tags}
            if sets:  # a device on a core set runs its kernels on one thread per core
                tags["threads"] = str(len(sets[i]))
            device_id = f"{self.agent_id}/{i}"
            self._indices[device_id] = index
            devices.append(DeviceSpec(device_id, config.key, tags, address, self.backend.name))
        self.devices = tuple(devices)
        allowed = os.sched_getaffinity(0)
        for core in (*config.pin_cores, *(c for cores in sets for c in cores)):
            if core not in allowed:
                raise ValueError(
                    f"cannot pin to core {core}: this process may use {sorted(allowed)}"
                )
        pins = config.pin_cores
        self._executors: dict[str, Executor] = {}
        try:
            for i, d in enumerate(self.devices):
                self._executors[d.device_id] = Executor(
                    d.device_id,
                    self.backend,
                    config.executor_address_space_bytes,
                    pin_core=pins[i % len(pins)] if pins else None,
                    cores=sets[i] if sets else (),
                    state_dir=state_dir,
                    on_restart=self.stats.executor_restarted,
                    env=self._child_env(self._indices[d.device_id]),
                )
        except BaseException:
            self.close()
            raise

    def begin_upload(self, meta: ArtifactMeta) -> PendingArtifact:
        """Start storing an artifact (see `ArtifactCache.begin`)."""
        for entry in meta.entries:
            validate_symbol(entry.symbol)
            if entry.timing_symbol:
                validate_symbol(entry.timing_symbol)
            for arg in entry.args:
                _validate_spec(arg)
        return self.cache.begin(meta)

    def has(self, sha256: str) -> bool:
        """Whether the artifact is cached."""
        return self.cache.has(sha256)

    def admit_measure(self, request: MeasureRequest) -> Admission:
        """Check a Measure before it waits for its device: well formed, then its lease.

        Raises:
            UnknownDeviceError: the device is not this agent's.
            InvalidRequestError: a malformed hash, symbol or timing config.
        """
        self._executor(request.device_id)
        validate_sha256(request.artifact_sha256)
        validate_symbol(request.symbol)
        validate_timing(request.config)
        if request.check is not None and request.check.reference_sha256:
            validate_sha256(request.check.reference_sha256)
            if request.check.reference_symbol:
                validate_symbol(request.check.reference_symbol)
        return self._admit(request.device_id, request.lease_id, request.lease_token)

    def measure(
        self,
        request: MeasureRequest,
        admission: Admission,
        cancelled: StopSignal | None = None,
    ) -> MeasureResult:
        """Time an entry; the caller has `admission`'s device to itself until this returns.

        Raises:
            InvalidRequestError: a malformed request (see `admit_measure`).
        """
        executor = self._executor(request.device_id)
        sha = validate_sha256(request.artifact_sha256)
        ref_sha = None
        if request.check is not None and request.check.reference_sha256:
            ref_sha = validate_sha256(request.check.reference_sha256)
        result = admission.refused or _lease_ended(admission)
        missing: tuple[str, ...] = ()
        if result is None:
            limit = self._time_limit(request.config.timeout_s, admission)
            try:
                with ExitStack() as held:
                    path, entry = held.enter_context(self._resolved(sha, request.symbol))
                    check = None
                    if request.check is not None and ref_sha is not None:
                        ref_path, ref_entry = held.enter_context(
                            self._resolved(
                                ref_sha,
                                request.check.reference_symbol or request.symbol,
                                "reference ",
                            )
                        )
                        check = ReferenceCheck(
                            ref_path, ref_entry, request.check.rtol, request.check.atol
                        )
                    job = Job(MEASURE, path, entry, request.seed, request.config, check)
                    with self._running(admission, cancelled) as signal:
                        result = executor.submit(job, limit, signal)
                    self._quarantine.record(sha, entry.symbol, result.status, result.error)
            except _Unresolved as e:
                result = JobResult(e.status, error=str(e))
                missing = (e.missing_sha256,) if e.missing_sha256 else ()
        self.stats.job_done(MEASURE, result.status)
        return MeasureResult(
            status=result.status,
            samples_s=result.samples_s,
            error=result.error,
            signal=result.signal,
            number_used=result.number_used,
            telemetry=self._device_telemetry(request.device_id),
            device_id=request.device_id,
            emulated=self.backend.emulated,
            missing_sha256=missing,
            accel=result.accel,
        )

    def admit_run(self, request: RunRequest) -> Admission:
        """Check a Run before it waits for its device: well formed, then its lease.

        Raises:
            UnknownDeviceError: the device is not this agent's.
            InvalidRequestError: a malformed hash or symbol.
        """
        self._executor(request.device_id)
        validate_sha256(request.artifact_sha256)
        validate_symbol(request.symbol)
        return self._admit(request.device_id, request.lease_id, request.lease_token)

    def run(
        self, request: RunRequest, admission: Admission, cancelled: StopSignal | None = None
    ) -> RunResult:
        """Run an entry once; the caller has `admission`'s device to itself until this returns.

        Raises:
            InvalidRequestError: a malformed hash, or inputs that do not match the entry.
        """
        executor = self._executor(request.device_id)
        sha = validate_sha256(request.artifact_sha256)
        result = admission.refused or _lease_ended(admission)
        if result is None:
            limit = self._time_limit(request.timeout_s, admission)
            try:
                with self._resolved(sha, request.symbol) as (path, entry):
                    if request.inputs is not None:
                        _check_inputs(entry, request.inputs)
                    job = Job(RUN, path, entry, request.seed, inputs=request.inputs)
                    with self._running(admission, cancelled) as signal:
                        result = executor.submit(job, limit, signal)
                    self._quarantine.record(sha, entry.symbol, result.status, result.error)
            except _Unresolved as e:
                result = JobResult(e.status, error=str(e))
        self.stats.job_done(RUN, result.status)
        return RunResult(result.status, result.outputs, result.error, result.signal)

    def info(self) -> AgentInfo:
        """Who this agent is and what it serves."""
        telemetry = self.backend.telemetry(self._telemetry())
        return AgentInfo(self.agent_id, self.devices, telemetry, agent_version())

    def busy_devices(self) -> int:
        """How many devices are running a job right now."""
        with self._jobs_lock:
            return len(self._jobs)

    def quarantined_entries(self) -> int:
        """How many (artifact, entry) pairs are refused for killing their executor too often."""
        return self._quarantine.quarantined()

    def executor_pids(self) -> dict[str, int | None]:
        """Device id -> pid of its executor child (None when it has none right now)."""
        return {device_id: e.child_pid for device_id, e in self._executors.items()}

    def close(self) -> None:
        """Kill every executor (in parallel: each may wait for its child to die)."""
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=max(len(self._executors), 1)
        ) as pool:
            list(pool.map(Executor.close, self._executors.values()))

    def end_leases_below(self, floors: Mapping[str, int]) -> None:
        """Apply the tracker's fence floors (device id -> lowest valid fence; see Registrar).

        Leases below a floor were ended by the tracker (this agent went silent, say): they are
        refused from now on, and a job of one still running is killed and answered UNAUTHORIZED.
        """
        own = {d: floor for d, floor in floors.items() if d in self._executors}
        self._leases.raise_floors(own)
        with self._jobs_lock:
            for device_id, (admission, signal) in self._jobs.items():
                floor = own.get(device_id)
                if floor is not None and admission.fence is not None and admission.fence < floor:
                    _LOG.warning(
                        "the tracker ended lease %r on %s; stopping its job",
                        admission.lease_id,
                        device_id,
                    )
                    signal.stop(
                        f"lease {admission.lease_id!r} on {device_id} was ended by the tracker "
                        f"(fence {admission.fence} < floor {floor})"
                    )

    def _device_indices(self, config: AgentConfig) -> tuple[int, ...]:
        """The backend's indices of the devices to serve (one each).

        Raises:
            ValueError: all_devices or device_indices with a backend whose devices are all
                alike, or an index the backend does not have.
        """
        backend = self.backend
        if not (config.all_devices or config.device_indices):
            return tuple(range(config.devices))
        if not isinstance(backend, PerDeviceBackend):
            raise ValueError(
                f"backend {backend.name} has no devices of its own: give a number of devices"
            )
        count = backend.count_devices()
        if config.all_devices:
            return tuple(range(count))
        missing = [i for i in config.device_indices if i >= count]
        if missing:
            raise ValueError(
                f"no device {missing} on this machine: backend {backend.name} has {count}"
            )
        return config.device_indices

    def _child_env(self, index: int) -> dict[str, str]:
        if isinstance(self.backend, PerDeviceBackend):
            return self.backend.child_env(index)
        return {}

    def _device_telemetry(self, device_id: str) -> Telemetry:
        host = self._telemetry()
        if isinstance(self.backend, PerDeviceBackend):
            return self.backend.telemetry_of(self._indices[device_id], host)
        return self.backend.telemetry(host)

    @contextmanager
    def _running(self, admission: Admission, cancelled: StopSignal | None) -> Iterator[StopSignal]:
        """Note the job on `admission`'s device while it runs, so `end_leases_below` can stop it."""
        signal = cancelled or StopSignal()
        with self._jobs_lock:
            self._jobs[admission.device_id] = (admission, signal)
        try:
            yield signal
        finally:
            with self._jobs_lock:
                self._jobs.pop(admission.device_id, None)

    def _executor(self, device_id: str) -> Executor:
        try:
            return self._executors[device_id]
        except KeyError:
            raise UnknownDeviceError(
                f"no device {device_id!r:.80} on agent {self.agent_id}"
            ) from None

    def _admit(self, device_id: str, lease_id: str, lease_token: str) -> Admission:
        check = self._leases.check(device_id, lease_id, lease_token)
        wait_s = self.config.device_wait_s
        if check.refusal is not None:
            _REFUSED.log(
                device_id, logging.WARNING, "refused a request on %s: %s", device_id, check.refusal
            )
            refused = JobResult(Status.UNAUTHORIZED, error=check.refusal)
            return Admission(device_id, lease_id, 0.0, refused=refused)
        if check.remaining_s is None:
            return Admission(device_id, lease_id, wait_s)
        deadline = time.monotonic() + check.remaining_s
        return Admission(
            device_id, lease_id, min(wait_s, check.remaining_s), deadline, fence=check.fence
        )

    def _time_limit(self, requested_s: float, admission: Admission) -> TimeLimit:
        """The earliest of the job's timeout (or the default), `max_job_s` and its lease's end."""
        timeout_s = requested_s if requested_s > 0 else self.config.default_timeout_s
        limit = TimeLimit.requested(timeout_s)
        cap_s = self.config.max_job_s
        if cap_s < limit.seconds:
            limit = TimeLimit(cap_s, f"ran past the agent's cap of {cap_s:g} s; executor killed")
        if admission.lease_deadline is not None:
            left_s = max(admission.lease_deadline - time.monotonic(), 0.0)
            if left_s < limit.seconds:
                error = (
                    f"lease {admission.lease_id!r} on {admission.device_id} expired while the "
                    "job ran; executor killed"
                )
                limit = TimeLimit(left_s, error)
        return limit

    @contextmanager
    def _resolved(self, sha: str, symbol: str, what: str = "") -> Iterator[tuple[str, EntryPoint]]:
        """The cached artifact's path and entry, held in the cache (not evictable) meanwhile.

        Raises:
            _Unresolved: not cached, a format the backend cannot load, no such entry, quarantined.
        """
        cached = self.cache.acquire(sha)
        if cached is None:
            raise _Unresolved(Status.LOAD_ERROR, f"{what}artifact {sha} not in cache", sha)
        try:
            if cached.meta.format not in self.backend.formats:
                raise _Unresolved(
                    Status.LOAD_ERROR,
                    f"backend {self.backend.name} cannot load {what}artifact format "
                    f"{cached.meta.format}",
                )
            entry = cached.meta.entry(symbol)
            if entry is None:
                raise _Unresolved(Status.LOAD_ERROR, f"no entry {symbol!r} in {what}artifact {sha}")
            quarantined = self._quarantine.reason(sha, symbol)
            if quarantined is not None:
                raise _Unresolved(Status.RUNTIME_ERROR, f"{what}{quarantined}")
            yield cached.path, entry
        finally:
            self.cache.release(sha)


def validate_symbol(symbol: str) -> str:
    """`symbol` when it is a C identifier (no '/', '.', or anything a path could be made of).

    Raises:
        InvalidRequestError: it is not.
    """
    if not _C_IDENTIFIER.fullmatch(symbol):
        raise InvalidRequestError(f"symbol must be a C identifier, got {symbol!r:.80}")
    return symbol


# Bounds of a Measure's timing config: past them a request is malformed, whoever sent it (a sweep
# buffer of 2**40 bytes or a billion repeats would take the executor child's memory or the
# device for good before any timeout).
TIMING_LIMITS = {
    "warmup": 10_000,
    "number": 100_000_000,
    "repeat": 10_000,
    "min_repeat_ms": 60_000.0,
    "cooldown_ms": 60_000.0,
    "flush_cache_bytes": 1 << 30,
    # No bound of its own: max_job_s and the lease end every job sooner.
    "timeout_s": math.inf,
}


def validate_timing(config: EvaluatorConfig) -> EvaluatorConfig:
    """`config` when every field is a finite number from 0 to its TIMING_LIMITS bound.

    Raises:
        InvalidRequestError: naming the first field out of bounds.
    """
    for name, limit in TIMING_LIMITS.items():
        value = getattr(config, name)
        if not math.isfinite(value) or not 0 <= value <= limit:
            raise InvalidRequestError(f"timing config {name} must be 0..{limit:g}, got {value!r}")
    return config


def _lease_ended(admission: Admission) -> JobResult | None:
    """UNAUTHORIZED when the lease ended before the job could start (it waited for the device)."""
    if admission.lease_deadline is None or admission.lease_deadline > time.monotonic():
        return None
    error = f"lease {admission.lease_id!r} on {admission.device_id} ended before the job started"
    return JobResult(Status.UNAUTHORIZED, error=error)


def _default_leases(config: AgentConfig) -> LeaseVerifier:
    if config.secrets is None:
        return AcceptAllLeases()
    return FencingLeases(config.secrets.require_lease_key(), config.lease_leeway_s)


def _validate_spec(spec: TensorSpec) -> None:
    if arrays.plain_dtype(spec.dtype) is None:
        raise InvalidRequestError(
            f"arg {spec.name!r} has dtype {spec.dtype!r:.40}: not a number or bool type"
        )
    if any(d < 0 for d in spec.shape):
        raise InvalidRequestError(f"arg {spec.name!r} has a negative dimension: {spec.shape}")


def _check_inputs(entry: EntryPoint, inputs: tuple[np.ndarray, ...]) -> None:
    specs = [a for a in entry.args if a.role is ArgRole.INPUT]
    try:
        arrays.check_inputs(specs, inputs)
    except ValueError as e:
        raise InvalidRequestError(f"inputs of {entry.symbol}: {e}") from None

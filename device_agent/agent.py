"""The agent's core: devices, artifact cache and executors behind plain methods the servicer calls."""

from __future__ import annotations

import concurrent.futures
import functools
import importlib.metadata
import logging
import math
import os
import platform
import re
import secrets
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import numpy as np

from device_agent import arrays
from device_agent.backends import get_backend
from device_agent.cache import ArtifactCache, PendingArtifact, validate_sha256
from device_agent.config import AgentConfig
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
    TensorSpec,
)
from device_agent.errors import InvalidRequestError, UnknownDeviceError
from device_agent.executor import Executor
from device_agent.jobs import MEASURE, RUN, Job, JobResult, ReferenceCheck
from device_agent.leases import AcceptAllLeases, FencingLeases, LeaseVerifier
from device_agent.quarantine import Quarantine
from device_agent.telemetry import TelemetryReader
from protos.ids import identifier_problem

_LOG = logging.getLogger(__name__)
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


class _Unresolved(Exception):
    """A request names an artifact or entry this agent cannot use: a result, not an RPC error."""

    def __init__(self, status: Status, message: str, missing_sha256: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.missing_sha256 = missing_sha256


def default_agent_id() -> str:
    """ "<hostname>-<pid>-<random>": unique per process, readable in the tracker's listing."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


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
        self.agent_id = config.agent_id or default_agent_id()
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
        self._telemetry = TelemetryReader()
        # The backend's tags override the host's (qemu's guest arch), the user's override both.
        host = {"arch": platform.machine(), "backend": self.backend.name}
        tags = {**host, **self.backend.device_tags(), **config.tags}
        self.devices = tuple(
            DeviceSpec(f"{self.agent_id}/{i}", config.key, dict(tags), address, self.backend.name)
            for i in range(config.devices)
        )
        allowed = os.sched_getaffinity(0)
        for core in config.pin_cores:
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
                    config.device_wait_s,
                    pin_core=pins[i % len(pins)] if pins else None,
                    state_dir=state_dir,
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

    def measure(
        self, request: MeasureRequest, cancelled: threading.Event | None = None
    ) -> MeasureResult:
        """Time an entry on a device.

        Raises:
            UnknownDeviceError: the device is not this agent's.
            InvalidRequestError: a malformed artifact hash.
        """
        executor = self._executor(request.device_id)
        sha = validate_sha256(request.artifact_sha256)
        validate_symbol(request.symbol)
        validate_timing(request.config)
        ref_sha = None
        if request.check is not None and request.check.reference_sha256:
            ref_sha = validate_sha256(request.check.reference_sha256)
            if request.check.reference_symbol:
                validate_symbol(request.check.reference_symbol)
        result = self._authorize(request.device_id, request.lease_id, request.lease_token)
        missing: tuple[str, ...] = ()
        if result is None:
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
                    timeout_s = self._timeout_s(request.config.timeout_s)
                    result = executor.submit(job, timeout_s, cancelled)
                    self._quarantine.record(sha, entry.symbol, result.status, result.error)
            except _Unresolved as e:
                result = JobResult(e.status, error=str(e))
                missing = (e.missing_sha256,) if e.missing_sha256 else ()
        return MeasureResult(
            status=result.status,
            samples_s=result.samples_s,
            error=result.error,
            signal=result.signal,
            number_used=result.number_used,
            telemetry=self.backend.telemetry(self._telemetry()),
            device_id=request.device_id,
            emulated=self.backend.emulated,
            missing_sha256=missing,
        )

    def run(self, request: RunRequest, cancelled: threading.Event | None = None) -> RunResult:
        """Run an entry once and return its outputs.

        Raises:
            UnknownDeviceError: the device is not this agent's.
            InvalidRequestError: a malformed hash, or inputs that do not match the entry.
        """
        executor = self._executor(request.device_id)
        sha = validate_sha256(request.artifact_sha256)
        validate_symbol(request.symbol)
        result = self._authorize(request.device_id, request.lease_id, request.lease_token)
        if result is None:
            try:
                with self._resolved(sha, request.symbol) as (path, entry):
                    if request.inputs is not None:
                        _check_inputs(entry, request.inputs)
                    job = Job(RUN, path, entry, request.seed, inputs=request.inputs)
                    result = executor.submit(job, self._timeout_s(request.timeout_s), cancelled)
                    self._quarantine.record(sha, entry.symbol, result.status, result.error)
            except _Unresolved as e:
                result = JobResult(e.status, error=str(e))
        return RunResult(result.status, result.outputs, result.error, result.signal)

    def info(self) -> AgentInfo:
        """Who this agent is and what it serves."""
        telemetry = self.backend.telemetry(self._telemetry())
        return AgentInfo(self.agent_id, self.devices, telemetry, agent_version())

    def executor_pids(self) -> dict[str, int | None]:
        """Device id -> pid of its executor child (None when it has none right now)."""
        return {device_id: e.child_pid for device_id, e in self._executors.items()}

    def close(self) -> None:
        """Kill every executor (in parallel: each may wait for its child to die)."""
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=max(len(self._executors), 1)
        ) as pool:
            list(pool.map(Executor.close, self._executors.values()))

    def _executor(self, device_id: str) -> Executor:
        try:
            return self._executors[device_id]
        except KeyError:
            raise UnknownDeviceError(f"no device {device_id!r} on agent {self.agent_id}") from None

    def _authorize(self, device_id: str, lease_id: str, lease_token: str) -> JobResult | None:
        reason = self._leases.check(device_id, lease_id, lease_token)
        if reason is None:
            return None
        _LOG.warning("refused a request on %s: %s", device_id, reason)
        return JobResult(Status.UNAUTHORIZED, error=reason)

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

    def _timeout_s(self, requested_s: float) -> float:
        return requested_s if requested_s > 0 else self.config.default_timeout_s


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
    "timeout_s": 86_400.0,
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

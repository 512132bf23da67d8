"""The backend interface: what a device kind can load, how it runs and times an entry, telemetry.

A backend's `execute` runs inside the executor child when `sandboxed` is true (anything that runs
native code), else in the agent process (`null`). A failed job is a `JobResult` with a status, never an
exception out of `execute`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from device_agent.arrays import inputs_of, make_args, outputs_of
from device_agent.domain import EntryPoint, EvaluatorConfig, Status, Telemetry
from device_agent.jobs import RUN, Job, JobResult, ReferenceCheck


class JobFailed(Exception):
    """Ends a job early with `status`; raised by backend steps, caught by `execute`."""

    def __init__(self, status: Status, message: str, signal: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.signal = signal


class Backend(ABC):
    """One kind of device: its artifact formats (`kiln.v1.ArtifactFormat` names), runner, telemetry."""

    name: ClassVar[str]
    formats: ClassVar[frozenset[str]]
    # True when jobs must run in the supervised executor child (they run foreign native code).
    sandboxed: ClassVar[bool] = True
    # True when samples come from an emulator rather than the hardware's clock.
    emulated: ClassVar[bool] = False

    def device_tags(self) -> dict[str, str]:
        """Tags this backend adds to each device (the agent adds arch and the user's tags)."""
        return {}

    def telemetry(self, host: Telemetry) -> Telemetry:
        """Readings of the device now, given the host's; None where unknown. In the agent process."""
        return host

    def prepare(self, state_dir: str) -> None:
        """Make what the backend needs before its first job (idempotent; in agent and child).

        Raises:
            RuntimeError: the backend cannot work on this machine (the message says why).
        """
        del state_dir  # most backends need nothing

    @abstractmethod
    def execute(self, job: Job) -> JobResult:
        """Run or measure `job`; failures are results."""


class NativeBackend(Backend):
    """A backend whose artifacts expose the packed C ABI of common.proto: load, call, time."""

    @abstractmethod
    def load(self, path: str) -> Any:
        """The loaded module at `path` (raises JobFailed(LOAD_ERROR) when it cannot be loaded)."""

    @abstractmethod
    def call(self, module: Any, symbol: str, buffers: list[np.ndarray]) -> int:
        """Call `symbol(args)` once and return its return code."""

    @abstractmethod
    def time(
        self, module: Any, entry: EntryPoint, buffers: list[np.ndarray], config: EvaluatorConfig
    ) -> tuple[list[float], int]:
        """Call the entry's timing symbol; return (samples_s, number_used)."""

    def execute(self, job: Job) -> JobResult:
        """Load, then run once (RUN) or check and time (MEASURE)."""
        try:
            module = self.load(job.artifact_path)
            if job.kind == RUN:
                buffers = _args(job.entry, job.seed, job.inputs)
                self._call_ok(module, job.entry.symbol, buffers)
                return JobResult(Status.OK, outputs=tuple(outputs_of(job.entry.args, buffers)))
            if job.check is not None:
                self._check(module, job, job.check)
            samples, number_used = self.time(
                module, job.entry, _args(job.entry, job.seed), job.timing
            )
            return JobResult(Status.OK, samples_s=tuple(samples), number_used=number_used)
        except JobFailed as e:
            return JobResult(e.status, error=e.message, signal=e.signal)

    def _call_ok(self, module: Any, symbol: str, buffers: list[np.ndarray]) -> None:
        code = self.call(module, symbol, buffers)
        if code != 0:
            raise JobFailed(Status.RUNTIME_ERROR, f"entry {symbol} returned {code}")

    def _check(self, module: Any, job: Job, check: ReferenceCheck) -> None:
        got = _args(job.entry, job.seed)
        # The reference gets the same seeded inputs, made afresh: the entry may write to its own.
        ref = _args(check.entry, job.seed, inputs_of(job.entry.args, _args(job.entry, job.seed)))
        self._call_ok(module, job.entry.symbol, got)
        self._call_ok(self.load(check.path), check.entry.symbol, ref)
        got_out, ref_out = outputs_of(job.entry.args, got), outputs_of(check.entry.args, ref)
        if len(got_out) != len(ref_out):
            raise JobFailed(
                Status.WRONG_ANSWER, f"{len(got_out)} outputs, the reference has {len(ref_out)}"
            )
        for index, (a, b) in enumerate(zip(got_out, ref_out, strict=True)):
            if a.shape != b.shape:
                raise JobFailed(
                    Status.WRONG_ANSWER, f"output {index} has shape {a.shape}, reference {b.shape}"
                )
            if not np.allclose(a, b, rtol=check.rtol, atol=check.atol, equal_nan=True):
                err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                raise JobFailed(
                    Status.WRONG_ANSWER,
                    f"output {index} differs from the reference: max abs error {err:.6g} "
                    f"(rtol={check.rtol:g}, atol={check.atol:g})",
                )


def _args(
    entry: EntryPoint, seed: int, inputs: list[np.ndarray] | tuple[np.ndarray, ...] | None = None
) -> list[np.ndarray]:
    try:
        return make_args(entry.args, seed, inputs)
    except (ValueError, TypeError) as e:
        raise JobFailed(Status.RUNTIME_ERROR, f"cannot make the args of {entry.symbol}: {e}") from e

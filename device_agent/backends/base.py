"""The backend interface: what a device kind can load, how it runs and times an entry, telemetry.

A backend's `execute` runs inside the executor child when `sandboxed` is true (anything that runs
native code), else in the agent process (`null`). A failed job is a `JobResult` with a status, never an
exception out of `execute`.

A correctness check runs the reference once per (reference, seed, input specs): a tuning run checks
every candidate of a task against one reference on one seed, and the executor child lives across
those jobs, so a native backend keeps the reference's outputs (`ReferenceOutputs`) and compares each
candidate's fresh outputs with them.
"""

from __future__ import annotations

import dataclasses
import functools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from device_agent.arrays import inputs_of, make_args, outputs_of
from device_agent.domain import (
    ArgRole,
    EntryPoint,
    EvaluatorConfig,
    Status,
    Telemetry,
    TensorSpec,
)
from device_agent.jobs import RUN, Job, JobResult, ReferenceCheck

ELF_MAGIC = b"\x7fELF"  # a shared object: an accelerator backend's host-side check reference


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
    # False when the executor child must run without its RLIMIT_AS cap (the CUDA driver reserves
    # virtual address space far past any such cap and fails to start under it).
    limits_address_space: ClassVar[bool] = True
    # Set (to the cause) by a job that ruined this process's state for good (a sticky CUDA
    # error): the executor child then exits after its result and a fresh one serves the next job.
    poisoned: str = ""

    def device_tags(self) -> dict[str, str]:
        """Tags this backend adds to each device: what a workstation needs to pick the compile
        target ("features", "cpu"). The agent adds "arch" and "backend" (which these override)
        and the user's tags (which override these)."""
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


# Bytes of reference outputs a native backend keeps. A task has one reference per argument layout
# its configs use (dense: one per (nr, kc), 20 of sgemm 1024's valid configs on AVX-512, 4 MiB of
# output each), and a search visits them in no order, so the store must hold a task's layouts at
# once: at 64 MiB (16 of them) a run over 200 random sgemm configs re-ran evicted references, and
# checking added 37% to the measuring time. Bounded still, so a board's executor child (whose
# address space the agent caps, 8 GiB by default) stays small; a miss costs one reference run.
REFERENCE_CACHE_BYTES = 256 * 1024 * 1024

# (reference artifact path, reference symbol, seed, the candidate's INPUT (shape, dtype)s): the
# inputs are a function of the seed and those specs (see `arrays`), and an artifact's path names its
# hash, so equal keys mean equal reference outputs.
ReferenceKey = tuple[str, str, int, tuple[tuple[tuple[int, ...], str], ...]]


def reference_key(path: str, symbol: str, seed: int, specs: Sequence[TensorSpec]) -> ReferenceKey:
    """The key of the reference outputs of `symbol` in the artifact at `path` on the inputs that
    `seed` makes for a candidate with arg `specs`."""
    inputs = tuple(
        (tuple(int(d) for d in s.shape), str(s.dtype)) for s in specs if s.role is ArgRole.INPUT
    )
    return (path, symbol, seed, inputs)


class ReferenceOutputs:
    """A least-recently-used store of reference outputs, bounded by their total bytes.

    MUST hold: `total_bytes <= max_bytes` after every `put`; an entry larger than `max_bytes` is
    not kept; stored arrays are read-only, so no caller can change what a later check compares with.
    """

    def __init__(self, max_bytes: int = REFERENCE_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.total_bytes = 0
        self._entries: OrderedDict[ReferenceKey, tuple[np.ndarray, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: ReferenceKey) -> tuple[np.ndarray, ...] | None:
        """The outputs stored under `key` (now the most recently used), or None."""
        outputs = self._entries.get(key)
        if outputs is not None:
            self._entries.move_to_end(key)
        return outputs

    def put(self, key: ReferenceKey, outputs: Sequence[np.ndarray]) -> None:
        """Keep `outputs` under `key`, evicting the least recently used to stay in bounds."""
        size = sum(a.nbytes for a in outputs)
        if key in self._entries:
            self.total_bytes -= sum(a.nbytes for a in self._entries.pop(key))
        if size > self.max_bytes:
            return
        frozen = []
        for array in outputs:
            array = np.array(array, copy=True)
            array.flags.writeable = False
            frozen.append(array)
        self._entries[key] = tuple(frozen)
        self.total_bytes += size
        while self.total_bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.total_bytes -= sum(a.nbytes for a in evicted)


class NativeBackend(Backend):
    """A backend whose artifacts expose the packed C ABI of common.proto: load, call, time.

    One instance serves one executor child for its life; `reference_outputs` outlives jobs.
    """

    # Whether a call warms what the timing loop then runs (same process, same buffers): a checked
    # candidate's check call then stands for one warm-up call. Not so where each call is a new
    # process (qemu).
    check_call_warms: ClassVar[bool] = True

    @functools.cached_property
    def reference_outputs(self) -> ReferenceOutputs:
        """This backend's stored reference outputs (made on first use, so a subclass's
        `__init__` need not call this one's)."""
        return ReferenceOutputs()

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
            timing = job.timing
            if job.check is None:
                buffers = _args(job.entry, job.seed)
            else:
                # Timed on the checked buffers (drawing sgemm 1024's inputs again took 20 ms),
                # the check's call standing for one warm-up call where it warms the same process.
                buffers = self._check(module, job, job.check)
                if self.check_call_warms:
                    timing = dataclasses.replace(timing, warmup=max(timing.warmup - 1, 0))
            samples, number_used = self.time(module, job.entry, buffers, timing)
            return JobResult(Status.OK, samples_s=tuple(samples), number_used=number_used)
        except JobFailed as e:
            return JobResult(e.status, error=e.message, signal=e.signal)

    def _call_ok(self, module: Any, symbol: str, buffers: list[np.ndarray]) -> None:
        code = self.call(module, symbol, buffers)
        if code != 0:
            raise JobFailed(Status.RUNTIME_ERROR, f"entry {symbol} returned {code}")

    def _check(self, module: Any, job: Job, check: ReferenceCheck) -> list[np.ndarray]:
        """Run the candidate once and compare its outputs with the reference's (JobFailed
        WRONG_ANSWER when they differ); the candidate's buffers, inputs untouched."""
        got = _args(job.entry, job.seed)
        ref_out = self._reference(job, check, got)
        self._call_ok(module, job.entry.symbol, got)
        got_out = outputs_of(job.entry.args, got)
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
        return got

    def _reference(
        self, job: Job, check: ReferenceCheck, got: list[np.ndarray]
    ) -> Sequence[np.ndarray]:
        """The reference's outputs on `got`'s inputs (before the candidate runs on them): stored
        ones when this child has run that reference on those inputs before."""
        key = reference_key(check.path, check.entry.symbol, job.seed, job.entry.args)
        stored = self.reference_outputs.get(key)
        if stored is not None:
            return stored
        # Copies of the candidate's inputs (make_args copies what it is given): either entry may
        # write to its own.
        ref = _args(check.entry, job.seed, inputs_of(job.entry.args, got))
        self._call_ok(self.load(check.path), check.entry.symbol, ref)
        outputs = outputs_of(check.entry.args, ref)
        self.reference_outputs.put(key, outputs)
        return outputs


def _args(
    entry: EntryPoint, seed: int, inputs: list[np.ndarray] | tuple[np.ndarray, ...] | None = None
) -> list[np.ndarray]:
    try:
        return make_args(entry.args, seed, inputs)
    except (ValueError, TypeError) as e:
        raise JobFailed(Status.RUNTIME_ERROR, f"cannot make the args of {entry.symbol}: {e}") from e


def read_artifact(path: str) -> bytes:
    """The bytes of the cached artifact at `path`.

    Raises:
        JobFailed: LOAD_ERROR naming why the file cannot be read.
    """
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise JobFailed(Status.LOAD_ERROR, f"cannot read artifact: {e.strerror}") from e

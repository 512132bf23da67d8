"""Jobs the agent hands to a device's executor, their results, and their frame encoding."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from device_agent.domain import (
    AccelCycles,
    EntryPoint,
    EvaluatorConfig,
    ModuleCycles,
    Status,
    entry_from_dict,
    entry_to_dict,
)
from device_agent.framing import Frame

MEASURE = "measure"
RUN = "run"
# A tuning run measures the same few entries over and over: encode each once (read-only use).
_entry_dict = functools.lru_cache(maxsize=512)(entry_to_dict)


class StopSignal(threading.Event):
    """Set to stop a job: by its client leaving (`set()`, no reason) or by the agent (`stop`)."""

    reason = ""

    def stop(self, reason: str) -> None:
        """Stop the job because of `reason` (e.g. the tracker ended its lease)."""
        self.reason = reason
        self.set()


@dataclass(frozen=True)
class ReferenceCheck:
    """Compare outputs with `entry` of the artifact at `path` on the same seeded inputs."""

    path: str
    entry: EntryPoint
    rtol: float
    atol: float


@dataclass(frozen=True)
class Job:
    """One measurement (`kind` MEASURE) or one run (`kind` RUN) of an entry of a cached artifact.

    For RUN, `inputs` (in INPUT-arg order) replace the seeded inputs when not None.
    """

    kind: str
    artifact_path: str
    entry: EntryPoint
    seed: int = 0
    timing: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    check: ReferenceCheck | None = None
    inputs: tuple[np.ndarray, ...] | None = None


@dataclass(frozen=True)
class JobResult:
    status: Status
    samples_s: tuple[float, ...] = ()
    number_used: int = 0
    error: str = ""
    signal: int = 0
    outputs: tuple[np.ndarray, ...] = ()
    accel: AccelCycles | None = None  # a simulated accelerator's cycles (vta_sim's MEASURE)


def job_to_frame(job: Job) -> Frame:
    """The job as a frame header and blobs."""
    header: dict[str, Any] = {
        "kind": job.kind,
        "artifact_path": job.artifact_path,
        "entry": _entry_dict(job.entry),
        "seed": job.seed,
        "timing": dict(vars(job.timing)),
        "check": None,
        "inputs": None,
    }
    if job.check is not None:
        check = job.check
        header["check"] = {
            "path": check.path,
            "entry": _entry_dict(check.entry),
            "rtol": check.rtol,
            "atol": check.atol,
        }
    blobs: list[bytes] = []
    if job.inputs is not None:
        header["inputs"] = _arrays_to_header(job.inputs, blobs)
    return header, blobs


def job_from_frame(frame: Frame) -> Job:
    """The job encoded by `job_to_frame`."""
    header, blobs = frame
    check = header["check"]
    return Job(
        kind=header["kind"],
        artifact_path=header["artifact_path"],
        entry=entry_from_dict(header["entry"]),
        seed=int(header["seed"]),
        timing=EvaluatorConfig(**header["timing"]),
        check=None
        if check is None
        else ReferenceCheck(**{**check, "entry": entry_from_dict(check["entry"])}),
        inputs=None if header["inputs"] is None else _arrays_from_header(header["inputs"], blobs),
    )


def result_to_frame(result: JobResult) -> Frame:
    """The result as a frame header and blobs."""
    blobs: list[bytes] = []
    header = {
        "status": result.status.value,
        "samples_s": list(result.samples_s),
        "number_used": result.number_used,
        "error": result.error,
        "signal": result.signal,
        "outputs": _arrays_to_header(result.outputs, blobs),
        "accel": None if result.accel is None else dataclasses.asdict(result.accel),
    }
    return header, blobs


def result_from_frame(frame: Frame) -> JobResult:
    """The result encoded by `result_to_frame` (raises KeyError/ValueError when malformed)."""
    header, blobs = frame
    return JobResult(
        status=Status(header["status"]),
        samples_s=tuple(float(s) for s in header["samples_s"]),
        number_used=int(header["number_used"]),
        error=str(header["error"]),
        signal=int(header["signal"]),
        outputs=_arrays_from_header(header["outputs"], blobs),
        accel=_accel_from_header(header["accel"]),
    )


def _accel_from_header(obj: dict[str, Any] | None) -> AccelCycles | None:
    if obj is None:
        return None
    modules = tuple(ModuleCycles(**m) for m in obj["modules"])
    return AccelCycles(int(obj["total_cycles"]), int(obj["gemm_cycles"]), modules)


def _arrays_to_header(arrays: Sequence[np.ndarray], blobs: list[bytes]) -> list[dict[str, Any]]:
    specs = []
    for array in arrays:
        specs.append({"shape": list(array.shape), "dtype": array.dtype.str, "blob": len(blobs)})
        blobs.append(np.ascontiguousarray(array).tobytes())
    return specs


def _arrays_from_header(specs: list[dict[str, Any]], blobs: list[bytes]) -> tuple[np.ndarray, ...]:
    return tuple(
        np.frombuffer(blobs[s["blob"]], dtype=np.dtype(s["dtype"]))
        .reshape(tuple(s["shape"]))
        .copy()
        for s in specs
    )

"""Plain records the agent works with; `serde` converts them to and from the wire.

They mirror the messages of `protos/common.proto` without importing them, so the core stays free of
generated code.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Shared with the tuner, so it lives in protos; re-exported here for the rest of the agent.
from protos.evaluator import EvaluatorConfig as EvaluatorConfig


class Status(enum.Enum):
    """Outcome of a measurement or run; names match `kiln.v1.Status`."""

    OK = "OK"
    UPLOAD_ERROR = "UPLOAD_ERROR"
    LOAD_ERROR = "LOAD_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    CRASH = "CRASH"
    TIMEOUT = "TIMEOUT"
    WRONG_ANSWER = "WRONG_ANSWER"
    DEVICE_LOST = "DEVICE_LOST"
    UNAUTHORIZED = "UNAUTHORIZED"


class ArgRole(enum.Enum):
    """How the device fills an argument buffer; names match `kiln.v1.ArgRole`."""

    INPUT = "INPUT"
    OUTPUT = "OUTPUT"
    WORKSPACE = "WORKSPACE"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: ArgRole


@dataclass(frozen=True)
class EntryPoint:
    symbol: str
    timing_symbol: str
    args: tuple[TensorSpec, ...]
    flop: float = 0.0


@dataclass(frozen=True)
class ArtifactMeta:
    """What describes an artifact's bytes; `format` is a `kiln.v1.ArtifactFormat` name."""

    sha256: str
    format: str
    target: str = ""
    entries: tuple[EntryPoint, ...] = ()
    workspace_bytes: int = 0
    size_bytes: int = 0

    def entry(self, symbol: str) -> EntryPoint | None:
        """The entry point named `symbol`, or None."""
        return next((e for e in self.entries if e.symbol == symbol), None)


@dataclass(frozen=True)
class CheckSpec:
    reference_sha256: str
    reference_symbol: str
    rtol: float = 1e-5
    atol: float = 1e-8


@dataclass(frozen=True)
class MeasureRequest:
    """Time `symbol` of an artifact on a device; `check` None means no correctness check."""

    device_id: str
    artifact_sha256: str
    symbol: str
    seed: int = 0
    config: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    check: CheckSpec | None = None
    lease_id: str = ""
    lease_token: str = ""


@dataclass(frozen=True)
class RunRequest:
    """Run `symbol` once; `inputs` (INPUT-arg order) None means make them from `seed`."""

    device_id: str
    artifact_sha256: str
    symbol: str
    inputs: tuple[np.ndarray, ...] | None = None
    seed: int = 0
    timeout_s: float = 0.0
    lease_id: str = ""
    lease_token: str = ""


@dataclass(frozen=True)
class Telemetry:
    """Device readings; None where the device does not expose one (omitted on the wire)."""

    load_1m: float | None = None
    cpu_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class ModuleCycles:
    """One module of a simulated accelerator over a run (`kiln.v1.ModuleCycles`)."""

    module: str  # "load", "compute", "store"
    busy_cycles: int
    token_stall_cycles: int
    dram_wait_cycles: int


@dataclass(frozen=True)
class AccelCycles:
    """Where a simulated accelerator's run spent its cycles (`kiln.v1.AccelCycles`)."""

    total_cycles: int
    gemm_cycles: int
    modules: tuple[ModuleCycles, ...] = ()


@dataclass(frozen=True)
class MeasureResult:
    status: Status
    samples_s: tuple[float, ...] = ()
    error: str = ""
    signal: int = 0
    number_used: int = 0
    telemetry: Telemetry = field(default_factory=Telemetry)
    device_id: str = ""
    emulated: bool = False
    missing_sha256: tuple[str, ...] = ()  # named artifacts this agent does not hold
    accel: AccelCycles | None = None  # a simulated accelerator's cycles (vta_sim)


@dataclass(frozen=True)
class RunResult:
    """Outcome of Run: `outputs` in the order of the entry's OUTPUT args (numpy arrays)."""

    status: Status
    outputs: tuple[np.ndarray, ...] = ()
    error: str = ""
    signal: int = 0


@dataclass(frozen=True)
class DeviceSpec:
    device_id: str
    key: str
    tags: dict[str, str]
    agent_address: str
    backend: str


@dataclass(frozen=True)
class AgentInfo:
    agent_id: str
    devices: tuple[DeviceSpec, ...]
    telemetry: Telemetry
    version: str


def entry_to_dict(entry: EntryPoint) -> dict[str, Any]:
    """A JSON-ready dict of the entry point."""
    out = dataclasses.asdict(entry)
    for arg in out["args"]:
        arg["role"] = arg["role"].value
    return out


def entry_from_dict(obj: dict[str, Any]) -> EntryPoint:
    """The entry point stored by `entry_to_dict`."""
    args = tuple(
        TensorSpec(a["name"], tuple(a["shape"]), a["dtype"], ArgRole(a["role"]))
        for a in obj["args"]
    )
    return EntryPoint(obj["symbol"], obj["timing_symbol"], args, float(obj["flop"]))


def meta_to_dict(meta: ArtifactMeta) -> dict[str, Any]:
    """A JSON-ready dict of the meta."""
    out = dataclasses.asdict(meta)
    out["entries"] = [entry_to_dict(e) for e in meta.entries]
    return out


def meta_from_dict(obj: dict[str, Any]) -> ArtifactMeta:
    """The meta stored by `meta_to_dict`."""
    return ArtifactMeta(
        sha256=str(obj["sha256"]),
        format=str(obj["format"]),
        target=str(obj["target"]),
        entries=tuple(entry_from_dict(e) for e in obj["entries"]),
        workspace_bytes=int(obj["workspace_bytes"]),
        size_bytes=int(obj["size_bytes"]),
    )

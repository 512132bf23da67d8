"""Conversions between the wire messages (`protos`) and the agent's domain records.

The only module of the agent's core that imports generated message code.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from device_agent.arrays import plain_dtype
from device_agent.domain import (
    AccelCycles,
    AgentInfo,
    ArgRole,
    ArtifactMeta,
    CheckSpec,
    DeviceSpec,
    EntryPoint,
    EvaluatorConfig,
    MeasureRequest,
    MeasureResult,
    RunRequest,
    RunResult,
    Telemetry,
    TensorSpec,
)
from device_agent.errors import InvalidRequestError
from protos import agent_pb2, common_pb2, tracker_pb2


def meta_from_pb(pb: common_pb2.ArtifactMeta) -> ArtifactMeta:
    """The domain meta (raises InvalidRequestError for an arg without a role)."""
    return ArtifactMeta(
        sha256=pb.sha256,
        format=_enum_name(common_pb2.ArtifactFormat, pb.format, "format"),
        target=pb.target,
        entries=tuple(_entry_from_pb(e) for e in pb.entries),
        workspace_bytes=pb.workspace_bytes,
        size_bytes=pb.size_bytes,
    )


def meta_to_pb(meta: ArtifactMeta) -> common_pb2.ArtifactMeta:
    """The wire meta."""
    return common_pb2.ArtifactMeta(
        sha256=meta.sha256,
        format=meta.format,
        target=meta.target,
        entries=[
            common_pb2.EntryPoint(
                symbol=e.symbol,
                timing_symbol=e.timing_symbol,
                flop=e.flop,
                args=[
                    common_pb2.TensorSpec(
                        name=a.name,
                        shape=list(a.shape),
                        dtype=a.dtype,
                        role=a.role.value,
                    )
                    for a in e.args
                ],
            )
            for e in meta.entries
        ],
        workspace_bytes=meta.workspace_bytes,
        size_bytes=meta.size_bytes,
    )


def _enum_name(enum: Any, value: int, what: str) -> str:
    """The name of `value` in a protobuf enum; a number no enum value has is the client's error."""
    try:
        return str(enum.Name(value))
    except ValueError:
        raise InvalidRequestError(f"unknown {what} {value}") from None


def _entry_from_pb(pb: common_pb2.EntryPoint) -> EntryPoint:
    args = []
    for a in pb.args:
        if a.role == common_pb2.ARG_ROLE_UNSPECIFIED:
            raise InvalidRequestError(f"arg {a.name!r} of {pb.symbol} has no role")
        role = ArgRole(_enum_name(common_pb2.ArgRole, a.role, f"role of arg {a.name!r:.40}"))
        args.append(TensorSpec(a.name, tuple(a.shape), a.dtype, role))
    return EntryPoint(pb.symbol, pb.timing_symbol, tuple(args), pb.flop)


def measure_request_from_pb(pb: agent_pb2.MeasureRequest) -> MeasureRequest:
    """The domain request."""
    c = pb.config
    config = EvaluatorConfig(
        warmup=c.warmup,
        number=c.number,
        repeat=c.repeat,
        min_repeat_ms=c.min_repeat_ms,
        cooldown_ms=c.cooldown_ms,
        flush_cache_bytes=c.flush_cache_bytes,
        timeout_s=c.timeout_s,
    )
    check = None
    if pb.HasField("check") and pb.check.reference_sha256:
        k = pb.check
        check = CheckSpec(k.reference_sha256, k.reference_symbol, k.rtol, k.atol)
    return MeasureRequest(
        device_id=pb.device_id,
        artifact_sha256=pb.artifact_sha256,
        symbol=pb.symbol,
        seed=pb.seed,
        config=config,
        check=check,
        lease_id=pb.lease_id,
        lease_token=pb.lease_token,
    )


def measure_result_to_pb(result: MeasureResult) -> common_pb2.MeasureResult:
    """The wire result."""
    return common_pb2.MeasureResult(
        status=result.status.value,
        samples_s=list(result.samples_s),
        error=result.error,
        signal=result.signal,
        number_used=result.number_used,
        telemetry=telemetry_to_pb(result.telemetry),
        device_id=result.device_id,
        emulated=result.emulated,
        missing_sha256=list(result.missing_sha256),
        accel=None if result.accel is None else accel_to_pb(result.accel),
    )


def accel_to_pb(accel: AccelCycles) -> common_pb2.AccelCycles:
    """The wire form of a simulated accelerator's cycles."""
    return common_pb2.AccelCycles(
        total_cycles=accel.total_cycles,
        gemm_cycles=accel.gemm_cycles,
        modules=[
            common_pb2.ModuleCycles(
                module=m.module,
                busy_cycles=m.busy_cycles,
                token_stall_cycles=m.token_stall_cycles,
                dram_wait_cycles=m.dram_wait_cycles,
            )
            for m in accel.modules
        ],
    )


def run_request_from_pb(pb: agent_pb2.RunRequest) -> RunRequest:
    """The domain request (raises InvalidRequestError for a malformed array)."""
    inputs = tuple(ndarray_from_pb(a) for a in pb.inputs) if pb.inputs else None
    return RunRequest(
        device_id=pb.device_id,
        artifact_sha256=pb.artifact_sha256,
        symbol=pb.symbol,
        inputs=inputs,
        seed=pb.seed,
        timeout_s=pb.timeout_s,
        lease_id=pb.lease_id,
        lease_token=pb.lease_token,
    )


def run_result_to_pb(result: RunResult) -> agent_pb2.RunResponse:
    """The wire response."""
    return agent_pb2.RunResponse(
        status=result.status.value,
        outputs=[ndarray_to_pb(a) for a in result.outputs],
        error=result.error,
        signal=result.signal,
    )


def ndarray_to_pb(array: np.ndarray) -> common_pb2.NDArray:
    """C order, little endian, as common.proto says."""
    # np.asarray, not np.ascontiguousarray: that one makes a 0-d array (a scalar) 1-d.
    little = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
    return common_pb2.NDArray(
        shape=list(array.shape), dtype=array.dtype.name, data=little.tobytes()
    )


# numpy's own limit is 64; no kernel takes more than a handful.
MAX_ARRAY_DIMS = 32


def ndarray_from_pb(pb: common_pb2.NDArray) -> np.ndarray:
    """The array (raises InvalidRequestError when dtype, shape and data disagree)."""
    plain = plain_dtype(pb.dtype)
    if plain is None:
        raise InvalidRequestError(f"array dtype {pb.dtype!r:.40} is not a number or bool type")
    dtype = plain.newbyteorder("<")
    shape = tuple(pb.shape)
    if len(shape) > MAX_ARRAY_DIMS:
        raise InvalidRequestError(
            f"array of {len(shape)} dimensions: at most {MAX_ARRAY_DIMS} are supported"
        )
    if any(d < 0 for d in shape) or len(pb.data) != math.prod(shape) * dtype.itemsize:
        raise InvalidRequestError(
            f"array of {dtype.name}{list(shape)} cannot hold {len(pb.data)} bytes"
        )
    array = np.frombuffer(pb.data, dtype=dtype).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def telemetry_to_pb(t: Telemetry) -> common_pb2.Telemetry:
    """The wire telemetry; an absent reading stays unset (zero means unknown on the wire)."""
    return common_pb2.Telemetry(
        load_1m=t.load_1m or 0.0,
        cpu_mhz=t.cpu_mhz or 0.0,
        temperature_c=t.temperature_c or 0.0,
        power_w=t.power_w or 0.0,
    )


def device_to_pb(d: DeviceSpec) -> common_pb2.DeviceSpec:
    """The wire device."""
    return common_pb2.DeviceSpec(
        device_id=d.device_id,
        key=d.key,
        tags=d.tags,
        agent_address=d.agent_address,
        backend=d.backend,
    )


def info_to_pb(info: AgentInfo) -> agent_pb2.InfoResponse:
    """The wire answer to Info."""
    return agent_pb2.InfoResponse(
        agent_id=info.agent_id,
        devices=[device_to_pb(d) for d in info.devices],
        telemetry=telemetry_to_pb(info.telemetry),
        version=info.version,
    )


def register_request(
    agent_id: str, address: str, devices: tuple[DeviceSpec, ...]
) -> tracker_pb2.RegisterRequest:
    """What the agent sends the tracker to register all its devices."""
    return tracker_pb2.RegisterRequest(
        agent_id=agent_id, agent_address=address, devices=[device_to_pb(d) for d in devices]
    )


def heartbeat_request(agent_id: str) -> tracker_pb2.HeartbeatRequest:
    """What the agent sends the tracker every heartbeat interval."""
    return tracker_pb2.HeartbeatRequest(agent_id=agent_id)


def deregister_request(agent_id: str) -> tracker_pb2.DeregisterRequest:
    """What the agent sends the tracker once when it stops gracefully."""
    return tracker_pb2.DeregisterRequest(agent_id=agent_id)

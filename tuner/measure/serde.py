"""Conversions between the tuner's plain records and the wire messages. The only pb2 user in tuner."""

from __future__ import annotations

from compiler.artifact import Artifact
from protos import common_pb2
from tuner.measure.result import AccelCycles, EvaluatorConfig, MeasureResult, Status

_FORMATS = {
    "shared_object": common_pb2.SHARED_OBJECT,
    "accel_program": common_pb2.ACCEL_PROGRAM,
    "cubin": common_pb2.CUBIN,
    "ptx": common_pb2.PTX,
}
_ROLES = {"input": common_pb2.INPUT, "output": common_pb2.OUTPUT, "workspace": common_pb2.WORKSPACE}


def artifact_meta(art: Artifact) -> common_pb2.ArtifactMeta:
    """The ArtifactMeta that goes in the first upload chunk."""
    if art.format not in _FORMATS:
        raise ValueError(
            f"artifact format {art.format!r} has no wire form (known: {sorted(_FORMATS)})"
        )
    entries = [
        common_pb2.EntryPoint(
            symbol=e.symbol,
            timing_symbol=e.timing_symbol,
            flop=e.flop,
            args=[
                common_pb2.TensorSpec(
                    name=a.name, shape=list(a.shape), dtype=a.dtype, role=_ROLES[a.role]
                )
                for a in e.args
            ],
        )
        for e in art.entries
    ]
    return common_pb2.ArtifactMeta(
        sha256=art.sha256,
        format=_FORMATS[art.format],
        target=art.target,
        entries=entries,
        workspace_bytes=art.workspace_bytes,
        size_bytes=len(art.data),
    )


def evaluator_config(cfg: EvaluatorConfig) -> common_pb2.EvaluatorConfig:
    return common_pb2.EvaluatorConfig(
        warmup=cfg.warmup,
        number=cfg.number,
        repeat=cfg.repeat,
        min_repeat_ms=cfg.min_repeat_ms,
        cooldown_ms=cfg.cooldown_ms,
        flush_cache_bytes=cfg.flush_cache_bytes,
        timeout_s=cfg.timeout_s,
    )


def measure_result(msg: common_pb2.MeasureResult) -> MeasureResult:
    """A MeasureResult from the wire; an unknown or unset status becomes RUNTIME_ERROR."""
    name = common_pb2.Status.Name(msg.status) if msg.status in common_pb2.Status.values() else ""
    try:
        status = Status(name)
    except ValueError:
        return MeasureResult.failed(
            Status.RUNTIME_ERROR,
            f"agent sent status {msg.status} ({name or 'unknown'}): {msg.error}",
        )
    return MeasureResult(
        status=status,
        samples_s=tuple(msg.samples_s),
        error=msg.error,
        device_id=msg.device_id,
        number_used=msg.number_used,
        signal=msg.signal,
        emulated=msg.emulated,
        accel=accel_cycles(msg.accel) if msg.HasField("accel") else None,
    )


def accel_cycles(msg: common_pb2.AccelCycles) -> AccelCycles:
    """A simulated accelerator's cycles from the wire."""
    return AccelCycles(
        total_cycles=msg.total_cycles,
        gemm_cycles=msg.gemm_cycles,
        busy_cycles={m.module: m.busy_cycles for m in msg.modules},
        token_stall_cycles={m.module: m.token_stall_cycles for m in msg.modules},
        dram_wait_cycles={m.module: m.dram_wait_cycles for m in msg.modules},
    )

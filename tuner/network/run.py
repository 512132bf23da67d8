"""Run a built model on a device of the pool: feeds checked, outputs back, native latency.

`run_model(model, feeds, runner)` checks the feeds against the model's inputs, checks that the
leased device can run the artifact's target, uploads the artifact, runs its packed `kiln_model`
entry once with the feeds (Run) and times it natively on the device (Measure with the runner's
evaluator, inputs made there). Nothing here loads the shared object: the agent does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.graph.build_model import MODEL_ENTRY, ModelArtifact, TensorSpec
from tuner.measure import MeasureResult, Status
from tuner.measure.device_target import TargetError, check_target
from tuner.measure.pool_runner import PoolRunner


class ModelRunError(Exception):
    """The model cannot run: bad feeds, a device of another target, or a failed Run."""


@dataclass(frozen=True)
class ModelRun:
    """Outputs of one run (in the model's output order) and the latency measurement."""

    outputs: tuple[np.ndarray, ...]
    latency: MeasureResult
    device_id: str


def _c_dtype(dtype: str) -> np.dtype:
    return np.dtype(np.int32 if dtype == "bool" else dtype)


def check_feeds(specs: Sequence[TensorSpec], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The feeds in input order as the entry takes them (bool as int32).

    Raises:
        ModelRunError: an unknown or missing input, a wrong shape, or a dtype that does not cast
            safely (same kind) to the input's.
    """
    names = [s.name for s in specs]
    unknown = sorted(set(feeds) - set(names))
    if unknown:
        raise ModelRunError(f"the model has no input {unknown[0]!r} (inputs: {names})")
    out = []
    for spec in specs:
        if spec.name not in feeds:
            raise ModelRunError(f"input {spec.name!r} ({spec.dtype}{list(spec.shape)}) not given")
        value = np.asarray(feeds[spec.name])
        if tuple(value.shape) != tuple(spec.shape):
            raise ModelRunError(
                f"input {spec.name!r} must have shape {list(spec.shape)}, got {list(value.shape)}"
            )
        if not np.can_cast(value.dtype, np.dtype(spec.dtype), casting="same_kind"):
            raise ModelRunError(f"input {spec.name!r} must be {spec.dtype}, got {value.dtype}")
        # np.array, not np.ascontiguousarray: that one makes a 0-d array (a scalar input) 1-d.
        out.append(np.array(value.astype(spec.dtype), dtype=_c_dtype(spec.dtype), order="C"))
    return out


def run_model(
    model: ModelArtifact, feeds: Mapping[str, np.ndarray], runner: PoolRunner
) -> ModelRun:
    """Run `model` once with `feeds` on the runner's device, then time it there.

    Raises:
        ModelRunError: bad feeds, a device of another target, or a Run that did not succeed.
        NoDeviceError: no device could be leased.
    """
    inputs = check_feeds(model.inputs, feeds)
    device_id, tags = runner.device_tags()
    try:
        check_target(model.artifact.target, tags, f"device {device_id}")
    except TargetError as exc:
        raise ModelRunError(str(exc)) from None
    art = model.artifact
    if all(e.symbol != MODEL_ENTRY for e in art.entries):
        raise ModelRunError(f"the artifact has no {MODEL_ENTRY!r} entry: build it again")
    out = runner.run_entry(art, MODEL_ENTRY, inputs, timeout_s=runner.evaluator.timeout_s)
    if out.status is not Status.OK:
        raise ModelRunError(f"run on {device_id} failed: {out.status.value}: {out.error}")
    outputs = tuple(
        (o != 0) if s.dtype == "bool" else o
        for o, s in zip(out.outputs, model.outputs, strict=True)
    )
    latency = runner.measure_entry(art, MODEL_ENTRY)
    return ModelRun(outputs, latency, device_id)

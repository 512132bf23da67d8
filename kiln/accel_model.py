"""A quantised network on a pool's accelerator: tune its layers, run it, time it.

    with kiln.Pool(tracker, key="vta-sim", token_file="pool.secrets") as pool:
        net = int8_resnet18(image=224)
        configs = tune_layers(pool, net, trials=16, records="R.jsonl")
        run = run_network(pool, net, image, configs)
    assert np.array_equal(run.logits, reference(net, image))     # bit-exact: integer arithmetic
    print(run.accel_s + cpu_seconds(net, image, run))

The network's convolutions (and its dense head) run on a vta_sim device of the pool, one program
per layer in one artifact built for the device's spec (its `vta_spec` tag), uploaded once; each
layer's input is made on this machine (the lowering's CPU part: im2col), sent with Run, and its
output comes back for the CPU's part of the network (pooling, residual adds) in integer numpy.
The accelerator's time is its simulated cycles at the spec's clock: each layer is measured once
(a program's cycles do not depend on its data), and the result says where its cycles went
(`AccelCycles`: GEMM and per-module busy cycles).

Configs come from tuning each distinct workload through the pool (`tune_layers`), which reads
the records store first: a workload with a record under the pool's records target (its spec)
is not tuned again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.quantized.accel import LOWERING, ConvLowering, entry_symbol, network_artifact
from compiler.quantized.resnet import Int8ResNet, QConv, forward
from kiln.api import tune_op
from kiln.pool import Pool
from protos.vta import VtaSpec
from tuner.measure.result import AccelCycles, EvaluatorConfig, Status
from tuner.options import TuneOptions
from tuner.records import RecordStore, Workload, open_store

# One measurement per layer: simulated cycles are the same on every repeat.
_EVALUATOR = EvaluatorConfig(warmup=0, number=1, repeat=1, min_repeat_ms=0.0, timeout_s=120.0)


class AccelRunError(RuntimeError):
    """A layer's Run or measurement failed on the device; the message names the layer."""


@dataclass(frozen=True)
class LayerRun:
    """One layer on the accelerator: its workload, config and simulated cycles."""

    name: str
    workload: tuple[int, ...]
    config: dict[str, Any]
    cycles: AccelCycles
    seconds: float  # the cycles at the spec's clock


@dataclass(frozen=True)
class NetworkRun:
    """The network's logits from the pool, and its layers' accelerator time."""

    logits: np.ndarray
    layers: tuple[LayerRun, ...]
    outputs: dict[str, np.ndarray]  # each layer's HWC output, by layer name
    device_id: str

    @property
    def accel_s(self) -> float:
        """Simulated seconds of every layer on the accelerator, at the spec's clock."""
        return sum(layer.seconds for layer in self.layers)


def device_vta_spec(pool: Pool) -> VtaSpec:
    """The spec the pool's devices simulate (their `vta_spec` tag).

    Raises:
        ValueError: the devices are not accelerators, or the tag is not a spec key.
    """
    key = pool.device_tags.get("vta_spec")
    if key is None:
        raise ValueError(f"the pool's devices are no accelerator ({pool.describe()})")
    try:
        return VtaSpec.from_key(key)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"device tag vta_spec={key!r} is not a spec key: {exc}") from None


def tune_layers(
    pool: Pool,
    net: Int8ResNet,
    trials: int,
    records: RecordStore | str | os.PathLike[str] | None = None,
    options: TuneOptions | None = None,
    lowering: ConvLowering = LOWERING,
) -> dict[str, dict[str, Any]]:
    """The config of every conv of `net` (by layer name): the best record of its workload under
    the pool's records target, else the best of `trials` tuned on the pool (and recorded).

    Raises:
        TuningError: no candidate of a workload worked.
    """
    store = open_store(records) if isinstance(records, str | os.PathLike) else records
    try:
        best: dict[tuple[int, ...], dict[str, Any]] = {}
        for layer in net.convs():
            shape = lowering.workload(layer)
            if shape in best:
                continue
            found = None
            if store is not None:
                found = store.best(Workload(lowering.template, shape), pool.records_target)
            if found is None:
                opts = options or TuneOptions(trials=trials)
                found = tune_op(pool, lowering.template, shape, trials=trials, records=store,
                                options=opts).best  # fmt: skip
            assert found is not None  # tune raises TuningError when nothing worked
            best[shape] = dict(found.knobs)
        return {c.name: best[lowering.workload(c)] for c in net.convs()}
    finally:
        if store is not None and store is not records:
            store.close()


def run_network(
    pool: Pool,
    net: Int8ResNet,
    image: np.ndarray,
    configs: Mapping[str, Mapping[str, Any]],
    lowering: ConvLowering = LOWERING,
) -> NetworkRun:
    """Run `net` on `image` with each conv on the pool's accelerator (module docstring).

    Raises:
        AccelRunError: a layer's Run or measurement failed.
        ValueError: the pool has no accelerator, or a config cannot run its layer.
        NoDeviceError: no device could be leased.
    """
    spec = device_vta_spec(pool)
    art = network_artifact(net, configs, spec, lowering)
    outputs: dict[str, np.ndarray] = {}
    with closing(pool.runner(_EVALUATOR)) as runner:
        device_id, _ = runner.device_tags()

        def conv(layer: QConv, x: np.ndarray) -> np.ndarray:
            symbol = entry_symbol(layer)
            out = runner.run_entry(art, symbol, [lowering.entry_input(layer, x)], timeout_s=120.0)
            if out.status is not Status.OK:
                raise AccelRunError(f"layer {layer.name}: {out.status.value}: {out.error}")
            outputs[layer.name] = y = lowering.entry_output(layer, out.outputs[0])
            return y

        logits = forward(net, image, conv)
        layers = []
        for layer in net.convs():
            measured = runner.measure_entry(art, entry_symbol(layer))
            if not measured.ok or measured.accel is None:
                raise AccelRunError(
                    f"layer {layer.name}: measuring gave {measured.status.value} "
                    f"{measured.error or '(no accelerator cycles)'}"
                )
            layers.append(
                LayerRun(layer.name, lowering.workload(layer), dict(configs[layer.name]),
                         measured.accel, measured.samples_s[0])
            )  # fmt: skip
    return NetworkRun(logits, tuple(layers), outputs, device_id)


def cpu_seconds(
    net: Int8ResNet, image: np.ndarray, run: NetworkRun, lowering: ConvLowering = LOWERING,
    repeat: int = 5,
) -> float:  # fmt: skip
    """Host seconds of the network's CPU part (the lowering's input making, pooling, residual
    adds): `forward` with each conv's output taken from `run`; the fastest of `repeat`."""

    def conv(layer: QConv, x: np.ndarray) -> np.ndarray:
        lowering.entry_input(layer, x)
        return run.outputs[layer.name]

    best = float("inf")
    for _ in range(max(repeat, 1)):
        start = time.perf_counter()
        forward(net, image, conv)
        best = min(best, time.perf_counter() - start)
    return best

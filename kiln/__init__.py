"""Kiln: tune deep-learning tensor programs on a pool of remote devices.

The Python API (the `kiln` command line is built on it):

    import kiln
    with kiln.Pool() as pool:                                   # a local tracker + agent
        best = kiln.tune_op(pool, "dense", (256, 256, 256), trials=16).best
    print(best.gflops, best.knobs)

    Pool(tracker=None | "host:port", key=..., tags=..., token_file=...)   devices to tune on
    tune_op(pool, op, shape, trials=..., records=..., options=TuneOptions(...))
    tune_network(pool, "net.onnx", trials=..., records=...)   every task, one budget
    build("net.onnx", records, target=...)                    the model, best configs
    build_gpu("net.onnx", records, target="cuda/sm=90")       the model for a GPU
    run(pool, artifact_or_dir, inputs)                        outputs + latency on a device
    open_records("r.jsonl" | "redis://host:port/0")           the records store
    TuneOptions(...)                                          search, budget, check, resume

XGBoost-guided search and the on-device correctness check are on by default. Names load on
first use, so `import kiln` (and `kiln --help`) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.api import build, build_gpu, open_records, run, tune_network, tune_op
    from kiln.pool import Pool
    from tuner.options import TuneOptions

__all__ = [
    "Pool",
    "TuneOptions",
    "build",
    "build_gpu",
    "open_records",
    "run",
    "tune_network",
    "tune_op",
]

_HOMES = {
    "Pool": "kiln.pool",
    "TuneOptions": "tuner.options",
    "build": "kiln.api",
    "build_gpu": "kiln.api",
    "open_records": "kiln.api",
    "run": "kiln.api",
    "tune_network": "kiln.api",
    "tune_op": "kiln.api",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value

"""Kiln as an ONNX backend (`onnx.backend.base.Backend`), as onnxruntime and TVM provide one.

    from kiln.onnx_backend import KilnBackend
    rep = KilnBackend.prepare(model_proto)        # import + untuned build for this host
    outputs = rep.run([x])                        # on an agent of a local pool

`prepare` imports the model (`compiler.frontend.onnx.from_onnx`) and builds it with default
configs; `run` runs the build once on a device of a local pool (tracker + agent, started on first
use and shared by every prepared model of this process, closed at exit), with the correctness of
the result left to the caller, as onnx's backend tests do. An import or build that Kiln refuses
raises its error (OnnxImportError names the node, the op and the opset); a run that fails raises
ModelRunError. This is how `onnx.backend.test.BackendTest` runs onnx's node tests against Kiln
(tests/system/test_onnx_conformance.py, benchmarks/conformance.py).
"""

from __future__ import annotations

import atexit
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from kiln.pool import Pool
from tuner.measure.result import EvaluatorConfig

_LOCK = threading.Lock()
_SHARED: dict[str, Any] = {}


def _runner() -> Any:
    """The local pool's runner shared by this process's prepared models (started on first use)."""
    with _LOCK:
        if "runner" not in _SHARED:
            pool = Pool()
            pool.__enter__()
            _SHARED["pool"] = pool
            _SHARED["runner"] = pool.runner(EvaluatorConfig(repeat=1))
            atexit.register(close_shared_pool)
        return _SHARED["runner"]


def close_shared_pool() -> None:
    """Stop the shared local pool (a later run starts a new one)."""
    with _LOCK:
        runner = _SHARED.pop("runner", None)
        pool = _SHARED.pop("pool", None)
    if runner is not None:
        runner.close()
    if pool is not None:
        pool.__exit__(None, None, None)


def node_test_cases(ops: Iterable[str]) -> list[Any]:
    """onnx's generated node test cases whose model is one node of an op in `ops` (default
    domain), in onnx's order: what counts as an op's conformance here."""
    from onnx.backend.test.case import node

    wanted = set(ops)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnx's generators divide by zero on purpose
        cases = node.collect_testcases(None)
    return [
        c
        for c in cases
        if c.model is not None
        and len(c.model.graph.node) == 1
        and c.model.graph.node[0].domain in ("", "ai.onnx")
        and c.model.graph.node[0].op_type in wanted
    ]


class KilnBackendRep(BackendRep):
    """A model built by Kiln for this host, ready to run on the shared local pool."""

    def __init__(self, artifact: Any, input_names: Sequence[str]) -> None:
        self.artifact = artifact
        self.input_names = tuple(input_names)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The model's outputs for `inputs` (a list in the graph's input order, one array, or a
        dict by name).

        Raises:
            ModelRunError: bad feeds or a run that failed on the device.
        """
        from compiler.graph.build_model import MODEL_ENTRY
        from tuner.measure import Status
        from tuner.network.run import ModelRunError, check_feeds

        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feeds = dict(zip(self.input_names, values, strict=False))
        arrays = check_feeds(self.artifact.inputs, feeds)
        runner = _runner()
        result = runner.run_entry(
            self.artifact.artifact, MODEL_ENTRY, arrays, timeout_s=runner.evaluator.timeout_s
        )
        if result.status is not Status.OK:
            raise ModelRunError(f"run failed: {result.status.value}: {result.error}")
        return tuple(
            (out != 0) if spec.dtype == "bool" else out.astype(spec.dtype, copy=False)
            for out, spec in zip(result.outputs, self.artifact.outputs, strict=True)
        )


class KilnBackend(Backend):
    """onnx's backend interface over Kiln: CPU only (the host's target)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> KilnBackendRep:
        """Import and build `model` untuned for this host.

        Raises:
            OnnxImportError: the model uses what Kiln does not import.
            GraphError, CompileError: it cannot be built.
        """
        from compiler.frontend.onnx import from_onnx
        from compiler.graph.build_model import build_model

        super().prepare(model, device, **kwargs)
        graph = from_onnx(model)
        initializers = {t.name for t in model.graph.initializer}
        names = [v.name for v in model.graph.input if v.name not in initializers]
        return KilnBackendRep(build_model(graph, None, "host"), names)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Kiln's backend runs on the CPU of this host."""
        return device == "CPU"

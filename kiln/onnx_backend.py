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
import onnx.numpy_helper
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
    """A model built by Kiln for this host, ready to run on the shared local pool.

    Kiln compiles static shapes: a graph input that the model uses as a shape, axes, pads or
    bounds (Reshape's shape, ReduceSum's axes, Clip's min) must be known at build time. Such a
    model is built at run time instead, with those inputs' values bound as constants, once per
    distinct value (`bound` names them; they are found by importing until no more is missing).
    """

    _MAX_BUILDS = 16  # specializations kept per prepared model

    def __init__(
        self,
        model: onnx.ModelProto,
        input_names: Sequence[str],
        artifact: Any = None,
        bound: Iterable[str] = (),
    ) -> None:
        self.model = model
        self.input_names = tuple(input_names)
        self.artifact = artifact
        self.bound = set(bound)
        self._builds: dict[tuple[bytes, ...], tuple[Any, frozenset[str]]] = {}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The model's outputs for `inputs` (a list in the graph's input order, one array, or a
        dict by name).

        Raises:
            ModelRunError: bad feeds or a run that failed on the device.
            OnnxImportError, GraphError, CompileError: a build at run time that Kiln refuses.
        """
        from compiler.graph.build_model import MODEL_ENTRY
        from tuner.measure import Status
        from tuner.network.run import ModelRunError, check_feeds

        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feeds = dict(zip(self.input_names, values, strict=False))
        feeds = {  # onnx's in-memory node cases give some inputs as TensorProtos
            name: onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v
            for name, v in feeds.items()
        }
        artifact = self.artifact
        if artifact is None:
            artifact, bound = self._specialized(feeds)
            feeds = {name: value for name, value in feeds.items() if name not in bound}
        arrays = check_feeds(artifact.inputs, feeds)
        runner = _runner()
        result = runner.run_entry(
            artifact.artifact, MODEL_ENTRY, arrays, timeout_s=runner.evaluator.timeout_s
        )
        if result.status is not Status.OK:
            raise ModelRunError(f"run failed: {result.status.value}: {result.error}")
        return tuple(
            (out != 0) if spec.dtype == "bool" else out.astype(spec.dtype, copy=False)
            for out, spec in zip(result.outputs, artifact.outputs, strict=True)
        )

    def _specialized(self, feeds: Mapping[str, Any]) -> tuple[Any, frozenset[str]]:
        """The build for these values of the bound inputs (and the names bound)."""
        from compiler.frontend.onnx import OnnxImportError

        key = tuple(np.asarray(feeds[n]).tobytes() for n in sorted(self.bound) if n in feeds)
        if key in self._builds:
            return self._builds[key]
        bound = set(self.bound)
        while True:
            try:
                artifact = _build(_bind(self.model, {n: feeds[n] for n in bound if n in feeds}))
                break
            except OnnxImportError as error:
                name = error.needs_constant
                if name is None or name not in feeds or name in bound:
                    raise
                bound.add(name)
        self.bound = bound
        if len(self._builds) >= self._MAX_BUILDS:
            self._builds.pop(next(iter(self._builds)))
        self._builds[key] = (artifact, frozenset(bound))
        return self._builds[key]


def _bind(model: onnx.ModelProto, values: Mapping[str, Any]) -> onnx.ModelProto:
    """`model` with the graph inputs in `values` turned into initializers of those values."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    kept = [v for v in bound.graph.input if v.name not in values]
    del bound.graph.input[:]
    bound.graph.input.extend(kept)
    for name, value in values.items():
        bound.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), name))
    return bound


def _build(model: onnx.ModelProto) -> Any:
    from compiler.frontend.onnx import from_onnx
    from compiler.graph.build_model import build_model

    return build_model(from_onnx(model), None, "host")


class KilnBackend(Backend):
    """onnx's backend interface over Kiln: CPU only (the host's target)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> KilnBackendRep:
        """Import and build `model` untuned for this host (at the first run instead when a graph
        input must be known at build time; see KilnBackendRep).

        Raises:
            OnnxImportError: the model uses what Kiln does not import.
            GraphError, CompileError: it cannot be built.
        """
        from compiler.frontend.onnx import OnnxImportError

        super().prepare(model, device, **kwargs)
        initializers = {t.name for t in model.graph.initializer}
        names = [v.name for v in model.graph.input if v.name not in initializers]
        try:
            return KilnBackendRep(model, names, _build(model))
        except OnnxImportError as error:
            if error.needs_constant not in names:
                raise
            return KilnBackendRep(model, names, bound=[error.needs_constant])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Kiln's backend runs on the CPU of this host."""
        return device == "CPU"

"""A ctypes runner for built models, for tests: load the .so, allocate the workspace, call the entry.

`ModelRunner` calls the packed entry `kiln_model(args)` with the params embedded in the shared
object (what an agent runs); `packed=False` calls `kiln_model_run` with `ModelArtifact.params`.
"""

from __future__ import annotations

import ctypes
import tempfile
from collections.abc import Mapping

import numpy as np

from compiler.graph.build_model import MODEL_ENTRY, ModelArtifact

ALIGNMENT = 64


def aligned_zeros(nbytes: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """A zeroed uint8 array of `nbytes` (at least 1) whose data starts on an `alignment` boundary."""
    raw = np.zeros(max(nbytes, 1) + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + max(nbytes, 1)]


class ModelRunner:
    """Holds the loaded library, the params and a workspace; `run(feeds)` returns the outputs."""

    def __init__(self, model: ModelArtifact, packed: bool = True) -> None:
        self.model = model
        self.packed = packed
        # dlopen keeps the mapping: the file can go as soon as the library is loaded.
        with tempfile.NamedTemporaryFile(suffix=".so") as so:
            so.write(model.artifact.data)
            so.flush()
            self.lib = ctypes.CDLL(so.name)
        self.fn = self.lib[MODEL_ENTRY if packed else model.entry]
        if packed:
            self.fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        else:
            self.fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)] * 2 + [
                ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_void_p),
            ]
        self.fn.restype = ctypes.c_int32
        self.params = [np.ascontiguousarray(p) for p in model.params]
        self.workspace = aligned_zeros(model.workspace_bytes)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        inputs = []
        for spec in self.model.inputs:
            value = np.ascontiguousarray(feeds[spec.name], dtype=spec.dtype)
            if value.shape != spec.shape:
                raise ValueError(f"input {spec.name}: shape {value.shape}, expected {spec.shape}")
            inputs.append(value.astype(np.int32) if value.dtype == bool else value)
        outputs = [
            np.zeros(s.shape, np.int32 if s.dtype == "bool" else s.dtype)
            for s in self.model.outputs
        ]

        def pointers(arrays: list[np.ndarray]) -> ctypes.Array[ctypes.c_void_p]:
            return (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])

        if self.packed:
            # The packed entry aligns the workspace itself: hand it a deliberately odd address.
            scratch = np.zeros(self.model.workspace_bytes + 64, np.uint8)[1:]
            rc = self.fn(pointers([*inputs, *outputs, scratch]))
        else:
            rc = self.fn(
                pointers(inputs),
                pointers(outputs),
                ctypes.c_void_p(self.workspace.ctypes.data),
                pointers(self.params),
            )
        if rc != 0:
            raise RuntimeError(f"{self.fn.__name__} returned {rc}")
        return [
            o != 0 if s.dtype == "bool" else o
            for o, s in zip(outputs, self.model.outputs, strict=True)
        ]

"""The host CPU: shared objects loaded with ctypes in the executor child, timed by their own loop."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from device_agent import abi
from device_agent.backends.base import JobFailed, NativeBackend
from device_agent.domain import EntryPoint, EvaluatorConfig, Status
from protos import hostinfo


class CpuBackend(NativeBackend):
    """Runs SHARED_OBJECT artifacts built for this host."""

    name = "cpu"
    formats = frozenset({"SHARED_OBJECT"})

    def __init__(self) -> None:
        # An artifact is immutable (named by its hash), so a handle stays valid for the child's life.
        self._libs: dict[str, ctypes.CDLL] = {}

    def device_tags(self) -> dict[str, str]:
        """The host CPU's code-generation features and model (see hostinfo)."""
        return hostinfo.cpu_tags()

    def load(self, path: str) -> ctypes.CDLL:
        """The shared object at `path`, loaded once per child."""
        lib = self._libs.get(path)
        if lib is None:
            try:
                lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError as e:
                raise JobFailed(Status.LOAD_ERROR, f"cannot load artifact: {e}") from e
            self._libs[path] = lib
        return lib

    def call(self, module: Any, symbol: str, buffers: list[np.ndarray]) -> int:
        """`symbol(args)` once."""
        fn = _bind(abi.bind_entry, module, symbol)
        return int(fn(abi.pack_args(buffers)))

    def time(
        self, module: Any, entry: EntryPoint, buffers: list[np.ndarray], config: EvaluatorConfig
    ) -> tuple[list[float], int]:
        """The entry's native timing loop, with a flush buffer owned by this child."""
        fn = _bind(abi.bind_timing, module, entry.timing_symbol)
        repeat = max(config.repeat, 1)
        flush = (
            np.ones(config.flush_cache_bytes, dtype=np.uint8) if config.flush_cache_bytes else None
        )
        cfg = abi.TimingConfigC(
            warmup=config.warmup,
            number=max(config.number, 1),
            repeat=repeat,
            min_repeat_ms=config.min_repeat_ms,
            cooldown_ms=config.cooldown_ms,
            flush_buf=None if flush is None else flush.ctypes.data,
            flush_bytes=0 if flush is None else flush.nbytes,
        )
        samples = (ctypes.c_double * repeat)()
        number_used = ctypes.c_int32(0)
        code = fn(abi.pack_args(buffers), ctypes.byref(cfg), samples, ctypes.byref(number_used))
        if code != 0:
            raise JobFailed(Status.RUNTIME_ERROR, f"entry {entry.timing_symbol} returned {code}")
        return list(samples), int(number_used.value)


def _bind(binder: Any, module: Any, symbol: str) -> Any:
    if not symbol:
        raise JobFailed(Status.LOAD_ERROR, "the entry names no symbol")
    try:
        return binder(module, symbol)
    except AttributeError as e:
        raise JobFailed(Status.LOAD_ERROR, f"symbol {symbol} not found in artifact") from e


def create() -> CpuBackend:
    """A new cpu backend."""
    return CpuBackend()

"""ctypes mirror of the SHARED_OBJECT entry ABI fixed in `protos/common.proto` (EntryPoint).

int32_t <symbol>(void **args);
int32_t <timing_symbol>(void **args, const kiln_timing_config *cfg, double *samples_s,
                        int32_t *number_used);
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np


class TimingConfigC(ctypes.Structure):
    """`kiln_timing_config`: field order and natural C alignment as in common.proto."""

    _fields_ = [
        ("warmup", ctypes.c_int32),
        ("number", ctypes.c_int32),
        ("repeat", ctypes.c_int32),
        ("min_repeat_ms", ctypes.c_double),
        ("cooldown_ms", ctypes.c_double),
        ("flush_buf", ctypes.c_void_p),
        ("flush_bytes", ctypes.c_int64),
    ]


ArgsPointer = ctypes.POINTER(ctypes.c_void_p)
ENTRY_ARGTYPES: list[Any] = [ArgsPointer]
TIMING_ARGTYPES: list[Any] = [
    ArgsPointer,
    ctypes.POINTER(TimingConfigC),
    ctypes.POINTER(ctypes.c_double),
    ctypes.POINTER(ctypes.c_int32),
]


def bind_entry(lib: ctypes.CDLL, symbol: str) -> Any:
    """`symbol` of `lib` with the packed entry signature (AttributeError when missing)."""
    fn = lib[symbol]
    fn.argtypes = ENTRY_ARGTYPES
    fn.restype = ctypes.c_int32
    return fn


def bind_timing(lib: ctypes.CDLL, symbol: str) -> Any:
    """`symbol` of `lib` with the timing-entry signature (AttributeError when missing)."""
    fn = lib[symbol]
    fn.argtypes = TIMING_ARGTYPES
    fn.restype = ctypes.c_int32
    return fn


def pack_args(buffers: Sequence[np.ndarray]) -> ctypes.Array[ctypes.c_void_p]:
    """The `void **args` array; the caller keeps `buffers` alive across the call."""
    return (ctypes.c_void_p * max(len(buffers), 1))(*[b.ctypes.data for b in buffers])

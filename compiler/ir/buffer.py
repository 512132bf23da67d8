"""Buffers: named, typed, row-major regions of memory that loads and stores index flat."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# "vta.*": the VTA-like accelerator's on-chip buffers (input, weight, accumulator), which only
# its instruction-stream generator (compiler/codegen/vta_lower.py) places.
VTA_SCOPES = frozenset({"vta.inp", "vta.wgt", "vta.acc"})
# "wmma.*": a warp's tensor-core fragments (compiler/ops/cuda/tensorcore.py). They are opaque:
# only the WMMA tensor intrinsics read or write them, never an element load or store, and the
# CUDA renderer declares them as arrays of `nvcuda::wmma::fragment`s.
WMMA_SCOPES = frozenset({"wmma.matrix_a", "wmma.matrix_b", "wmma.accumulator"})
SCOPES = frozenset({"global", "local", "shared"}) | VTA_SCOPES | WMMA_SCOPES


@dataclass(frozen=True, eq=False)
class Buffer:
    """A dense row-major tensor in memory; `shape` is in elements.

    `scope` is where it lives: "global" (function parameters and big intermediates), "local"
    (per-thread, small: accumulators, register tiles), "shared" (a GPU block's shared memory).
    `registers`, set by register promotion (lower/promote.py) on "local" buffers only, cuts the
    buffer into register slots, (first element, lanes) each, sorted and disjoint: every access
    reads or writes one whole slot (a scalar, or a vector slice by a vectorized loop), so a
    backend may keep each slot in its own variable; empty means an ordinary array.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str = "global"
    registers: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if any(d < 1 for d in self.shape):
            raise ValueError(f"buffer {self.name}: every dimension must be >= 1, got {self.shape}")
        if self.scope not in SCOPES:
            raise ValueError(f"buffer {self.name}: scope {self.scope!r} not in {sorted(SCOPES)}")
        np.dtype(self.dtype)  # reject names numpy does not know early
        if self.registers and self.scope != "local":
            raise ValueError(f"buffer {self.name}: only local buffers live in registers")
        end = 0
        for start, lanes in self.registers:
            if lanes < 1 or start < end or start + lanes > self.size:
                raise ValueError(
                    f"buffer {self.name}: register slots {self.registers} must be sorted, "
                    f"disjoint and inside [0, {self.size})"
                )
            end = start + lanes

    def register_slot(self, element: int) -> tuple[int, int] | None:
        """The (first element, lanes) register slot holding `element`, if any."""
        for start, lanes in self.registers:
            if start <= element < start + lanes:
                return start, lanes
        return None

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements."""
        strides = [1] * len(self.shape)
        for d in range(len(self.shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * self.shape[d + 1]
        return tuple(strides)

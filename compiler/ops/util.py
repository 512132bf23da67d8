"""Helpers shared by op templates: workload checks, tile choices, float32 tensors of a layout."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# The float32 lanes of one AVX-512 register: the natural channel block and vector tile.
VECTOR_LANES = 16


def check_workload(
    name: str, shape: tuple[int, ...], fields: Sequence[str], may_be_zero: Sequence[str] = ()
) -> tuple[int, ...]:
    """`shape` if it has one int per field, positive (or >= 0 for `may_be_zero`).

    Raises:
        ValueError: naming the workload's fields, when `shape` does not fit them.
    """
    if (
        not isinstance(shape, tuple)
        or len(shape) != len(fields)
        or any(
            isinstance(d, bool) or not isinstance(d, int) or d < (0 if f in may_be_zero else 1)
            for d, f in zip(shape, fields, strict=False)
        )
    ):
        zero = f" ({', '.join(may_be_zero)} may be 0)" if may_be_zero else ""
        raise ValueError(
            f"{name} workload is ({', '.join(fields)}) of positive ints{zero}, got {shape!r}"
        )
    return shape


def tile_choices(extent: int, cap: int) -> tuple[int, ...]:
    """Powers of two and divisors of `extent`, up to min(extent, cap), ascending."""
    limit = min(extent, cap)
    powers = {1 << p for p in range(limit.bit_length()) if 1 << p <= limit}
    divisors = {d for d in range(1, limit + 1) if extent % d == 0}
    return tuple(sorted(powers | divisors))


def divisors(extent: int, cap: int | None = None) -> tuple[int, ...]:
    """Divisors of `extent` up to `cap` (default: all), ascending."""
    limit = extent if cap is None else min(extent, cap)
    return tuple(d for d in range(1, limit + 1) if extent % d == 0)


def channel_blocks(channels: int, cap: int = 4 * VECTOR_LANES) -> tuple[int, ...]:
    """Channel block sizes that divide `channels`: multiples of a vector first, then any divisor.

    A block of whole vectors keeps the innermost loop a run of full SIMD registers; channel counts
    with no such divisor (3, 24) fall back to their divisors so every shape has a layout.
    """
    whole = tuple(b for b in range(VECTOR_LANES, cap + 1, VECTOR_LANES) if channels % b == 0)
    return whole if whole else divisors(channels, cap)


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up, for positive ints."""
    return -(-a // b)


def random_array(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """float32 values in [-1, 1): sums of them stay near 1 in magnitude, so tolerances stay tight."""
    return rng.uniform(-1.0, 1.0, size=tuple(shape)).astype(np.float32)

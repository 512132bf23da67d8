"""Argument buffers made on the device from an entry's specs and a seed.

Only INPUT args draw from the generator, in spec order, so two entries with the same INPUT specs get
the same inputs from the same seed whatever their OUTPUT and WORKSPACE args are; a correctness check
relies on that.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from device_agent.domain import ArgRole, TensorSpec

# Small integers keep integer kernels (int8 GEMMs and the like) clear of overflow.
_INT_LOW, _INT_HIGH = -4, 5


# The element kinds an entry's arguments may have: bool, signed and unsigned integers, floats. No
# objects (Python pointers), strings, datetimes or structured records: a kernel takes none of them,
# and numpy cannot make some of them from bytes at all.
PLAIN_KINDS = frozenset("biuf")


def plain_dtype(name: str) -> np.dtype | None:
    """The dtype `name` names when it is a plain number or bool (PLAIN_KINDS), else None."""
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError, SyntaxError):
        return None
    return dtype if dtype.kind in PLAIN_KINDS and dtype.itemsize > 0 else None


def make_input(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """One seeded input: standard normal for floats, small integers otherwise."""
    dtype = np.dtype(spec.dtype)
    shape = tuple(spec.shape)
    if dtype.kind in "fc":
        return _c_order(rng.standard_normal(shape).astype(dtype))
    if dtype.kind == "b":
        return _c_order(rng.integers(0, 2, size=shape).astype(dtype))
    low = 0 if dtype.kind == "u" else _INT_LOW
    return _c_order(rng.integers(low, _INT_HIGH, size=shape).astype(dtype))


def _c_order(array: np.ndarray) -> np.ndarray:
    """`array` in C order, 0-d kept 0-d (np.ascontiguousarray makes a scalar 1-d)."""
    return np.asarray(array, order="C")


def make_args(
    specs: Sequence[TensorSpec], seed: int, inputs: Sequence[np.ndarray] | None = None
) -> list[np.ndarray]:
    """Buffers for every arg: INPUTs from `inputs` when given, else seeded; the rest zeroed.

    Raises:
        ValueError: `inputs` does not match the INPUT specs in number, shape or dtype.
    """
    input_specs = [s for s in specs if s.role is ArgRole.INPUT]
    if inputs is not None:
        check_inputs(input_specs, inputs)
        given = iter(inputs)
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        if spec.role is not ArgRole.INPUT:
            out.append(np.zeros(tuple(spec.shape), dtype=np.dtype(spec.dtype)))
        elif inputs is not None:
            out.append(np.array(next(given), order="C"))
        else:
            out.append(make_input(spec, rng))
    return out


def check_inputs(input_specs: Sequence[TensorSpec], inputs: Sequence[np.ndarray]) -> None:
    """Raise ValueError unless `inputs` match `input_specs` in number, shape and dtype."""
    if len(inputs) != len(input_specs):
        raise ValueError(f"expected {len(input_specs)} inputs, got {len(inputs)}")
    for spec, array in zip(input_specs, inputs, strict=True):
        if tuple(array.shape) != tuple(spec.shape) or array.dtype != np.dtype(spec.dtype):
            raise ValueError(
                f"input {spec.name!r} must be {spec.dtype}{list(spec.shape)}, "
                f"got {array.dtype}{list(array.shape)}"
            )


def outputs_of(specs: Sequence[TensorSpec], buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The OUTPUT buffers, in spec order."""
    return [b for s, b in zip(specs, buffers, strict=True) if s.role is ArgRole.OUTPUT]


def inputs_of(specs: Sequence[TensorSpec], buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The INPUT buffers, in spec order."""
    return [b for s, b in zip(specs, buffers, strict=True) if s.role is ArgRole.INPUT]

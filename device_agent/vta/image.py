"""A program's DRAM image: arguments laid out as `protos.vta_program.ArgLayout` says, and back."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from protos.vta import UOP_BYTES, encode_uop
from protos.vta_program import ArgLayout, Program


def check_args(program: Program, arrays: Sequence[np.ndarray]) -> None:
    """Raise ValueError unless `arrays` match the program's args in number, shape and dtype."""
    if len(arrays) != len(program.args):
        raise ValueError(f"the program lays out {len(program.args)} args, got {len(arrays)}")
    for layout, array in zip(program.args, arrays, strict=True):
        if tuple(array.shape) != layout.shape or array.dtype != np.dtype(layout.dtype):
            raise ValueError(
                f"arg {layout.name!r}: the program wants {layout.dtype}{list(layout.shape)}, "
                f"got {array.dtype}{list(array.shape)}"
            )


def make_image(program: Program, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """A zeroed DRAM image holding the micro-ops, the constants and `arrays` in their layouts.

    Raises:
        ValueError: the arrays do not match the program's args.
    """
    check_args(program, arrays)
    image = np.zeros(program.dram_bytes, dtype=np.uint8)
    table = b"".join(encode_uop(u) for u in program.uops)
    image[program.uop_offset_bytes : program.uop_offset_bytes + len(program.uops) * UOP_BYTES] = (
        np.frombuffer(table, dtype=np.uint8)
    )
    for offset, blob in program.constants:
        image[offset : offset + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    for layout, array in zip(program.args, arrays, strict=True):
        packed = _to_dram(layout, array)
        image[layout.offset : layout.offset + packed.nbytes] = packed.view(np.uint8).reshape(-1)
    return image


def read_back(program: Program, image: np.ndarray, arrays: Sequence[np.ndarray]) -> None:
    """Copy every arg's region of `image` back into `arrays` (in place), through its layout."""
    for layout, array in zip(program.args, arrays, strict=True):
        np.copyto(array, _from_dram(layout, image))


def _to_dram(layout: ArgLayout, array: np.ndarray) -> np.ndarray:
    dtype = np.dtype(layout.dtype).newbyteorder("<")
    padded = layout.padded_shape or layout.shape
    data = np.asarray(array, dtype=dtype)
    if padded != layout.shape:
        data = np.pad(data, [(0, p - s) for p, s in zip(padded, layout.shape, strict=True)])
    data = data.reshape(layout.view_shape or padded)
    if layout.axes:
        data = data.transpose(layout.axes)
    return np.ascontiguousarray(data)


def _from_dram(layout: ArgLayout, image: np.ndarray) -> np.ndarray:
    dtype = np.dtype(layout.dtype).newbyteorder("<")
    padded = layout.padded_shape or layout.shape
    view = layout.view_shape or padded
    stored = tuple(view[a] for a in layout.axes) if layout.axes else view
    raw = image[layout.offset : layout.offset + layout.nbytes()]
    data = raw.view(dtype).reshape(stored)
    if layout.axes:
        data = data.transpose(np.argsort(layout.axes))
    data = data.reshape(padded)
    return data[tuple(slice(0, s) for s in layout.shape)]

"""Helpers shared by the op definitions in `ops_*.py`: attribute readers, checks, broadcasting.

Every check raises `GraphError` whose message starts with the op name, so a type-rule failure
reads e.g. `conv2d: input channels 3 != weight channels 4 x groups 1`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compiler.graph.ir import GraphError, TensorType


def fail(op: str, message: str) -> GraphError:
    """A GraphError naming `op`; callers `raise fail(...)`."""
    return GraphError(f"{op}: {message}")


def expect_inputs(op: str, inputs: Sequence[TensorType], lo: int, hi: int | None = None) -> None:
    """Check that `op` got between `lo` and `hi` (default `lo`) inputs."""
    hi = lo if hi is None else hi
    if not lo <= len(inputs) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise fail(op, f"takes {want} inputs, got {len(inputs)}")


def expect_rank(op: str, what: str, t: TensorType, rank: int) -> None:
    if len(t.shape) != rank:
        raise fail(op, f"{what} must have rank {rank}, got shape {list(t.shape)}")


def expect_float(op: str, what: str, t: TensorType) -> None:
    if not np.issubdtype(np.dtype(t.dtype), np.floating):
        raise fail(op, f"{what} must be a float tensor, got {t.dtype}")


def int_tuple(op: str, attrs: Mapping[str, Any], name: str, length: int, default: int) -> tuple:
    """Attribute `name` as a tuple of `length` ints (all `default` when absent)."""
    value = attrs.get(name)
    if value is None:
        return (default,) * length
    try:
        out = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise fail(op, f"attribute {name}={value!r} must be a tuple of ints") from None
    if len(out) != length:
        raise fail(op, f"attribute {name}={value!r} must have {length} values")
    return out


def int_attr(op: str, attrs: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = attrs.get(name, default)
    if value is None:
        raise fail(op, f"attribute {name!r} is required")
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise fail(op, f"attribute {name}={value!r} must be an int")
    return int(value)


def norm_axis(op: str, axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [0, rank), accepting numpy-style negative axes."""
    if not -rank <= axis < rank:
        raise fail(op, f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def broadcast_shapes(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy (multidirectional) broadcasting of `shapes`; GraphError naming them otherwise."""
    rank = max(len(s) for s in shapes)
    out: list[int] = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            shown = " and ".join(str(list(s)) for s in shapes)
            raise fail(op, f"shapes {shown} cannot be broadcast together")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def window_out(op: str, size: int, kernel: int, stride: int, dilation: int, pad_begin: int,
               pad_end: int, ceil_mode: bool = False) -> int:  # fmt: skip
    """Output length of a sliding window over `size` padded by `pad_begin`/`pad_end`.

    With `ceil_mode`, a last window that would start inside the end padding is dropped (the ONNX
    reference and PyTorch agree on this). GraphError when no window fits.
    """
    span = dilation * (kernel - 1) + 1
    if stride < 1 or dilation < 1 or kernel < 1:
        raise fail(op, f"kernel {kernel}, stride {stride}, dilation {dilation} must be >= 1")
    room = size + pad_begin + pad_end - span
    if room < 0:
        raise fail(
            op, f"window {span} is larger than the padded input {size + pad_begin + pad_end}"
        )
    out = room // stride + 1
    if ceil_mode:
        out = -(-room // stride) + 1
        if (out - 1) * stride >= size + pad_begin:
            out -= 1
    return out


def reference_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` as `dtype` without a copy when it already is."""
    return x if x.dtype == np.dtype(dtype) else x.astype(dtype)

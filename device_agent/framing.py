"""Length-prefixed frames between the agent and its executor children.

A frame is `<u32 header length><u32 blob count>`, a UTF-8 JSON header, then each blob as `<u64
length><bytes>`. JSON rather than pickle: the child runs untrusted native code, so what it sends back
must not be able to execute anything in the agent when decoded.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from typing import Any

_HEAD = struct.Struct("<II")
_BLOB = struct.Struct("<Q")
MAX_HEADER_BYTES = 16 * 1024 * 1024
# Blobs carry whole tensors (Run inputs and outputs); bounded so a corrupt length cannot make the
# reader allocate without limit.
MAX_BLOB_BYTES = 4 * 1024 * 1024 * 1024

Frame = tuple[dict[str, Any], list[bytes]]


class FrameError(Exception):
    """A frame is malformed."""


def encode_frame(header: dict[str, Any], blobs: Sequence[bytes] = ()) -> bytes:
    """The bytes of one frame."""
    head = json.dumps(header).encode()
    parts = [_HEAD.pack(len(head), len(blobs)), head]
    for blob in blobs:
        parts += [_BLOB.pack(len(blob)), bytes(blob)]
    return b"".join(parts)


def read_frame(read_exact: Callable[[int], bytes]) -> Frame:
    """One frame, read with `read_exact(n)` (which raises EOFError at end of stream).

    Raises:
        FrameError: a length is out of bounds or the header is not a JSON object.
    """
    head_len, blob_count = _HEAD.unpack(read_exact(_HEAD.size))
    if head_len > MAX_HEADER_BYTES:
        raise FrameError(f"frame header of {head_len} bytes is too large")
    try:
        header = json.loads(read_exact(head_len))
    except ValueError as e:
        raise FrameError(f"frame header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise FrameError("frame header is not a JSON object")
    blobs = []
    for _ in range(blob_count):
        (size,) = _BLOB.unpack(read_exact(_BLOB.size))
        if size > MAX_BLOB_BYTES:
            raise FrameError(f"frame blob of {size} bytes is too large")
        blobs.append(read_exact(size))
    return header, blobs


def file_reader(stream: Any) -> Callable[[int], bytes]:
    """A blocking `read_exact` over a binary file object."""

    def read_exact(n: int) -> bytes:
        data = stream.read(n)
        if len(data) != n:
            raise EOFError(f"stream ended after {len(data)} of {n} bytes")
        return bytes(data)

    return read_exact

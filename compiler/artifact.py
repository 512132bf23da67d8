"""Artifacts as plain records: compiled bytes plus what a device needs to call and time them.

The tuner converts these to the wire's ArtifactMeta (protos/common.proto); field names match it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

ROLES = frozenset({"input", "output", "workspace"})
# accel_program: a protos.vta_program container (compiler.ops.vta_dense builds them); cubin and
# ptx: a protos.cuda_program container of that image kind (compiler.build_cuda builds cubins)
FORMATS = frozenset({"shared_object", "accel_program", "cubin", "ptx"})


@dataclass(frozen=True)
class ArgSpec:
    """One argument of an entry: `role` is "input" (filled), "output" (checked) or "workspace"."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(
                f"argument {self.name}: role {self.role!r} is not one of {sorted(ROLES)}"
            )


@dataclass(frozen=True)
class Entry:
    """A callable of an artifact; `flop` is floating-point operations per call (0 if unknown)."""

    symbol: str
    timing_symbol: str
    args: tuple[ArgSpec, ...]
    flop: float


@dataclass(frozen=True)
class Artifact:
    """Compiled bytes; `sha256` is the hex digest of `data` and the devices' cache key."""

    data: bytes
    sha256: str
    format: str
    target: str
    entries: tuple[Entry, ...]
    workspace_bytes: int = 0

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"artifact format {self.format!r} is not one of {sorted(FORMATS)}")
        if hashlib.sha256(self.data).hexdigest() != self.sha256:
            raise ValueError("artifact sha256 does not match its data")

    def entry(self, symbol: str) -> Entry:
        for e in self.entries:
            if e.symbol == symbol:
                return e
        raise KeyError(f"artifact has no entry {symbol!r}")


def manifest_source(entries: Sequence[Entry]) -> str:
    """A C definition that writes the entries' specs into the shared object's bytes.

    An artifact's sha256 (the digest of its bytes) is the devices' cache key, and an agent keeps
    the entries uploaded with the first copy of a hash. Two builds with the same code but other
    entries (a Reshape and a Transpose that both copy 24 floats; an int16 Add and a uint16 one)
    would share a key, and the second would run with the first one's shapes and dtypes. With the
    specs in the bytes, the same key means the same entries.
    """
    text = json.dumps(
        [
            [e.symbol, e.timing_symbol, [[a.name, list(a.shape), a.dtype, a.role] for a in e.args]]
            for e in entries
        ],
        separators=(",", ":"),
    )  # ASCII only: json escapes the rest, and C sees a plain string
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'__attribute__((used)) static const char kiln_manifest[] = "{escaped}";\n'

"""The CUBIN / PTX artifact: one CUDA module image and, per entry symbol, the launches it runs.

A `CudaProgram` is what one entry point runs on a GPU: a sequence of kernel launches, each with
its grid, block and dynamic shared memory, whose pointer arguments are either the entry's own
arguments (by index, in the order of the artifact's `EntryPoint.args`) or slices of one
device workspace of `workspace_bytes` that the program owns. `constants` are bytes written into
the workspace once, when the artifact is loaded (a model's weights), before any launch. One
kernel candidate is a program of one launch over its entry's args; a whole model is a program of
many launches over a planned workspace.

Timing an entry times its whole launch sequence (the `cuda` backend, with CUDA events); its
`EntryPoint.timing_symbol` is the entry's own symbol.

Container, version 1:

    b"KCUD"  u32 header length  header (UTF-8 JSON)  image (the rest: cubin or PTX bytes)

    header = {"version": 1, "arch": "sm_90", "image": "cubin" | "ptx",
              "programs": {symbol: {"workspace_bytes": n,
                                    "constants": [[offset, length], ...],
                                    "launches": [{"kernel": name, "grid": [x, y, z],
                                                  "block": [x, y, z], "shared_bytes": n,
                                                  "args": [["arg", index] | ["ws", offset, nbytes]]}]}}}

The constants' bytes follow the header, in order, before the image. Imports only the standard
library, like `protos.vta_program`: the compiler writes these and the agent reads them.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAGIC = b"KCUD"
VERSION = 1
IMAGE_KINDS = ("cubin", "ptx")
# Bounds a decoder enforces before allocating: a garbage header must not ask for gigabytes.
MAX_HEADER_BYTES = 16 << 20
MAX_WORKSPACE_BYTES = 1 << 36
MAX_LAUNCHES = 100_000
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
_ARCH = re.compile(r"sm_[0-9]{2,3}[a-z]?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


class ProgramError(ValueError):
    """Bytes that are not a well-formed CUDA container, or an inconsistent program."""


@dataclass(frozen=True)
class LaunchArg:
    """One pointer argument of a launch: entry argument `index` ("arg"), or `nbytes` of the
    workspace at `offset` ("ws")."""

    kind: str
    index: int = 0
    offset: int = 0
    nbytes: int = 0

    @staticmethod
    def entry(index: int) -> LaunchArg:
        return LaunchArg("arg", index=index)

    @staticmethod
    def workspace(offset: int, nbytes: int) -> LaunchArg:
        return LaunchArg("ws", offset=offset, nbytes=nbytes)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: `kernel` (a symbol of the image) on `grid` blocks of `block` threads."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[LaunchArg, ...]
    shared_bytes: int = 0


@dataclass(frozen=True)
class CudaProgram:
    """What one entry runs: `launches` in order over its args and its workspace."""

    launches: tuple[Launch, ...]
    workspace_bytes: int = 0
    constants: tuple[tuple[int, bytes], ...] = ()

    def check(self, n_args: int | None = None) -> None:
        """Raise ProgramError unless every launch is well formed and every workspace slice and
        constant lies inside the workspace (and, given `n_args`, every entry index < n_args)."""
        if not 0 <= self.workspace_bytes <= MAX_WORKSPACE_BYTES:
            raise ProgramError(f"workspace_bytes must be 0..{MAX_WORKSPACE_BYTES}")
        if not 1 <= len(self.launches) <= MAX_LAUNCHES:
            raise ProgramError(
                f"a program has 1..{MAX_LAUNCHES} launches, not {len(self.launches)}"
            )
        for i, (offset, data) in enumerate(self.constants):
            _inside(f"constant {i}", offset, len(data), self.workspace_bytes)
        for n, launch in enumerate(self.launches):
            where = f"launch {n} ({launch.kernel})"
            if not _NAME.fullmatch(launch.kernel):
                raise ProgramError(f"{where}: kernel name is not a C identifier")
            if len(launch.grid) != 3 or len(launch.block) != 3:
                raise ProgramError(f"{where}: grid and block have three dimensions")
            threads = 1
            for axis, (g, b, gmax) in enumerate(
                zip(launch.grid, launch.block, MAX_GRID, strict=True)
            ):
                if not 1 <= g <= gmax:
                    raise ProgramError(f"{where}: grid[{axis}]={g} is outside 1..{gmax}")
                if not 1 <= b <= MAX_THREADS_PER_BLOCK:
                    raise ProgramError(f"{where}: block[{axis}]={b} is outside 1..1024")
                threads *= b
            if threads > MAX_THREADS_PER_BLOCK:
                raise ProgramError(f"{where}: {threads} threads a block, more than 1024")
            if launch.shared_bytes < 0:
                raise ProgramError(f"{where}: negative shared_bytes")
            for a in launch.args:
                if a.kind == "arg":
                    if a.index < 0 or (n_args is not None and a.index >= n_args):
                        raise ProgramError(f"{where}: entry argument {a.index} does not exist")
                elif a.kind == "ws":
                    _inside(f"{where}: workspace slice", a.offset, a.nbytes, self.workspace_bytes)
                else:
                    raise ProgramError(f"{where}: argument kind {a.kind!r} is not arg or ws")


@dataclass(frozen=True)
class CudaModule:
    """A module image for `arch` ("sm_90") and the programs of its entries (symbol -> program)."""

    arch: str
    image_kind: str
    image: bytes
    programs: Mapping[str, CudaProgram]

    @property
    def sm(self) -> int:
        """The compute capability as a number: 90 for sm_90."""
        return int(re.sub(r"[a-z]$", "", self.arch[3:]))


def encode_module(module: CudaModule) -> bytes:
    """The artifact bytes of `module`.

    Raises:
        ProgramError: a bad arch or image kind, no programs, or a program fails `check`.
    """
    _check_module_head(module.arch, module.image_kind, len(module.programs))
    programs: dict[str, Any] = {}
    blobs: list[bytes] = []
    for symbol, program in module.programs.items():
        if not _NAME.fullmatch(symbol):
            raise ProgramError(f"entry symbol {symbol!r} is not a C identifier")
        program.check()
        programs[symbol] = {
            "workspace_bytes": program.workspace_bytes,
            "constants": [[offset, len(data)] for offset, data in program.constants],
            "launches": [
                {
                    "kernel": launch.kernel,
                    "grid": list(launch.grid),
                    "block": list(launch.block),
                    "shared_bytes": launch.shared_bytes,
                    "args": [
                        ["arg", a.index] if a.kind == "arg" else ["ws", a.offset, a.nbytes]
                        for a in launch.args
                    ],
                }
                for launch in program.launches
            ],
        }
        blobs += [data for _, data in program.constants]
    header = json.dumps(
        {"version": VERSION, "arch": module.arch, "image": module.image_kind, "programs": programs},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *blobs, module.image])


def is_cuda_module(data: bytes) -> bool:
    """Whether `data` starts like a CUDA container."""
    return data[:4] == MAGIC


def decode_module(data: bytes) -> CudaModule:
    """The module in `data`.

    Raises:
        ProgramError: `data` is not a well-formed version-1 container (the message says where).
    """
    if data[:4] != MAGIC:
        raise ProgramError("not a CUDA artifact (bad magic)")
    if len(data) < 8:
        raise ProgramError("truncated header length")
    (length,) = struct.unpack_from("<I", data, 4)
    if length > MAX_HEADER_BYTES or 8 + length > len(data):
        raise ProgramError(f"header of {length} bytes does not fit the artifact")
    try:
        head = json.loads(data[8 : 8 + length].decode())
        if not isinstance(head, dict):
            raise ProgramError("the header is not a JSON object")
        if head.get("version") != VERSION:
            raise ProgramError(f"unsupported container version {head.get('version')!r}")
        arch, kind, raw = head["arch"], head["image"], head["programs"]
        if not isinstance(raw, dict):
            raise ProgramError("programs is not an object")
        _check_module_head(arch, kind, len(raw))
        pos = 8 + length
        programs: dict[str, CudaProgram] = {}
        for symbol, p in raw.items():
            constants = []
            for offset, size in p["constants"]:
                if not (isinstance(size, int) and 0 <= size <= len(data) - pos):
                    raise ProgramError(f"program {symbol}: constant runs past the artifact")
                constants.append((int(offset), data[pos : pos + size]))
                pos += size
            program = CudaProgram(
                launches=tuple(_launch(x) for x in p["launches"]),
                workspace_bytes=int(p["workspace_bytes"]),
                constants=tuple(constants),
            )
            program.check()
            programs[str(symbol)] = program
    except ProgramError:
        raise
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ProgramError(f"malformed header: {type(e).__name__}: {e}") from None
    image = data[pos:]
    if not image:
        raise ProgramError("no module image")
    return CudaModule(arch, kind, image, programs)


def _launch(x: Mapping[str, Any]) -> Launch:
    args = []
    for a in x["args"]:
        if a[0] == "arg" and len(a) == 2:
            args.append(LaunchArg.entry(int(a[1])))
        elif a[0] == "ws" and len(a) == 3:
            args.append(LaunchArg.workspace(int(a[1]), int(a[2])))
        else:
            raise ProgramError(f"launch argument {a!r} is not [arg, i] or [ws, offset, nbytes]")
    grid, block = x["grid"], x["block"]
    if len(grid) != 3 or len(block) != 3:
        raise ProgramError("grid and block have three dimensions")
    return Launch(
        kernel=str(x["kernel"]),
        grid=(int(grid[0]), int(grid[1]), int(grid[2])),
        block=(int(block[0]), int(block[1]), int(block[2])),
        args=tuple(args),
        shared_bytes=int(x.get("shared_bytes", 0)),
    )


def _check_module_head(arch: object, kind: object, n_programs: int) -> None:
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise ProgramError(f"arch {arch!r} is not like sm_90")
    if kind not in IMAGE_KINDS:
        raise ProgramError(f"image kind {kind!r} is not one of {IMAGE_KINDS}")
    if n_programs < 1:
        raise ProgramError("a module has at least one program")


def _inside(what: str, offset: int, size: int, limit: int) -> None:
    if offset < 0 or size < 0 or offset + size > limit:
        raise ProgramError(
            f"{what} [{offset}, {offset + size}) lies outside the workspace of {limit}"
        )

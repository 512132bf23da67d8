"""The ACCEL_PROGRAM artifact: named accelerator programs with their DRAM layout, as bytes.

A `Program` is what one entry point runs: the spec it was compiled for, its instructions and
micro-ops (`protos.vta`), and the DRAM image they work on: its size, where the micro-op table and
constant blobs (weights baked in by a compiler) sit, and where each argument of the entry sits.
An argument's `ArgLayout` says how its array becomes DRAM bytes, so that a program can keep data
blocked the accelerator's way while its entry takes plain arrays (the ones a reference takes):

    dram[offset : offset + nbytes] = C-order bytes of
        zero-pad(arg, at the end of each axis, to padded_shape).reshape(view_shape).transpose(axes)

Empty `padded_shape`, `view_shape`, `axes` mean the arg's shape, the padded shape, identity. After
the run every argument is read back through the inverse (what a STORE wrote into it lands there).

Container (little endian), version 1:

    b"KVTA"  u16 version  u16 program count
    per program:
        str name  13 x u32 spec (VtaSpec field order)  u64 dram_bytes  u64 uop_offset_bytes
        u32 instruction count  u32 micro-op count  u16 arg count  u16 constant count
        per arg:       str name  str dtype  dims shape  u64 offset  dims padded  dims view  dims axes
        per constant:  u64 offset  u64 length  bytes
        instructions (16 bytes each), micro-ops (4 bytes each)
    str = u16 length + UTF-8; dims = u8 count + that many u64

Imports only the standard library, like `protos.vta`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, fields

from protos.vta import (
    INSN_BYTES,
    UOP_BYTES,
    Insn,
    Uop,
    VtaSpec,
    decode_insn,
    decode_uop,
    encode_insn,
    encode_uop,
)

MAGIC = b"KVTA"
VERSION = 1
# Bounds a decoder enforces before allocating: a garbage header must not ask for gigabytes.
MAX_DRAM_BYTES = 1 << 32
MAX_NAME_BYTES = 256
MAX_DIMS = 16
_SPEC_FIELDS = len(fields(VtaSpec))


class ProgramError(ValueError):
    """Bytes that are not a well-formed ACCEL_PROGRAM container, or an inconsistent program."""


@dataclass(frozen=True)
class ArgLayout:
    """Where and how an entry's argument lives in DRAM (see the module docstring)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    padded_shape: tuple[int, ...] = ()
    view_shape: tuple[int, ...] = ()
    axes: tuple[int, ...] = ()

    def nbytes(self) -> int:
        """Bytes the argument takes in DRAM (its padded size)."""
        return math.prod(self.padded_shape or self.shape) * _itemsize(self.dtype)


@dataclass(frozen=True)
class Program:
    """One entry's accelerator program and its DRAM image."""

    spec: VtaSpec
    insns: tuple[Insn, ...]
    uops: tuple[Uop, ...]
    dram_bytes: int
    uop_offset_bytes: int
    args: tuple[ArgLayout, ...]
    constants: tuple[tuple[int, bytes], ...] = ()

    def check(self) -> None:
        """Raise ProgramError unless every region lies inside DRAM and each layout is coherent.

        (What the instructions do with them is the simulator's to judge.)
        """
        if not 0 < self.dram_bytes <= MAX_DRAM_BYTES:
            raise ProgramError(f"dram_bytes must be 1..{MAX_DRAM_BYTES}, got {self.dram_bytes}")
        regions = [("micro-ops", self.uop_offset_bytes, len(self.uops) * UOP_BYTES)]
        regions += [(f"constant {i}", o, len(b)) for i, (o, b) in enumerate(self.constants)]
        for arg in self.args:
            _check_layout(arg)
            regions.append((f"arg {arg.name!r}", arg.offset, arg.nbytes()))
        for what, offset, size in regions:
            if offset < 0 or offset + size > self.dram_bytes:
                raise ProgramError(
                    f"{what} at [{offset}, {offset + size}) lies outside DRAM of "
                    f"{self.dram_bytes} bytes"
                )


def encode_programs(programs: Mapping[str, Program]) -> bytes:
    """The artifact bytes of `programs` (entry symbol -> program).

    Raises:
        ProgramError: a program fails `Program.check`.
        ValueError: an instruction or micro-op field does not fit its bits.
    """
    out = [MAGIC, struct.pack("<HH", VERSION, len(programs))]
    for name, program in programs.items():
        program.check()
        out += [
            _str(name),
            struct.pack(f"<{_SPEC_FIELDS}I", *program.spec.values()),
            struct.pack("<QQIIHH", program.dram_bytes, program.uop_offset_bytes,
                        len(program.insns), len(program.uops), len(program.args),
                        len(program.constants)),
        ]  # fmt: skip
        for arg in program.args:
            out += [
                _str(arg.name),
                _str(arg.dtype),
                _dims(arg.shape),
                struct.pack("<Q", arg.offset),
            ]
            out += [_dims(arg.padded_shape), _dims(arg.view_shape), _dims(arg.axes)]
        for offset, blob in program.constants:
            out += [struct.pack("<QQ", offset, len(blob)), blob]
        out += [encode_insn(i) for i in program.insns]
        out += [encode_uop(u) for u in program.uops]
    return b"".join(out)


def decode_programs(data: bytes) -> dict[str, Program]:
    """The programs in artifact bytes, by entry symbol.

    Raises:
        ProgramError: not a container of this version, truncated, or inconsistent.
    """
    reader = _Reader(data)
    if reader.take(4) != MAGIC:
        raise ProgramError("not an accelerator program (bad magic)")
    version, count = reader.unpack("<HH")
    if version != VERSION:
        raise ProgramError(f"container version {version}; this agent reads {VERSION}")
    programs: dict[str, Program] = {}
    for _ in range(count):
        name = reader.str()
        try:
            spec = VtaSpec(*reader.unpack(f"<{_SPEC_FIELDS}I"))
        except ValueError as e:
            raise ProgramError(f"program {name!r}: {e}") from None
        dram_bytes, uop_offset, n_insns, n_uops, n_args, n_consts = reader.unpack("<QQIIHH")
        args = []
        for _ in range(n_args):
            arg_name, dtype, shape = reader.str(), reader.str(), reader.dims()
            (offset,) = reader.unpack("<Q")
            args.append(
                ArgLayout(
                    arg_name, shape, dtype, offset, reader.dims(), reader.dims(), reader.dims()
                )
            )
        constants = []
        for _ in range(n_consts):
            offset, length = reader.unpack("<QQ")
            constants.append((offset, reader.take(length)))
        code = reader.take(n_insns * INSN_BYTES)
        table = reader.take(n_uops * UOP_BYTES)
        try:
            insns = tuple(decode_insn(code[i : i + INSN_BYTES]) for i in range(0, len(code), 16))
        except ValueError as e:
            raise ProgramError(f"program {name!r}: {e}") from None
        uops = tuple(decode_uop(table[i : i + UOP_BYTES]) for i in range(0, len(table), 4))
        program = Program(spec, insns, uops, dram_bytes, uop_offset, tuple(args), tuple(constants))
        program.check()
        programs[name] = program
    if reader.left():
        raise ProgramError(f"{reader.left()} bytes after the last program")
    return programs


def _itemsize(dtype: str) -> int:
    sizes = {"int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4}
    sizes |= {"float32": 4, "int64": 8, "float64": 8}
    if dtype not in sizes:
        raise ProgramError(f"dtype {dtype!r} is not one an accelerator program lays out")
    return sizes[dtype]


def _check_layout(arg: ArgLayout) -> None:
    _itemsize(arg.dtype)
    padded = arg.padded_shape or arg.shape
    view = arg.view_shape or padded
    if len(padded) != len(arg.shape) or any(p < s for p, s in zip(padded, arg.shape, strict=True)):
        raise ProgramError(f"arg {arg.name!r}: padded shape {padded} smaller than {arg.shape}")
    if math.prod(view) != math.prod(padded):
        raise ProgramError(f"arg {arg.name!r}: view {view} does not hold padded shape {padded}")
    if arg.axes and sorted(arg.axes) != list(range(len(view))):
        raise ProgramError(f"arg {arg.name!r}: axes {arg.axes} are no permutation of the view")


def _str(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > MAX_NAME_BYTES:
        raise ProgramError(f"name longer than {MAX_NAME_BYTES} bytes: {text[:40]!r}...")
    return struct.pack("<H", len(raw)) + raw


def _dims(dims: tuple[int, ...]) -> bytes:
    if len(dims) > MAX_DIMS or any(d < 0 for d in dims):
        raise ProgramError(f"dims {dims}: at most {MAX_DIMS}, none negative")
    return struct.pack(f"<B{len(dims)}Q", len(dims), *dims)


class _Reader:
    """Bounded reads from bytes: past the end is a ProgramError, never an IndexError."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._at = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self._at + n > len(self._data):
            raise ProgramError(f"truncated: wanted {n} bytes at {self._at} of {len(self._data)}")
        out = bytes(self._data[self._at : self._at + n])
        self._at += n
        return out

    def unpack(self, fmt: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def str(self) -> str:
        (length,) = self.unpack("<H")
        if length > MAX_NAME_BYTES:
            raise ProgramError(f"a name of {length} bytes (at most {MAX_NAME_BYTES})")
        try:
            return self.take(length).decode()
        except UnicodeDecodeError:
            raise ProgramError("a name that is not UTF-8") from None

    def dims(self) -> tuple[int, ...]:
        (count,) = self.unpack("<B")
        if count > MAX_DIMS:
            raise ProgramError(f"{count} dims (at most {MAX_DIMS})")
        return tuple(self.unpack(f"<{count}Q"))

    def left(self) -> int:
        return len(self._data) - self._at

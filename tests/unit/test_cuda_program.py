"""The CUBIN/PTX container (`protos.cuda_program`): round trips, and what a decoder refuses."""

from __future__ import annotations

import re
import struct

import pytest

from protos.cuda_program import (
    MAGIC,
    CudaModule,
    CudaProgram,
    Launch,
    LaunchArg,
    ProgramError,
    decode_module,
    encode_module,
    is_cuda_module,
)


def _module(**program_fields: object) -> CudaModule:
    fields: dict[str, object] = {
        "launches": (
            Launch("k0", (4, 2, 1), (128, 1, 1), (LaunchArg.entry(0), LaunchArg.workspace(64, 32))),
            Launch(
                "k1", (1, 1, 1), (32, 4, 1), (LaunchArg.workspace(0, 64), LaunchArg.entry(1)), 512
            ),
        ),
        "workspace_bytes": 96,
        "constants": ((0, b"\x01\x02\x03\x04"), (64, b"w" * 8)),
    }
    fields.update(program_fields)
    return CudaModule("sm_90", "cubin", b"\x7fELF-image", {"net": CudaProgram(**fields)})  # type: ignore[arg-type]


def test_a_module_round_trips() -> None:
    m = _module()
    data = encode_module(m)
    assert is_cuda_module(data) and data.endswith(m.image)
    back = decode_module(data)
    assert back == m
    assert back.sm == 90


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"workspace_bytes": 16}, "outside the workspace"),
        ({"launches": ()}, "launches"),
        ({"launches": (Launch("k", (1, 1, 1), (1024, 2, 1), ()),)}, "2048 threads"),
        ({"launches": (Launch("k", (0, 1, 1), (1, 1, 1), ()),)}, re.escape("grid[0]=0")),
        ({"launches": (Launch("k;rm", (1, 1, 1), (1, 1, 1), ()),)}, "C identifier"),
        ({"launches": (Launch("k", (1, 1, 1), (1, 1, 1), (LaunchArg("gpu"),)),)}, "kind"),
    ],
)
def test_an_inconsistent_program_is_refused_when_encoded(bad: dict, message: str) -> None:
    with pytest.raises(ProgramError, match=message):
        encode_module(_module(**bad))


def test_check_names_an_entry_argument_past_the_entry() -> None:
    program = _module().programs["net"]
    program.check(n_args=2)
    with pytest.raises(ProgramError, match="entry argument 1 does not exist"):
        program.check(n_args=1)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"ELF\x00", "bad magic"),
        (MAGIC + b"\x01", "truncated"),
        (MAGIC + struct.pack("<I", 1 << 30), "does not fit"),
        (MAGIC + struct.pack("<I", 3) + b"{x}", "malformed header"),
        (MAGIC + struct.pack("<I", 2) + b"[]", "not a JSON object"),
        (MAGIC + struct.pack("<I", 13) + b'{"version":2}', "version 2"),
    ],
)
def test_garbage_is_a_program_error(data: bytes, message: str) -> None:
    with pytest.raises(ProgramError, match=message):
        decode_module(data)


def test_a_truncated_artifact_is_refused() -> None:
    data = encode_module(_module())
    image_at = len(data) - len(b"\x7fELF-image")
    with pytest.raises(ProgramError, match="no module image"):
        decode_module(data[:image_at])
    with pytest.raises(ProgramError):
        decode_module(data[: image_at - 5])  # a constant cut short

"""What this host's CPU offers code generation, read from /proc/cpuinfo, as device tags.

    cpu_tags()  ->  {"features": "avx,avx2,avx512f,fma,sse4_2", "cpu": "AMD EPYC 9654 96-Core ..."}

`features` is the sorted subset of the CPU's ISA flags that decides which compile target its code
may use (x86_64-avx512 needs avx512f, x86_64-avx2 needs avx2 and fma, aarch64-neon needs neon), so
a workstation can pick the target from ListDevices without logging in to the board. Names are the
kernel's spellings (`avx512_vnni`, `asimddp`), except that the arm64 kernel's `asimd` is reported
as `neon`, the name 32-bit arm kernels and our aarch64 target use. `cpu` is the model name (the first
"model name", "Model" or "Hardware" line, whitespace collapsed), bounded in length; where the kernel prints none of these (arm64 servers),
the CPU part number names the core instead. A host without /proc/cpuinfo (not Linux) gets no tags.

It lives in protos because both sides of the tag contract read it: the agent tags its devices
with `cpu_tags()`, and a workstation compares a device's `cpu` tag with its own to tell a device
of its own kind (tuner.measure.device_target).
"""

from __future__ import annotations

import dataclasses
import logging

_LOG = logging.getLogger(__name__)

CPUINFO_PATH = "/proc/cpuinfo"
# A model name is ~50 characters; the cap keeps a strange one from bloating every registration.
MAX_CPU_CHARS = 128

# ISA extensions that change what generated code may use, as the kernel spells them.
CODEGEN_FEATURES = frozenset(
    {
        # x86: the x86-64-v2/v3/v4 levels and the dot-product / low-precision / matrix extensions
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi2",
        "avx512f",
        "avx512bw",
        "avx512cd",
        "avx512dq",
        "avx512vl",
        "avx512ifma",
        "avx512vbmi",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "avx_vnni",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
        # arm: SIMD (neon); LSE atomics and rdm (armv8.1, which our aarch64-neon target's
        # -march=armv8.2-a assumes); half precision, dot products, int8 / bf16 matrix, SVE / SME
        "neon",
        "atomics",
        "asimdrdm",
        "asimdhp",
        "asimddp",
        "asimdfhm",
        "i8mm",
        "bf16",
        "sve",
        "sve2",
        "sme",
    }
)
# The arm64 kernel's names for features that the rest of Kiln calls otherwise.
_RENAMED = {"asimd": "neon"}

# arm64 kernels print "CPU implementer" and "CPU part" but often no model name.
_ARM_PARTS = {
    ("0x41", "0xd03"): "ARM Cortex-A53",
    ("0x41", "0xd04"): "ARM Cortex-A35",
    ("0x41", "0xd05"): "ARM Cortex-A55",
    ("0x41", "0xd07"): "ARM Cortex-A57",
    ("0x41", "0xd08"): "ARM Cortex-A72",
    ("0x41", "0xd09"): "ARM Cortex-A73",
    ("0x41", "0xd0a"): "ARM Cortex-A75",
    ("0x41", "0xd0b"): "ARM Cortex-A76",
    ("0x41", "0xd0c"): "ARM Neoverse-N1",
    ("0x41", "0xd0d"): "ARM Cortex-A77",
    ("0x41", "0xd40"): "ARM Neoverse-V1",
    ("0x41", "0xd41"): "ARM Cortex-A78",
    ("0x41", "0xd46"): "ARM Cortex-A510",
    ("0x41", "0xd47"): "ARM Cortex-A710",
    ("0x41", "0xd49"): "ARM Neoverse-N2",
    ("0x41", "0xd4f"): "ARM Neoverse-V2",
    ("0x61", "0x022"): "Apple M1 Icestorm",
    ("0x61", "0x023"): "Apple M1 Firestorm",
}


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    """The first processor's entry of /proc/cpuinfo, as far as code generation cares."""

    model: str
    """Model name, trimmed; "" when the kernel names none and the part is unknown."""
    flags: frozenset[str]
    """Every ISA flag the kernel lists ("flags" on x86, "Features" on arm)."""
    has_flags: bool = True
    """False when no flags line was found (the features are then unknown, not empty)."""


def parse_cpuinfo(text: str) -> CpuInfo:
    """The model and ISA flags in a /proc/cpuinfo text (the first processor's; all CPUs of a
    machine are taken to be alike)."""
    fields: dict[str, str] = {}
    model = ""
    for line in text.splitlines():
        name, colon, value = line.partition(":")
        if not colon:
            continue
        fields.setdefault(name.strip().lower(), value.strip())
        if not model and name.strip() in ("model name", "Model", "Hardware"):
            model = " ".join(value.split())
    flag_line = fields.get("flags", fields.get("features"))
    if not model:
        part = (fields.get("cpu implementer", "").lower(), fields.get("cpu part", "").lower())
        model = _ARM_PARTS.get(part, "")
        if not model and all(part):
            model = f"arm implementer {part[0]} part {part[1]}"
    return CpuInfo(
        model[:MAX_CPU_CHARS], frozenset((flag_line or "").split()), flag_line is not None
    )


def codegen_features(flags: frozenset[str]) -> list[str]:
    """The sorted subset of `flags` that matters for code generation, in Kiln's names."""
    named = {_RENAMED.get(flag, flag) for flag in flags}
    return sorted(named & CODEGEN_FEATURES)


def cpu_tags(text: str | None = None) -> dict[str, str]:
    """Device tags `features` and `cpu` of this host (or of the cpuinfo `text` given).

    A tag is left out when cpuinfo cannot be read or does not say.
    """
    if text is None:
        try:
            with open(CPUINFO_PATH, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as error:
            _LOG.info("no CPU features in the device tags: %s", error)
            return {}
    info = parse_cpuinfo(text)
    tags: dict[str, str] = {}
    if info.has_flags:
        tags["features"] = ",".join(codegen_features(info.flags))
    if info.model:
        tags["cpu"] = info.model
    return tags

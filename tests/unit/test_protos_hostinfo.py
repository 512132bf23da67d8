"""hostinfo: the features and cpu device tags read from sample /proc/cpuinfo texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from device_agent.backends import get_backend
from protos import hostinfo
from tracker import validation
from tracker.model import DeviceSpec

# Two processors of a Sapphire Rapids server (trimmed to the lines that matter, flags in full).
X86_AVX512 = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush \
mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon rep_good nopl \
xtopology cpuid pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave \
avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch fsgsbase bmi1 hle avx2 smep bmi2 erms \
invpcid rtm avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni \
avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd arat avx512vbmi \
umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg \
avx512_vpopcntdq rdpid cldemote movdiri movdir64b serialize amx_bf16 avx512_fp16 amx_tile \
amx_int8 arch_capabilities
bogomips\t: 4000.00

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx2 avx512f
"""

# A desktop without AVX-512; the model name has the padding some kernels print.
X86_AVX2 = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Core(TM)   i7-8700 CPU @ 3.20GHz
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts \
acpi mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc pni pclmulqdq \
ssse3 sdbg fma cx16 xtpr pdcm pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand \
lahf_lm abm 3dnowprefetch fsgsbase bmi1 avx2 smep bmi2 erms invpcid mpx rdseed adx smap \
clflushopt intel_pt xsaveopt xsavec xgetbv1 xsaves
"""

# An arm64 server (Neoverse-N1): no model name, features under "Features".
AARCH64 = """\
processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

processor\t: 1
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU part\t: 0xd0c
"""

# A Raspberry Pi 4 on a 64-bit kernel: board lines after the processors.
RASPBERRY_PI_4 = """\
processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU part\t: 0xd08

Hardware\t: BCM2835
Revision\t: c03114
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
"""


@pytest.mark.parametrize(
    ("text", "features", "cpu"),
    [
        (
            X86_AVX512,
            "amx_bf16,amx_int8,amx_tile,avx,avx2,avx512_bf16,avx512_fp16,avx512_vnni,avx512bw,"
            "avx512cd,avx512dq,avx512f,avx512ifma,avx512vbmi,avx512vl,avx_vnni,bmi2,f16c,fma,"
            "sse4_2",
            "Intel(R) Xeon(R) Platinum 8480+",
        ),
        (
            X86_AVX2,
            "avx,avx2,bmi2,f16c,fma,sse4_2",
            "Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz",
        ),
        (AARCH64, "asimddp,asimdhp,asimdrdm,atomics,neon", "ARM Neoverse-N1"),
        (RASPBERRY_PI_4, "neon", "BCM2835"),
    ],
)
def test_cpu_tags_of_sample_cpuinfo(text: str, features: str, cpu: str) -> None:
    tags = hostinfo.cpu_tags(text)
    assert tags == {"features": features, "cpu": cpu}
    # What an agent registers, the tracker accepts.
    validation.registration("a", "h:1", [DeviceSpec("", "k", {"arch": "x", **tags})])


def test_unknown_arm_part_and_missing_lines() -> None:
    text = "processor\t: 0\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x51\nCPU part\t: 0x001\n"
    assert hostinfo.cpu_tags(text) == {
        "features": "neon,sve",
        "cpu": "arm implementer 0x51 part 0x001",
    }
    assert hostinfo.cpu_tags("processor\t: 0\nmodel name\t: Odd CPU\n") == {"cpu": "Odd CPU"}
    assert hostinfo.cpu_tags("processor\t: 0\nflags\t\t: fpu sse sse2\n") == {"features": ""}
    assert hostinfo.cpu_tags("") == {}


def test_a_long_model_name_is_bounded() -> None:
    tags = hostinfo.cpu_tags("model name\t: " + "x" * 1000 + "\nflags\t: avx2\n")
    assert len(tags["cpu"]) == hostinfo.MAX_CPU_CHARS


def test_no_cpuinfo_means_no_tags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(hostinfo, "CPUINFO_PATH", str(tmp_path / "missing"))
    assert hostinfo.cpu_tags() == {}


def test_backends_tag_what_picks_the_compile_target() -> None:
    assert get_backend("null").device_tags() == {}
    assert get_backend("qemu").device_tags() == {
        "arch": "aarch64",
        "features": "neon",
        "emulated": "qemu-user",
    }
    assert get_backend("cpu").device_tags() == hostinfo.cpu_tags()

"""C toolchains: targets, compiling generated C into shared objects, and a content-hash build cache.

The cache key is the sha256 of the source, the compiler's identity (path and version line) and
the flags, so any change to one of them rebuilds; entries are written to a temporary name in the
cache directory and renamed into place, so concurrent builders never see a half-written file.
The directory is $KILN_CACHE_DIR, else ~/.cache/kiln/build.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from compiler.errors import BuildError

_LOG = logging.getLogger(__name__)

CACHE_ENV = "KILN_CACHE_DIR"
COMPILE_TIMEOUT_S = 300.0
# No -ffast-math: a kernel must not reassociate its sums away from the reference's. Contraction
# into FMA is allowed (ISO C mode turns it off): one rounding fewer per multiply-add, and the
# difference from numpy stays far inside the checks' tolerances.
_COMMON_FLAGS = ("-O3", "-fPIC", "-shared", "-std=c11", "-fno-math-errno", "-ffp-contract=fast")


@dataclass(frozen=True)
class Target:
    """What code is built for and how.

    `name` is what artifacts and devices call it ("x86_64-avx512"); `arch` is the machine
    (platform.machine() spelling) the code runs on; `compiler` is the executable that builds it.
    """

    name: str
    arch: str
    compiler: str
    flags: tuple[str, ...]


# Named targets build portable code for any CPU of their class; "host" (see host_target) builds
# for exactly this machine with -march=native. Cross compilers (aarch64-linux-gnu-gcc) and clang
# join this table when they are supported.
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "x86_64-avx512",
            "x86_64",
            "gcc",
            (*_COMMON_FLAGS, "-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512"),
        ),
        Target("x86_64-avx2", "x86_64", "gcc", (*_COMMON_FLAGS, "-march=x86-64-v3")),
        Target("x86_64", "x86_64", "gcc", (*_COMMON_FLAGS, "-march=x86-64")),
        Target("aarch64-neon", "aarch64", "gcc", (*_COMMON_FLAGS, "-march=armv8-a+simd")),
    )
}


def host_target_name() -> str:
    """The name of the target class this machine belongs to."""
    machine = platform.machine()
    if machine in ("aarch64", "arm64"):
        return "aarch64-neon"
    if machine in ("x86_64", "AMD64"):
        flags = _cpu_flags()
        if "avx512f" in flags:
            return "x86_64-avx512"
        return "x86_64-avx2" if "avx2" in flags else "x86_64"
    raise BuildError(f"no target for host machine {machine!r} yet")


def host_target() -> Target:
    """This machine's target, with flags that use every feature it has (-march=native)."""
    base = TARGETS[host_target_name()]
    if base.arch == "aarch64":
        native: tuple[str, ...] = ("-mcpu=native",)
    else:
        native = ("-march=native",)
        if base.name == "x86_64-avx512":
            native += ("-mprefer-vector-width=512",)
    return dataclasses.replace(base, arch=platform.machine(), flags=(*_COMMON_FLAGS, *native))


def get_target(target: Target | str) -> Target:
    """A Target from itself, "host", or a name in TARGETS."""
    if isinstance(target, Target):
        return target
    if target == "host":
        return host_target()
    if target not in TARGETS:
        raise BuildError(f"unknown target {target!r}; known: host, {', '.join(sorted(TARGETS))}")
    return TARGETS[target]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kiln" / "build")


@dataclass(frozen=True)
class SharedObject:
    """A compiled shared object; `cache_hit` says whether the compiler ran to make it."""

    data: bytes
    path: Path
    cache_hit: bool


def compile_shared(source: str, target: Target | str = "host") -> SharedObject:
    """Compile C `source` into a shared object for `target`, or fetch it from the build cache.

    Raises:
        BuildError: the target is unknown or not buildable here, or the compiler failed; the
            message carries the compiler's stderr.
    """
    tgt = get_target(target)
    if tgt.arch != platform.machine():
        raise BuildError(f"target {tgt.name} needs a cross compiler, which is not supported yet")
    key = hashlib.sha256(
        "\0".join([source, _compiler_identity(tgt.compiler), *tgt.flags]).encode()
    ).hexdigest()
    directory = cache_dir()
    path = directory / f"{key}.so"
    if path.exists():
        return SharedObject(path.read_bytes(), path, cache_hit=True)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        src, out = Path(tmp) / "module.c", Path(tmp) / "module.so"
        src.write_text(source)
        cmd = [tgt.compiler, *tgt.flags, "-o", str(out), str(src)]
        _LOG.debug("compiling for %s: %s", tgt.name, " ".join(cmd))
        try:
            proc = _run(cmd)
        except subprocess.TimeoutExpired as exc:
            raise BuildError(f"{tgt.compiler} ran past {COMPILE_TIMEOUT_S:.0f} s") from exc
        if proc.returncode != 0:
            raise BuildError(
                f"{tgt.compiler} failed for target {tgt.name} (exit {proc.returncode})", proc.stderr
            )
        os.replace(out, path)  # atomic: another builder sees the whole file or none
    return SharedObject(path.read_bytes(), path, cache_hit=False)


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the compiler (a seam that tests replace to count or forbid compiles)."""
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
    )


@functools.lru_cache(maxsize=8)
def _compiler_identity(compiler: str) -> str:
    path = shutil.which(compiler)
    if path is None:
        raise BuildError(f"compiler {compiler!r} is not on PATH")
    proc = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return f"{path} {proc.stdout.partition(chr(10))[0]}"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()

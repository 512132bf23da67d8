"""C toolchains: targets, compiling generated C into shared objects, and a content-hash build cache.

Targets name a class of CPU ("x86_64-avx512", "x86_64-avx2", "x86_64", "aarch64-neon") with the
flags that build portable code for it; "host" builds for exactly this machine (-march=native).
The compiler is gcc by default; `get_target(name, compiler="clang")` swaps in clang (with
OpenMP from libgomp), and a target for another machine uses its cross compiler
(aarch64-linux-gnu-gcc on an x86_64 host). Sources with `#pragma omp` get -fopenmp; sources that
call the timing harness (`codegen.timing.HARNESS_SYMBOL`) get its object linked in, compiled once
per target and compiler and flags and kept in the cache beside the shared objects. An internal
compiler error is retried once with safer flags (-O2 -fno-tree-vectorize): GCC 12's aarch64
vectorizer crashes on some plain loops at -O3.

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
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from compiler.codegen.timing import HARNESS_SOURCE, HARNESS_SYMBOL
from compiler.errors import BuildError

_LOG = logging.getLogger(__name__)

CACHE_ENV = "KILN_CACHE_DIR"
COMPILE_TIMEOUT_S = 300.0
# GCC -O3 passes that find nothing to change in generated C but still look at every loop or
# function: Kiln's schedules already distribute, interchange, peel, split and unroll-and-jam the
# loops they want so, strides are constants (nothing to version), and a unit's kernels never
# call one another (nothing to clone or fold). Without them a dense unit compiles about 7%
# faster, and the assembly of sampled candidates of every template (dense, the convolutions,
# Winograd, depthwise, pools, reductions, softmax) is byte for byte the same
# (tests/unit/test_timing_harness.py keeps checking dense). GCC's own names: clang gets none.
_GCC_ONLY_FLAGS = (
    "-fno-tree-loop-distribution",
    "-fno-split-loops",
    "-fno-ipa-cp-clone",
    "-fno-peel-loops",
    "-fno-version-loops-for-strides",
    "-fno-loop-interchange",
    "-fno-loop-unroll-and-jam",
    "-fno-ipa-icf",
)
# No -ffast-math: a kernel must not reassociate its sums away from the reference's. Contraction
# into FMA is allowed (ISO C mode turns it off): one rounding fewer per multiply-add, and the
# difference from numpy stays far inside the checks' tolerances.
_COMMON_FLAGS = (
    "-O3",
    "-fPIC",
    "-shared",
    "-std=c11",
    "-fno-math-errno",
    "-ffp-contract=fast",
    *_GCC_ONLY_FLAGS,
)


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
    vector_bytes: int = 64  # the widest SIMD register: how wide generated vector types go
    vector_registers: int = 32  # how many of them the ISA has (register tiles must fit)

    @property
    def is_cross(self) -> bool:
        """Whether the code runs on another machine than this one."""
        return self.arch != platform.machine()


_SAFE_FLAGS = ("-O2", "-fno-tree-vectorize")
_ICE = "internal compiler error"


def _cross_compiler(arch: str) -> str:
    return "gcc" if platform.machine() == arch else f"{arch}-linux-gnu-gcc"


# Named targets build portable code for any CPU of their class; "host" (see host_target) builds
# for exactly this machine with -march=native.
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "x86_64-avx512",
            "x86_64",
            _cross_compiler("x86_64"),
            (*_COMMON_FLAGS, "-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512"),
            64,
        ),
        Target(
            "x86_64-avx2",
            "x86_64",
            _cross_compiler("x86_64"),
            (*_COMMON_FLAGS, "-march=x86-64-v3"),
            32,
            16,
        ),
        Target(
            "x86_64",
            "x86_64",
            _cross_compiler("x86_64"),
            (*_COMMON_FLAGS, "-march=x86-64"),
            16,
            16,
        ),
        Target(
            "aarch64-neon",
            "aarch64",
            _cross_compiler("aarch64"),
            (*_COMMON_FLAGS, "-march=armv8.2-a"),
            16,
        ),
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


def get_target(target: Target | str, compiler: str | None = None) -> Target:
    """A Target from itself, "host", or a name in TARGETS; `compiler` ("gcc", "clang") overrides.

    Raises:
        BuildError: the name is unknown, or clang is asked for another machine.
    """
    if isinstance(target, Target):
        tgt = target
    elif target == "host":
        tgt = host_target()
    elif target in TARGETS:
        tgt = TARGETS[target]
    else:
        raise BuildError(f"unknown target {target!r}; known: host, {', '.join(sorted(TARGETS))}")
    if compiler is None or compiler == tgt.compiler:
        return tgt
    if compiler == "clang":
        if tgt.is_cross:
            raise BuildError(f"clang builds for this machine only, not {tgt.name}")
        skip = {"-mprefer-vector-width=512", *_GCC_ONLY_FLAGS}
        flags = tuple(f for f in tgt.flags if f not in skip)
        return dataclasses.replace(tgt, compiler="clang", flags=flags)
    return dataclasses.replace(tgt, compiler=compiler)


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
    flags = (*tgt.flags, *_extra_flags(source, tgt.compiler))
    objects = [str(path) for path in _runtime_objects(source, tgt)]
    # An object's name is its content key, so a changed harness rebuilds what links it.
    key = _cache_key(source, tgt.compiler, (*flags, *(Path(o).name for o in objects)))

    def build(src: Path, out: Path) -> None:
        _compile_or_retry(tgt, flags, ["-o", str(out), *objects, str(src)])

    path, hit = _cached_build(key, "module.c", "so", source, build)
    return SharedObject(path.read_bytes(), path, cache_hit=hit)


def compile_object(source: str, target: Target | str = "host") -> Path:
    """The cached path of C `source` compiled into a position-independent object for `target`,
    to link into shared objects.

    Raises:
        BuildError: as compile_shared.
    """
    tgt = get_target(target)
    flags = (*(f for f in tgt.flags if f != "-shared"), *_extra_flags(source, tgt.compiler))
    key = _cache_key(source, tgt.compiler, (*flags, "-c"))

    def build(src: Path, out: Path) -> None:
        _compile_or_retry(tgt, flags, ["-c", "-o", str(out), str(src)])

    path, _ = _cached_build(key, "object.c", "o", source, build)
    return path


def _runtime_objects(source: str, tgt: Target) -> tuple[Path, ...]:
    """Objects the source asks for: the timing harness when a timing entry calls it."""
    if HARNESS_SYMBOL + "(" not in source:
        return ()
    return (compile_object(HARNESS_SOURCE, tgt),)


def _compile_or_retry(tgt: Target, flags: Sequence[str], tail: list[str]) -> None:
    """Run `tgt`'s compiler with `flags`, then `tail` (output and inputs). An internal compiler
    error is retried once with safer flags; a failure raises BuildError with the stderr."""
    cmd = [tgt.compiler, *flags, *tail]
    _LOG.debug("compiling for %s: %s", tgt.name, " ".join(cmd))
    proc = _compile(cmd, tgt)
    if proc.returncode != 0 and _ICE in proc.stderr:
        # Same source, safer optimisation: a compiler bug must not fail a candidate.
        safe = [f for f in flags if f not in ("-O3", "-O2")] + list(_SAFE_FLAGS)
        _LOG.warning("%s crashed on %s; retrying with %s", tgt.compiler, tgt.name, _SAFE_FLAGS)
        proc = _compile([tgt.compiler, *safe, *tail], tgt)
    if proc.returncode != 0:
        raise BuildError(
            f"{tgt.compiler} failed for target {tgt.name} (exit {proc.returncode})", proc.stderr
        )


class UnitBuild:
    """One shared object from several C translation units, compiled in parallel as they come.

    `add(source)` starts compiling a unit into an object file and returns at once, so the caller
    can produce the next unit while the compiler runs; `link()` waits for the objects and links
    them. Each object is cached by its unit's content hash (with the compiler and flags), so a
    unit unchanged since an earlier build is not compiled again, and the shared object by the
    units' hashes. At most `jobs` compilers run at once (default: the CPUs this process may run
    on). A unit that fails to compile fails `link()` with its BuildError.
    """

    def __init__(self, target: Target | str = "host", jobs: int | None = None) -> None:
        self.target = get_target(target)
        workers = jobs or len(os.sched_getaffinity(0))
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="kiln-cc")
        self._keys: list[str] = []
        self._objects: list[Future[tuple[Path, bool]]] = []
        self._openmp = False
        self._runtimes: set[Path] = set()

    def add(self, source: str) -> None:
        extra = _extra_flags(source, self.target.compiler)
        self._openmp |= bool(extra)
        self._runtimes.update(_runtime_objects(source, self.target))
        flags = (*self.target.flags, *extra)
        key = _cache_key(source, self.target.compiler, (*flags, "-c"))
        self._keys.append(key)

        def build(src: Path, out: Path) -> None:
            _compile_or_retry(self.target, flags, ["-c", "-o", str(out), str(src)])

        self._objects.append(self._pool.submit(_cached_build, key, "unit.c", "o", source, build))

    def link(self) -> SharedObject:
        """The shared object of every unit added; waits for their compiles."""
        try:
            objects = [future.result() for future in self._objects]
        finally:
            self.close()
        tgt = self.target
        flags = (*tgt.flags, *(_extra_flags("#pragma omp", tgt.compiler) if self._openmp else ()))
        runtimes = sorted(self._runtimes)
        key = _cache_key(
            "\0".join(self._keys), tgt.compiler, (*flags, "link", *(p.name for p in runtimes))
        )
        paths = [str(path) for path, _ in objects] + [str(p) for p in runtimes]

        def build(listing: Path, out: Path) -> None:
            _compile_or_retry(tgt, flags, ["-o", str(out), *paths])

        path, hit = _cached_build(key, "objects.txt", "so", "\n".join(paths), build)
        compiled = not hit or not all(unit_hit for _, unit_hit in objects)
        return SharedObject(path.read_bytes(), path, cache_hit=not compiled)

    def close(self) -> None:
        """Drop the compiles not started and end the threads once the running ones finish."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _cache_key(source: str, compiler: str, flags: Sequence[str]) -> str:
    return hashlib.sha256(
        "\0".join([source, _compiler_identity(compiler), *flags]).encode()
    ).hexdigest()


def _cached_build(
    key: str, source_name: str, suffix: str, source: str, build: Callable[[Path, Path], None]
) -> tuple[Path, bool]:
    """The cache entry `<key>.<suffix>` and whether it was there; if not, `build(src, out)`
    makes it from `source` written to `source_name` in a scratch folder of the cache."""
    directory = cache_dir()
    path = directory / f"{key}.{suffix}"
    if path.exists():
        return path, True
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        src, out = Path(tmp) / source_name, Path(tmp) / f"out.{suffix}"
        src.write_text(source)
        build(src, out)
        os.replace(out, path)  # atomic: another builder sees the whole file or none
    return path, False


def find_nvcc() -> str | None:
    """CUDA's compiler: on PATH, or in the toolkit's usual place."""
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def compile_cuda(source: str, arch: str = "sm_90", output: str = "cubin") -> bytes:
    """Compile CUDA `source` with nvcc into a `cubin` (or `ptx`) for `arch`, through the same
    content-hash cache as the C builds.

    Raises:
        BuildError: nvcc is missing, `output` or `arch` is malformed, or nvcc failed (its
            stderr is carried).
    """
    if output not in ("cubin", "ptx"):
        raise BuildError(f"nvcc output must be cubin or ptx, not {output!r}")
    if not re.fullmatch(r"(sm|compute)_\d+[a-z]?", arch):
        raise BuildError(f"malformed CUDA architecture {arch!r} (expected e.g. sm_90)")
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc is not installed (looked on PATH and in /usr/local/cuda/bin)")
    flags = [f"-{output}", f"-arch={arch}", "-O3"]
    key = hashlib.sha256("\0".join([source, _compiler_identity(nvcc), *flags]).encode()).hexdigest()

    def build(src: Path, out: Path) -> None:
        try:
            proc = _run([nvcc, *flags, "-o", str(out), str(src)])
        except subprocess.TimeoutExpired as exc:
            raise BuildError(f"nvcc ran past {COMPILE_TIMEOUT_S:.0f} s") from exc
        if proc.returncode != 0:
            raise BuildError(f"nvcc failed for {arch} (exit {proc.returncode})", proc.stderr)

    path, _ = _cached_build(key, "kernel.cu", output, source, build)
    return path.read_bytes()


def _extra_flags(source: str, compiler: str) -> tuple[str, ...]:
    """Flags the source itself asks for: OpenMP only when a kernel has a parallel loop."""
    if "#pragma omp" not in source:
        return ()
    # clang's own runtime (libomp) is not installed here, and two OpenMP runtimes must never
    # meet in one process: every compiler links GCC's libgomp.
    return ("-fopenmp=libgomp",) if compiler == "clang" else ("-fopenmp",)


def _compile(cmd: list[str], tgt: Target) -> subprocess.CompletedProcess[str]:
    try:
        return _run(cmd)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"{tgt.compiler} ran past {COMPILE_TIMEOUT_S:.0f} s") from exc


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

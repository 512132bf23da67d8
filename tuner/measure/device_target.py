"""The device decides the target: which compiler target a device's registered tags can run.

An agent tags each device with `backend`, `arch` (platform.machine() or the emulated guest's),
`features` (the CPU's ISA flags that matter for code generation) and `cpu` (its model name).
A device of this very machine's kind (same target class and CPU model) gets "host", which builds
with -march=native; any other gets the named class (x86_64-avx512, x86_64-avx2, aarch64-neon).

A device may also say how many threads it runs one kernel on (`threads`: an agent pinned to a
core set tags it with the set's size); records of that device carry the count in their target
(`device_records_target`: "x86_64-avx512/threads=4"), so tuning for one thread count is never
applied to another. A device without the tag runs kernels on one thread.

A simulated accelerator's device (`arch=vta`, the vta_sim backend) runs accelerator programs,
not C, and no C target runs on it. A program is compiled for one accelerator spec (buffer sizes,
DRAM timing, clock; the device's `vta_spec` tag) and its cycles are that spec's, so the target
names the spec: "vta" for the default spec, "vta/spec=<key>" for another (`vta_target`; the
builder builds the vta_* templates for it), and records carry it always:
"vta/spec=1-16-16-...". Records tuned for one spec never serve a device of another.

A GPU's device (`arch=cuda`, the cuda backend) tags its compute capability (`sm=90`) and runs
CUDA images, not host C. Its target names the capability, "cuda/sm=90"
(`compiler.build_cuda.cuda_target`): the builder compiles candidates with nvcc for sm_90, and
records carry the name, so a schedule tuned on an sm_90 chip never serves an sm_80 one. A target
runs only on a device of its own capability (see `compiler.build_cuda` for why not on newer
minor versions too).
"""

from __future__ import annotations

from collections.abc import Mapping

from compiler.build_cuda import CUDA_TARGET, cuda_arch, cuda_target, is_cuda_target
from compiler.toolchain import TARGETS, BuildError, get_target, host_target_name
from protos.hostinfo import cpu_tags
from protos.vta import VTA_TARGET, VtaSpec
from tuner.records.record import records_target

# The simulated accelerator's arch tag (device_agent.backends.vta_sim).
VTA_ARCH = "vta"
# A GPU's arch tag (device_agent.backends.cuda); its `sm` tag is the compute capability.
CUDA_ARCH = CUDA_TARGET
SPEC_MARK = "/spec="

# What each named target needs of a device: its arch and these features (empty: the base ISA).
_NEEDS: dict[str, frozenset[str]] = {
    "x86_64-avx512": frozenset({"avx512f", "avx2", "fma"}),
    "x86_64-avx2": frozenset({"avx2", "fma"}),
    "x86_64": frozenset(),
    "aarch64-neon": frozenset(),
}


class TargetError(ValueError):
    """A target the device cannot run, or a device whose tags name no target we can build."""


def _features(tags: Mapping[str, str]) -> frozenset[str] | None:
    text = tags.get("features")
    return None if text is None else frozenset(f for f in text.split(",") if f)


def device_target(tags: Mapping[str, str]) -> str:
    """The best target a device with `tags` runs: "host" for a device like this machine.

    A device without `features` (an older agent) is taken to be this machine's kind when its
    arch is this machine's.

    Raises:
        TargetError: the device's arch has no compiler target.
    """
    arch = tags.get("arch", "")
    features = _features(tags)
    if arch == VTA_ARCH:
        return vta_target(tags.get("vta_spec"))
    if arch == CUDA_ARCH:
        return gpu_target(tags)
    if arch in ("aarch64", "arm64"):
        name = "aarch64-neon"
    elif arch in ("x86_64", "AMD64"):
        if features is None:
            name = host_target_name() if _host_arch() == "x86_64" else "x86_64"
        elif _NEEDS["x86_64-avx512"] <= features:
            name = "x86_64-avx512"
        elif _NEEDS["x86_64-avx2"] <= features:
            name = "x86_64-avx2"
        else:
            name = "x86_64"
    else:
        raise TargetError(
            f"device arch {arch!r} has no compiler target "
            f"(known: x86_64, aarch64, {VTA_ARCH}, {CUDA_ARCH})"
        )
    if name == host_target_name() and tags.get("emulated") is None:
        cpu = tags.get("cpu")
        if cpu is None or cpu == cpu_tags().get("cpu"):
            return "host"
    return name


def check_target(target: str, tags: Mapping[str, str], device: str = "the device") -> str:
    """`target` if a device with `tags` can run what it builds, else TargetError naming both.

    Raises:
        TargetError: an unknown target, another arch, or features the device lacks.
    """
    arch = tags.get("arch", "")
    if is_cuda_target(target) or arch == CUDA_ARCH:
        if is_cuda_target(target) and arch == CUDA_ARCH:
            runs = device_target(tags)
            if cuda_target_arch(target) != cuda_target_arch(runs):
                raise TargetError(
                    f"target {target} builds for {cuda_target_arch(target)}, which {device} "
                    f"(sm={tags.get('sm')}) does not run; it runs {runs}"
                )
            return target
        raise TargetError(
            f"target {target} cannot run on {device} (arch={arch}); it runs {device_target(tags)}"
        )
    if is_vta_target(target) or arch == VTA_ARCH:
        if is_vta_target(target) and arch == VTA_ARCH:
            runs = device_target(tags)
            if vta_target_spec(target) != vta_target_spec(runs):
                raise TargetError(
                    f"target {target} builds for another accelerator spec than {device} "
                    f"simulates; it runs {runs}"
                )
            return target
        raise TargetError(
            f"target {target} cannot run on {device} (arch={arch}); it runs {device_target(tags)}"
        )
    try:
        tgt = get_target(target)
    except BuildError as exc:
        raise TargetError(str(exc)) from None
    arch = tags.get("arch", "")
    if arch and tgt.arch != arch and not (tgt.arch == "aarch64" and arch == "arm64"):
        raise TargetError(
            f"target {target} ({tgt.arch}) cannot run on {device} (arch={arch}); "
            f"it runs {device_target(tags)}"
        )
    features = _features(tags)
    base = host_target_name() if target == "host" else target
    missing = sorted(_NEEDS.get(base, frozenset()) - features) if features is not None else []
    if missing:
        raise TargetError(
            f"target {target} needs {', '.join(missing)}, which {device} lacks "
            f"(features={tags.get('features')}); it runs {device_target(tags)}"
        )
    return target


def device_threads(tags: Mapping[str, str]) -> int:
    """The threads a device with `tags` runs one kernel on: its `threads` tag, else 1.

    Raises:
        TargetError: the tag is not a whole number of at least 1.
    """
    text = tags.get("threads")
    if text is None:
        return 1
    if not text.strip().isdigit() or int(text) < 1:
        raise TargetError(f"device tag threads={text!r} is not a whole number >= 1")
    return int(text)


def device_records_target(tags: Mapping[str, str], target: str | None = None) -> str:
    """The target records of a device with `tags` carry: the resolved name of `target` (default:
    `device_target(tags)`; "host" resolves to this machine's class; an accelerator's names its
    spec, `vta_records_name`) and the device's thread count.

    Raises:
        TargetError: as `device_target`, `check_target` (for a `target` given) and
            `device_threads`.
    """
    name = device_target(tags) if target is None else check_target(target, tags)
    if is_cuda_target(name):
        return records_target(name, device_threads(tags))
    if is_vta_target(name):
        return records_target(vta_records_name(vta_target_spec(name).key()), device_threads(tags))
    try:
        resolved = get_target(name).name
    except BuildError as exc:
        raise TargetError(str(exc)) from None
    return records_target(resolved, device_threads(tags))


def vta_target(spec_key: str | None = None) -> str:
    """The compile target of programs for the spec with key `spec_key`: "vta" for the default
    spec (None, or its key), else "vta/spec=<key>"."""
    if not spec_key or spec_key == VtaSpec().key():
        return VTA_TARGET
    return f"{VTA_TARGET}{SPEC_MARK}{spec_key}"


def is_vta_target(target: str) -> bool:
    """Whether `target` builds accelerator programs ("vta" or "vta/spec=<key>")."""
    return target == VTA_TARGET or target.startswith(VTA_TARGET + SPEC_MARK)


def vta_target_spec(target: str) -> VtaSpec:
    """The accelerator spec a vta target builds for.

    Raises:
        TargetError: `target` is not a vta target, or its spec key is malformed.
    """
    if target == VTA_TARGET:
        return VtaSpec()
    if not is_vta_target(target):
        raise TargetError(f"{target!r} is not an accelerator target")
    try:
        return VtaSpec.from_key(target[len(VTA_TARGET + SPEC_MARK) :])
    except (TypeError, ValueError) as exc:
        raise TargetError(f"target {target!r}: {exc}") from None


def vta_records_name(spec_key: str | None = None) -> str:
    """The records target name of accelerator programs for the spec with key `spec_key`
    (`VtaSpec.key`; None: the default spec, the one the op templates build for)."""
    return f"{VTA_TARGET}{SPEC_MARK}{spec_key or VtaSpec().key()}"


def gpu_target(tags: Mapping[str, str]) -> str:
    """The compile target of a GPU device with `tags`: "cuda/sm=<its sm tag>".

    Raises:
        TargetError: the device has no `sm` tag, or it is not a compute capability.
    """
    sm = tags.get("sm")
    if not sm:
        raise TargetError("a cuda device without an sm tag (its compute capability) has no target")
    try:
        return cuda_target(sm)
    except ValueError as exc:
        raise TargetError(f"device tag sm={sm!r}: {exc}") from None


def cuda_target_arch(target: str) -> str:
    """nvcc's arch ("sm_90") of a cuda target.

    Raises:
        TargetError: `target` is not a well-formed cuda target.
    """
    try:
        return cuda_arch(target)
    except ValueError as exc:
        raise TargetError(str(exc)) from None


def _host_arch() -> str:
    try:
        return TARGETS[host_target_name()].arch
    except BuildError:
        return ""

"""Build GPU kernels into CUDA Artifacts: lower, render CUDA C, one nvcc unit, a KCUD container.

`build_cuda(kernels, target)` lowers each `compiler.build.Kernel` (a schedule bound to
`blockIdx.*` / `threadIdx.*`), renders it with `compiler.codegen.cuda.render_cuda`, puts every
kernel into one .cu translation unit, compiles it with nvcc for the target's arch
(`toolchain.compile_cuda`, content-hash cached) and wraps the image in a `protos.cuda_program`
container: per kernel one entry whose program is one launch over the entry's own arguments, in
order. The entry's `timing_symbol` is its symbol (the cuda backend times the launch sequence).
`build_cuda_program(kernels, calls, entry, ...)` is the whole-model form: one entry whose program
launches the kernels in the order of `calls`, over the entry's args and slices of a workspace
holding `constants` (`compiler.graph.build_model_cuda`); it also returns each kernel's lowered
loop IR, which the interpreter runs where no GPU is.

Targets: "cuda/sm=90" builds for sm_90 (`cuda_target`); the name is also the artifact's target
and, with the device's thread count, what records carry, so records tuned on one compute
capability never serve another. A cubin runs only on its own arch here: `sm_80` code could run on
an sm_86 device, but a tuning result is a property of the chip it was measured on.

Images are cubins by default: nothing to JIT-compile when a device loads one. With
`image="ptx"` the container carries PTX for the same arch instead ("ptx" artifacts), which the
driver compiles at load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.artifact import Artifact, Entry
from compiler.build import Kernel, kernel_entry
from compiler.codegen.cuda import CUDA_PRELUDE, CudaKernel, render_cuda
from compiler.errors import BuildError, CompilerError
from compiler.ir.function import PrimFunc
from compiler.lower import lower
from compiler.toolchain import compile_cuda
from protos.cuda_program import CudaModule, CudaProgram, Launch, LaunchArg, encode_module

_LOG = logging.getLogger(__name__)

CUDA_TARGET = "cuda"
SM_MARK = "/sm="
_SM = re.compile(r"[0-9]{2,3}[a-z]?")
# nvcc's diagnostics: "<file>(<line>): error: ..."
_NVCC_ERROR_LINE = re.compile(r"\((\d+)\): error")


def cuda_target(sm: str | int) -> str:
    """The compile target of kernels for compute capability `sm` (90, "90", "90a", "9.0",
    "sm_90"): "cuda/sm=90".

    Raises:
        ValueError: `sm` is not a compute capability.
    """
    text = str(sm).strip().lower().removeprefix("sm_")
    if re.fullmatch(r"[0-9]+\.[0-9]", text):
        text = text.replace(".", "")
    if not _SM.fullmatch(text):
        raise ValueError(f"{sm!r} is not a CUDA compute capability like 90, 9.0 or sm_90")
    return f"{CUDA_TARGET}{SM_MARK}{text}"


def is_cuda_target(target: str) -> bool:
    """Whether `target` builds GPU kernels ("cuda/sm=<N>")."""
    return target.startswith(CUDA_TARGET + SM_MARK)


def cuda_arch(target: str) -> str:
    """nvcc's arch of a cuda target: "sm_90" for "cuda/sm=90".

    Raises:
        ValueError: `target` is not a well-formed cuda target.
    """
    sm = target[len(CUDA_TARGET + SM_MARK) :] if is_cuda_target(target) else ""
    if not _SM.fullmatch(sm):
        raise ValueError(f"{target!r} is not a cuda target like cuda/sm=90")
    return f"sm_{sm}"


def cuda_sm(target: str) -> int:
    """The compute capability of a cuda target as a number: 90 for "cuda/sm=90" and "cuda/sm=90a"."""
    return int(cuda_arch(target)[3:].rstrip("abcdefghijklmnopqrstuvwxyz"))


def render_kernel(k: Kernel) -> CudaKernel:
    """`k` lowered and rendered as CUDA.

    Raises:
        CompilerError: lowering or rendering failed; the message names the kernel.
    """
    try:
        return render_cuda(lower(k.sch, k.args, k.symbol), k.symbol)
    except CompilerError as exc:
        raise type(exc)(f"kernel {k.symbol}: {exc}") from exc


def cuda_unit(kernels: Sequence[CudaKernel]) -> tuple[str, list[tuple[int, str]]]:
    """One translation unit with every kernel (the prelude once) and where each starts:
    (first line, symbol) pairs, lines counted from 1."""
    parts = [CUDA_PRELUDE]
    starts: list[tuple[int, str]] = []
    line = CUDA_PRELUDE.count("\n") + 1
    for k in kernels:
        if not k.source.startswith(CUDA_PRELUDE):
            raise BuildError(f"kernel {k.symbol}: its source does not start with the prelude")
        body = k.source[len(CUDA_PRELUDE) :]
        starts.append((line, k.symbol))
        parts.append(body)
        line += body.count("\n")
    return "".join(parts), starts


def _manifest(entries: Sequence[Entry]) -> str:
    """The entries' specs as a device constant in the image, so that the artifact's hash (the
    devices' cache key) changes when they do (`compiler.artifact.manifest_source` says why)."""
    text = json.dumps(
        [[e.symbol, [[a.name, list(a.shape), a.dtype, a.role] for a in e.args]] for e in entries],
        separators=(",", ":"),
    )
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'extern "C" __device__ const char kiln_manifest[] = "{escaped}";\n'


def _blame(stderr: str, starts: Sequence[tuple[int, str]]) -> list[str]:
    """The symbols of the kernels nvcc's errors point at, in order: by line (the front end's
    "file(line): error") or by name (ptxas's "Entry function 'k' uses too much shared data")."""
    found: list[tuple[int, str]] = []
    for m in _NVCC_ERROR_LINE.finditer(stderr):
        owner = [symbol for first, symbol in starts if first <= int(m.group(1))]
        if owner:
            found.append((m.start(), owner[-1]))
    for _, symbol in starts:
        named = re.search(rf"'{re.escape(symbol)}'", stderr)
        if named:
            found.append((named.start(), symbol))
    out: list[str] = []
    for _, symbol in sorted(found):
        if symbol not in out:
            out.append(symbol)
    return out


def build_cuda(
    kernels: Sequence[Kernel], target: str = "cuda/sm=90", image: str = "cubin"
) -> Artifact:
    """One Artifact with one entry per kernel, compiled as one nvcc translation unit; its format
    is `image`, "cubin" or "ptx".

    Raises:
        CompilerError: lowering, rendering or nvcc failed; the message names the kernel (for
            nvcc: the kernels its errors point at).
        ValueError: two kernels share a symbol, `target` is not a cuda target, or `image` is
            neither cubin nor ptx.
    """
    kind = image
    if kind not in ("cubin", "ptx"):
        raise ValueError(f"a CUDA image is cubin or ptx, not {kind!r}")
    symbols = [k.symbol for k in kernels]
    if len(set(symbols)) != len(symbols):
        raise ValueError(f"kernel symbols repeat: {symbols}")
    arch = cuda_arch(target)
    rendered = [render_kernel(k) for k in kernels]
    entries = tuple(Entry(k.symbol, k.symbol, kernel_entry(k).args, float(k.flop)) for k in kernels)
    source, starts = cuda_unit(rendered)
    try:
        binary = compile_cuda(source + _manifest(entries), arch, kind)
    except BuildError as exc:
        blamed = _blame(exc.stderr, starts) or symbols
        raise BuildError(f"kernel {', '.join(blamed)}: {exc}") from exc
    programs = {
        r.symbol: CudaProgram(
            (
                Launch(
                    r.symbol, r.grid, r.block, tuple(LaunchArg.entry(i) for i in range(len(e.args)))
                ),
            )
        )
        for r, e in zip(rendered, entries, strict=True)
    }
    data = encode_module(CudaModule(arch, kind, binary, programs))
    _LOG.debug("built %s for %s", symbols, arch)
    return Artifact(data, hashlib.sha256(data).hexdigest(), kind, target, entries)


@dataclass(frozen=True)
class ProgramCall:
    """One launch of a program: kernel `symbol` over `args` (entry args or workspace slices,
    one per kernel argument, in the kernel's argument order)."""

    symbol: str
    args: tuple[LaunchArg, ...]


@dataclass(frozen=True)
class ProgramBuild:
    """A one-entry CUDA artifact and the lowered loop IR of its kernels, by symbol (what the
    interpreter runs in place of the GPU: `launches` of the container name them)."""

    artifact: Artifact
    functions: dict[str, PrimFunc]
    kernels: dict[str, CudaKernel]


def build_cuda_program(
    kernels: Sequence[Kernel],
    calls: Sequence[ProgramCall],
    entry: Entry,
    workspace_bytes: int = 0,
    constants: Sequence[tuple[int, bytes]] = (),
    target: str = "cuda/sm=90",
    image: str = "cubin",
) -> ProgramBuild:
    """One Artifact whose single entry `entry` runs `calls` in order: every kernel in one nvcc
    unit, each call one launch (a kernel may be launched by several calls), over the entry's
    args and a program workspace of `workspace_bytes` into which `constants` ((offset, bytes))
    are written at load (`protos.cuda_program`).

    Raises:
        CompilerError: lowering, rendering or nvcc failed, naming the kernel.
        ValueError: kernel symbols repeat, a call names no kernel or passes the wrong number of
            arguments, the program is malformed (`ProgramError`), `target` is not a cuda target,
            or `image` is neither cubin nor ptx.
    """
    if image not in ("cubin", "ptx"):
        raise ValueError(f"a CUDA image is cubin or ptx, not {image!r}")
    symbols = [k.symbol for k in kernels]
    if len(set(symbols)) != len(symbols):
        raise ValueError(f"kernel symbols repeat: {symbols}")
    arch = cuda_arch(target)
    by_symbol = {k.symbol: k for k in kernels}
    functions: dict[str, PrimFunc] = {}
    rendered: dict[str, CudaKernel] = {}
    for k in kernels:
        try:
            functions[k.symbol] = lower(k.sch, k.args, k.symbol)
            rendered[k.symbol] = render_cuda(functions[k.symbol], k.symbol)
        except CompilerError as exc:
            raise type(exc)(f"kernel {k.symbol}: {exc}") from exc
    launches = []
    for n, call in enumerate(calls):
        kernel = by_symbol.get(call.symbol)
        if kernel is None:
            raise ValueError(f"call {n}: no kernel {call.symbol!r}")
        if len(call.args) != len(kernel.args):
            raise ValueError(
                f"call {n} ({call.symbol}): {len(call.args)} arguments for {len(kernel.args)}"
            )
        r = rendered[call.symbol]
        launches.append(Launch(call.symbol, r.grid, r.block, call.args))
    program = CudaProgram(tuple(launches), workspace_bytes, tuple(constants))
    program.check(len(entry.args))
    source, starts = cuda_unit(list(rendered.values()))
    try:
        binary = compile_cuda(source + _manifest((entry,)), arch, image)
    except BuildError as exc:
        blamed = _blame(exc.stderr, starts) or symbols
        raise BuildError(f"kernel {', '.join(blamed)}: {exc}") from exc
    data = encode_module(CudaModule(arch, image, binary, {entry.symbol: program}))
    _LOG.debug(
        "built program %s: %d launches of %d kernels", entry.symbol, len(calls), len(kernels)
    )
    artifact = Artifact(
        data, hashlib.sha256(data).hexdigest(), image, target, (entry,), workspace_bytes
    )
    return ProgramBuild(artifact, functions, rendered)

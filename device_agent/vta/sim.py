"""The native VTA simulator (`device_agent/backends/vta_sim.c`): built once per host, called by ctypes.

`build(state_dir)` compiles the C source with the host's gcc (`KILN_VTA_CC` overrides it) into a
shared library named by the hash of the source and the compiler, as the qemu backend builds its
runner; `Simulator(path)` loads it, and `Simulator.run` executes a program on a DRAM image in
place and returns a `SimReport`, or raises `VtaHazard` (a `VtaError`) naming the cause: its
`kind` (a HazardKind) and the instruction. A simulator that cannot be built or loaded is a
RuntimeError, as for every backend's `prepare`. The C file's header documents the timing and
hazard models.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass

import numpy as np

from protos.vta import Module, VtaSpec, encode_insn
from protos.vta_program import Program

CC = os.environ.get("KILN_VTA_CC", "gcc")
SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "backends",
                      "vta_sim.c")  # fmt: skip
_CFLAGS = ("-O3", "-shared", "-fPIC", "-fno-strict-aliasing")


class HazardKind(enum.IntEnum):
    """What `vta_run` found wrong (the C `enum vta_error`, value for value)."""

    UNKNOWN_OPCODE = 1
    BAD_INSTRUCTION = 2
    BUFFER_OVERFLOW = 3
    DRAM_OUT_OF_BOUNDS = 4
    UNSYNCED_READ = 5
    UNSYNCED_WRITE = 6
    UNINITIALISED_READ = 7
    TOKEN_UNDERFLOW = 8
    TOKEN_DEADLOCK = 9
    TOKEN_LEFT = 10
    HOST_ERROR = 11


class Kernel(enum.IntEnum):
    """Host code of the GEMM micro-op; every kernel gives the same bits."""

    AUTO = 0
    GENERIC = 1
    AVX2 = 2
    AVX512 = 3


class VtaError(Exception):
    """Base of the simulator's errors."""


class VtaHazard(VtaError):
    """A program the accelerator cannot run as written; `insn` is its index (-1: the program)."""

    def __init__(self, kind: HazardKind, insn: int, message: str) -> None:
        super().__init__(f"{kind.name}: {message}")
        self.kind = kind
        self.insn = insn
        self.message = message


class _Spec(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in VtaSpec.__dataclass_fields__]


_PER_MODULE = ctypes.c_uint64 * 3


class _Report(ctypes.Structure):
    _fields_ = [
        ("total_cycles", ctypes.c_uint64),
        ("busy", _PER_MODULE),
        ("token_stall", _PER_MODULE),
        ("dram_wait", _PER_MODULE),
        ("insns", _PER_MODULE),
        ("gemm_cycles", ctypes.c_uint64),
        ("alu_cycles", ctypes.c_uint64),
        ("dram_read_bytes", ctypes.c_uint64),
        ("dram_write_bytes", ctypes.c_uint64),
        ("error_kind", ctypes.c_int32),
        ("error_insn", ctypes.c_int32),
        ("kernel_used", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("error", ctypes.c_char * 512),
    ]


@dataclass(frozen=True)
class ModuleCycles:
    """One module's cycles: executing, stalled on a token, waiting for the DRAM channel."""

    busy: int
    token_stall: int
    dram_wait: int
    insns: int


@dataclass(frozen=True)
class SimReport:
    """A run's timing, in cycles of the spec's clock; deterministic for a program."""

    total_cycles: int
    modules: dict[Module, ModuleCycles]
    gemm_cycles: int  # cycles the GEMM core multiplied (resets excluded)
    alu_cycles: int
    dram_read_bytes: int
    dram_write_bytes: int
    kernel: Kernel
    clock_mhz: int

    @property
    def seconds(self) -> float:
        """The run's time at the spec's clock."""
        return self.total_cycles / (self.clock_mhz * 1e6)

    @property
    def gemm_utilisation(self) -> float:
        """Useful GEMM cycles over all cycles: the paper's utilisation."""
        return self.gemm_cycles / self.total_cycles if self.total_cycles else 0.0

    def utilisation(self, module: Module) -> float:
        """Busy cycles of `module` over all cycles."""
        return self.modules[module].busy / self.total_cycles if self.total_cycles else 0.0


def build(state_dir: str) -> str:
    """The simulator library in `state_dir`, compiled unless it is there already.

    Raises:
        RuntimeError: no compiler, or the build fails.
    """
    with open(SOURCE, "rb") as f:
        source = f.read()
    digest = hashlib.sha256(source + CC.encode() + " ".join(_CFLAGS).encode()).hexdigest()[:16]
    state_dir = os.path.abspath(state_dir or os.path.join(tempfile.gettempdir(), "kiln-vta"))
    path = os.path.join(state_dir, f"kiln-vta-sim-{digest}.so")
    if os.path.exists(path):
        return path
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".vta-sim-", suffix=".so")
    os.close(fd)
    try:
        try:
            proc = subprocess.run(
                [CC, *_CFLAGS, "-o", tmp, SOURCE], capture_output=True, timeout=120, check=False
            )
        except FileNotFoundError:
            raise RuntimeError(
                f"the vta_sim backend needs a C compiler ({CC}; Debian: gcc)"
            ) from None
        if proc.returncode != 0:
            raise RuntimeError(
                f"{CC} could not build the VTA simulator: "
                f"{proc.stderr.decode(errors='replace')[-2000:]}"
            )
        os.replace(tmp, path)  # atomic: a concurrent builder's copy is as good as ours
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


class Simulator:
    """The loaded simulator library."""

    def __init__(self, path: str) -> None:
        """Raises RuntimeError when the library cannot be loaded."""
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as e:
            raise RuntimeError(f"cannot load the VTA simulator: {e}") from e
        self._run = lib.vta_run
        self._run.restype = ctypes.c_int32
        self._run.argtypes = [
            ctypes.POINTER(_Spec),
            ctypes.c_char_p,
            ctypes.c_uint64,
            ctypes.c_void_p,
            ctypes.c_uint64,
            ctypes.c_int32,
            ctypes.POINTER(_Report),
        ]
        self._supported = lib.vta_kernel_supported
        self._supported.restype = ctypes.c_int32
        self._supported.argtypes = [ctypes.POINTER(_Spec), ctypes.c_int32]

    def kernels(self, spec: VtaSpec) -> list[Kernel]:
        """The GEMM kernels this host runs for `spec` (AUTO excluded)."""
        c_spec = _Spec(*spec.values())
        return [k for k in Kernel if k is not Kernel.AUTO and self._supported(c_spec, k)]

    def run(
        self, spec: VtaSpec, code: bytes, dram: np.ndarray, kernel: Kernel = Kernel.AUTO
    ) -> SimReport:
        """Run the encoded instructions `code` on `dram` (uint8, changed in place).

        Raises:
            VtaHazard: the program is wrong (the DRAM image is then partly written).
        """
        if dram.dtype != np.uint8 or not dram.flags.c_contiguous or not dram.flags.writeable:
            raise ValueError("the DRAM image must be a writeable C-contiguous uint8 array")
        report = _Report()
        rc = self._run(
            ctypes.byref(_Spec(*spec.values())),
            code,
            len(code) // 16,
            dram.ctypes.data,
            dram.nbytes,
            int(kernel),
            ctypes.byref(report),
        )
        if rc != 0:
            kind = HazardKind(report.error_kind or rc)
            raise VtaHazard(kind, report.error_insn, report.error.decode(errors="replace"))
        return SimReport(
            total_cycles=report.total_cycles,
            modules={
                m: ModuleCycles(
                    report.busy[m], report.token_stall[m], report.dram_wait[m], report.insns[m]
                )
                for m in Module
            },
            gemm_cycles=report.gemm_cycles,
            alu_cycles=report.alu_cycles,
            dram_read_bytes=report.dram_read_bytes,
            dram_write_bytes=report.dram_write_bytes,
            kernel=Kernel(report.kernel_used),
            clock_mhz=spec.clock_mhz,
        )


def encode_code(program: Program) -> bytes:
    """The program's instructions as the simulator reads them."""
    return b"".join(encode_insn(i) for i in program.insns)

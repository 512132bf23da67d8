"""A VTA-like GEMM accelerator, simulated cycle by cycle in native code (`vta_sim.c` beside this).

Artifacts are ACCEL_PROGRAM containers (`protos.vta_program`): one program per entry symbol, each
compiled for a `protos.vta.VtaSpec`. The device simulates one spec, `VtaSpec()` unless the
environment's `KILN_VTA_SPEC` (a JSON object of field overrides, e.g. `{"dram_latency_cycles":
128}`) says otherwise; its tags carry the spec's key and clock, and a program compiled for another
spec is a LOAD_ERROR. `prepare` builds the simulator library once per host into the backend's
state directory (`device_agent.vta.sim.build`, host gcc).

Running a program lays its args out in a DRAM image (`device_agent.vta.image`), simulates it, and
reads the args back, so RUN returns the outputs and a correctness check compares them with the
reference's. A program the hardware could not run as written (the simulator's hazards: a token
that never comes or a deadlock, an unsynchronised buffer access, a buffer overflow, a DMA outside
DRAM, an unknown opcode) is a RUNTIME_ERROR whose text starts `hazard <KIND>:` and names the
instruction and the cause.

Timing: a sample is the simulated cycles of one run at the spec's clock, identical for every
repeat (the timing model never looks at data), and results are labelled `emulated` like qemu's;
telemetry's `cpu_mhz` reads the spec's clock, so cycles = sample * cpu_mhz * 1e6 exactly as a
double allows. A measurement's result carries where the cycles went (`AccelCycles`: total, GEMM,
and per module busy / token-stall / DRAM-wait cycles), so a client reads the utilisation of each
module; in-process callers also find the whole report in `last_report`.

A SHARED_OBJECT for this host is accepted too, run as the cpu backend runs it, but only as a check
reference or for RUN (a numpy-equivalent C kernel is the natural reference of a program); timing
one is a LOAD_ERROR.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from device_agent.backends.base import ELF_MAGIC, JobFailed, NativeBackend, read_artifact
from device_agent.backends.cpu import CpuBackend
from device_agent.domain import (
    AccelCycles,
    EntryPoint,
    EvaluatorConfig,
    ModuleCycles,
    Status,
    Telemetry,
)
from device_agent.jobs import MEASURE, Job, JobResult
from device_agent.vta import image
from device_agent.vta.sim import SimReport, Simulator, VtaHazard, build, encode_code
from protos.vta import VtaSpec
from protos.vta_program import MAGIC, Program, ProgramError, decode_programs

_LOG = logging.getLogger(__name__)
SPEC_ENV = "KILN_VTA_SPEC"
# Decoded artifacts kept per child (an artifact may carry baked-in weights, so not all of them),
# and reports: a tuning run measures each candidate once, so neither needs to hold many.
_KEEP_ARTIFACTS = 16
_KEEP_REPORTS = 1024


def device_spec() -> VtaSpec:
    """The spec this device simulates: `VtaSpec()` with $KILN_VTA_SPEC's overrides.

    Raises:
        RuntimeError: the variable is not a JSON object of spec fields, or makes a bad spec.
    """
    text = os.environ.get(SPEC_ENV, "")
    if not text:
        return VtaSpec()
    try:
        overrides = json.loads(text)
        if not isinstance(overrides, dict):
            raise TypeError("not an object")
        return dataclasses.replace(VtaSpec(), **overrides)
    except (ValueError, TypeError) as e:
        raise RuntimeError(f"${SPEC_ENV} must be a JSON object of VtaSpec fields: {e}") from e


@dataclass(frozen=True)
class _Accel:
    """A loaded ACCEL_PROGRAM artifact: its programs and their encoded instructions."""

    path: str
    programs: dict[str, Program]
    code: dict[str, bytes]


@dataclass(frozen=True)
class _Host:
    """A loaded host shared object (a reference)."""

    lib: Any


class VtaSimBackend(NativeBackend):
    """Runs ACCEL_PROGRAM artifacts on the simulator; results are simulated (`emulated`)."""

    name = "vta_sim"
    formats = frozenset({"ACCEL_PROGRAM", "SHARED_OBJECT"})
    emulated = True

    def __init__(self) -> None:
        self.spec = device_spec()
        self._sim: Simulator | None = None
        self._host = CpuBackend()
        self._loaded: OrderedDict[str, _Accel] = OrderedDict()
        # (artifact path, symbol) -> its report: a program's cycles do not depend on its data.
        self._reports: OrderedDict[tuple[str, str], SimReport] = OrderedDict()
        self.last_report: SimReport | None = None

    def device_tags(self) -> dict[str, str]:
        """The accelerator (arch "vta" overrides the host's), its spec and clock, and the host's
        arch, for which a check reference is built."""
        return {
            "arch": "vta",
            "features": "vta",
            "emulated": "vta-sim",
            "vta_spec": self.spec.key(),
            "clock_mhz": str(self.spec.clock_mhz),
            "host_arch": platform.machine(),
        }

    def telemetry(self, host: Telemetry) -> Telemetry:
        """The host's load; the accelerator's clock as `cpu_mhz`; no temperature."""
        return Telemetry(load_1m=host.load_1m, cpu_mhz=float(self.spec.clock_mhz))

    def prepare(self, state_dir: str) -> None:
        """Build (once per host) and load the simulator.

        Raises:
            RuntimeError: no C compiler, or the build fails.
        """
        if self._sim is None:
            self._sim = Simulator(build(state_dir))

    @property
    def simulator(self) -> Simulator:
        if self._sim is None:
            self.prepare("")
        assert self._sim is not None
        return self._sim

    def load(self, path: str) -> _Accel | _Host:
        """The programs at `path`, decoded once per child; or a host shared object."""
        loaded = self._loaded.get(path)
        if loaded is not None:
            self._loaded.move_to_end(path)
            return loaded
        data = read_artifact(path)
        if data[:4] == ELF_MAGIC:
            return _Host(self._host.load(path))
        if data[:4] != MAGIC:
            raise JobFailed(Status.LOAD_ERROR, "cannot load artifact: not an accelerator program")
        try:
            programs = decode_programs(data)
        except ProgramError as e:
            raise JobFailed(Status.LOAD_ERROR, f"cannot load accelerator program: {e}") from e
        for symbol, program in programs.items():
            if program.spec != self.spec:
                raise JobFailed(
                    Status.LOAD_ERROR,
                    f"program {symbol} is compiled for spec {program.spec.key()}; this device "
                    f"simulates {self.spec.key()}",
                )
        code = {symbol: encode_code(p) for symbol, p in programs.items()}
        loaded = self._loaded[path] = _Accel(path, programs, code)
        if len(self._loaded) > _KEEP_ARTIFACTS:
            self._loaded.popitem(last=False)
        return loaded

    def call(self, module: Any, symbol: str, buffers: list[np.ndarray]) -> int:
        """Simulate the program `symbol` on `buffers` (all read back afterwards); 0 or JobFailed."""
        if isinstance(module, _Host):
            return self._host.call(module.lib, symbol, buffers)
        program = self._program(module, symbol)
        try:
            dram = image.make_image(program, buffers)
        except ValueError as e:
            raise JobFailed(Status.RUNTIME_ERROR, f"program {symbol}: {e}") from e
        try:
            report = self.simulator.run(self.spec, module.code[symbol], dram)
        except VtaHazard as e:
            raise JobFailed(Status.RUNTIME_ERROR, f"hazard {e.kind.name}: {e.message}") from e
        image.read_back(program, dram, buffers)
        self._reports[(module.path, symbol)] = self.last_report = report
        if len(self._reports) > _KEEP_REPORTS:
            self._reports.popitem(last=False)
        _LOG.debug(
            "%s: %d cycles, GEMM utilisation %.3f", symbol, report.total_cycles,
            report.gemm_utilisation,
        )  # fmt: skip
        return 0

    def execute(self, job: Job) -> JobResult:
        """As a native backend does; a measurement's result also carries its `AccelCycles`."""
        self.last_report = None
        result = super().execute(job)
        if job.kind != MEASURE or result.status is not Status.OK or self.last_report is None:
            return result
        return dataclasses.replace(result, accel=accel_cycles(self.last_report))

    def time(
        self, module: Any, entry: EntryPoint, buffers: list[np.ndarray], config: EvaluatorConfig
    ) -> tuple[list[float], int]:
        """`repeat` samples of the program's simulated seconds (one run, unless a check ran it)."""
        if isinstance(module, _Host):
            raise JobFailed(
                Status.LOAD_ERROR,
                "a vta_sim device times accelerator programs; a shared object serves only as a "
                "check reference or for Run",
            )
        report = self._reports.get((module.path, entry.symbol))
        if report is None:
            self.call(module, entry.symbol, buffers)
            assert self.last_report is not None
            report = self.last_report
        self.last_report = report
        return [report.seconds] * max(config.repeat, 1), max(config.number, 1)

    def _program(self, module: _Accel, symbol: str) -> Program:
        program = module.programs.get(symbol)
        if program is None:
            raise JobFailed(Status.LOAD_ERROR, f"no program {symbol} in the artifact")
        return program


def accel_cycles(report: SimReport) -> AccelCycles:
    """The wire's summary of a simulator report: total and GEMM cycles, and each module's."""
    modules = tuple(
        ModuleCycles(m.name.lower(), c.busy, c.token_stall, c.dram_wait)
        for m, c in sorted(report.modules.items())
    )
    return AccelCycles(report.total_cycles, report.gemm_cycles, modules)


def create() -> VtaSimBackend:
    """A new vta_sim backend."""
    return VtaSimBackend()

"""An embedded pool on 127.0.0.1: a real `kiln-tracker` and real `kiln-agent` child processes.

"Local" runs use the same tracker, agent and gRPC path as a remote pool; only the addresses differ.
Each daemon binds port 0 and writes its address to a ready file, which is how we learn the port.
The pool makes its own secrets file (protos.auth), so a local run goes through the same token
checks and signed lease tokens as a remote one; `client_token` is what a client must send.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import grpc

from protos import auth, tracker_pb2, tracker_pb2_grpc

_LOG = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class PoolStartError(RuntimeError):
    """A daemon of the local pool did not come up; the message carries its output."""


def _check_core_sets(sets: Sequence[tuple[int, ...]]) -> None:
    """Each set non-empty, no core in two sets (as `kiln-agent --cores` wants them)."""
    seen: set[int] = set()
    for cores in sets:
        if not cores:
            raise ValueError("a core set is empty")
        shared = seen & set(cores)
        if shared:
            raise ValueError(f"core(s) {sorted(shared)} are in two core sets")
        seen |= set(cores)


class LocalPool:
    """Starts one tracker and `agents` agents with `devices_per_agent` devices each under `key`.

    Use as a context manager; leaving it stops (by pid) every process it started.

    Args:
        devices: the pool's devices in all, spread evenly over the agents (overrides
            `devices_per_agent`); one agent process with several devices is the cheap way to
            have several.
        pin_cores: cores for the devices in order (device j of agent i is device
            i * devices_per_agent + j), reused round-robin; empty: no pinning. On a small
            machine, pin the agent to one core and give the builder the others.
        core_sets: instead of `pin_cores`, one set of cores per device, in the same order
            (`kiln-agent --cores`): the device runs its kernels on that many OpenMP threads,
            one on each core, and is tagged `threads=<cores in the set>`, so what is tuned on
            it is tuned (and recorded) for that many threads. Its length sets `devices`.

    Raises:
        ValueError: a count below 1, `devices` not a multiple of `agents`, a core this process
            may not use, core sets that overlap or do not give one set per device, or both
            `pin_cores` and `core_sets`.
    """

    def __init__(
        self,
        key: str = "local-cpu",
        backend: str = "cpu",
        agents: int = 1,
        devices_per_agent: int = 1,
        heartbeat_interval_s: float = 1.0,
        extra_agent_args: Sequence[str] = (),
        devices: int | None = None,
        pin_cores: Sequence[int] = (),
        core_sets: Sequence[Sequence[int]] = (),
    ) -> None:
        sets = tuple(tuple(sorted(c)) for c in core_sets)
        if sets:
            if pin_cores:
                raise ValueError("pin_cores and core_sets both pin devices: give one")
            if devices is not None and devices != len(sets):
                raise ValueError(f"{devices} devices but {len(sets)} core sets: one per device")
            devices = len(sets)
            _check_core_sets(sets)
        if devices is not None:
            if devices < 1 or agents < 1 or devices % agents:
                raise ValueError(f"{devices} devices do not split evenly over {agents} agent(s)")
            devices_per_agent = devices // agents
        if agents < 1 or devices_per_agent < 1:
            raise ValueError(
                f"agents and devices_per_agent must be >= 1, got {agents}, {devices_per_agent}"
            )
        allowed = os.sched_getaffinity(0)
        bad = sorted({*pin_cores, *(c for cores in sets for c in cores)} - allowed)
        if bad:
            raise ValueError(f"cannot pin to core(s) {bad}: this process may use {sorted(allowed)}")
        self.pin_cores = tuple(pin_cores)
        self.core_sets = sets
        self.key = key
        self.backend = backend
        self.n_agents = agents
        self.devices_per_agent = devices_per_agent
        self.heartbeat_interval_s = heartbeat_interval_s
        self.extra_agent_args = tuple(extra_agent_args)
        self.tracker_address = ""
        self.agent_addresses: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="kiln-pool-")
        self.workdir = Path(self._tmp.name)
        self.secrets_path = self.workdir / "pool.secrets"
        self.client_token = auth.write_secrets(self.secrets_path).token(auth.Role.CLIENT)

    def __enter__(self) -> LocalPool:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.tracker_address = self._spawn(
            "tracker",
            [
                "-m",
                "tracker",
                "--listen",
                "127.0.0.1:0",
                "--heartbeat-interval-s",
                str(self.heartbeat_interval_s),
                "--token-file",
                str(self.secrets_path),
                # A new pool, not a restart: its agents register before anyone asks.
                "--startup-grace-s",
                "0",
            ],
        )
        for i in range(self.n_agents):
            self.add_agent(i)
        self.wait_for_devices(self.n_devices)

    def add_agent(self, index: int | None = None) -> subprocess.Popen[bytes]:
        """Start one more agent (`devices_per_agent` devices, agent number `index`, default the
        next) and return its process; its address is appended to `agent_addresses`. Used by
        start(), and to bring a device back after a test killed one."""
        i = len(self.agent_addresses) if index is None else index
        pins: list[str] = []
        if self.pin_cores:
            first = i * self.devices_per_agent
            cores = [
                self.pin_cores[(first + j) % len(self.pin_cores)]
                for j in range(self.devices_per_agent)
            ]
            pins = ["--pin-cores", ",".join(map(str, cores))]
        elif self.core_sets:
            first = i * self.devices_per_agent
            for core_set in self.core_sets[first : first + self.devices_per_agent]:
                pins += ["--cores", ",".join(map(str, core_set))]
        address = self._spawn(
            f"agent{i}",
            [
                "-m",
                "device_agent",
                "--tracker",
                self.tracker_address,
                "--key",
                self.key,
                "--backend",
                self.backend,
                "--devices",
                str(self.devices_per_agent),
                "--listen",
                "127.0.0.1:0",
                "--cache-dir",
                str(self.workdir / f"cache{i}"),
                "--token-file",
                str(self.secrets_path),
                *pins,
                *self.extra_agent_args,
            ],
        )
        self.agent_addresses.append(address)
        return self.procs[-1]

    @property
    def n_devices(self) -> int:
        """How many devices the pool has in all."""
        return self.n_agents * self.devices_per_agent

    def _spawn(self, name: str, args: list[str]) -> str:
        ready = self.workdir / f"{name}.ready"
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            [sys.executable, *args, "--ready-file", str(ready)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if ready.exists():
                return ready.read_text().strip()
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        raise PoolStartError(
            f"{name} did not start (exit {proc.poll()}):\n{self.log(name)[-2000:]}"
        )

    def log(self, name: str) -> str:
        """The output of one daemon so far ("tracker", "agent0", ...)."""
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_devices(self, n: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the tracker lists at least n devices under our key."""
        with grpc.insecure_channel(self.tracker_address) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                resp = stub.ListDevices(
                    tracker_pb2.ListDevicesRequest(key=self.key),
                    timeout=5,
                    metadata=auth.call_metadata(self.client_token),
                )
                if len(resp.devices) >= n:
                    return
                time.sleep(0.05)
        raise PoolStartError(f"only {len(resp.devices)} of {n} devices registered in {timeout_s} s")

    def stop(self) -> None:
        """SIGTERM every process we started (agents first), then SIGKILL what outlives the grace."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _LOG.warning("pid %d ignored SIGTERM; killing it", proc.pid)
                proc.kill()
                proc.wait()
        self.procs.clear()
        self._tmp.cleanup()

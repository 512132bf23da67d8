"""A device's executor: runs jobs one at a time, in a supervised child when the backend is sandboxed.

The child is respawned right after any death (crash, timeout kill, cancel), so the next request is
served by a fresh process; `on_restart` hears of each respawn with its reason ("died", "timeout",
"cancelled", "malformed", or "retired": the child asked to be replaced after its result, see
`executor_child`). `env` adds to the child's environment (the cuda backend's
$CUDA_VISIBLE_DEVICES, so a device's child sees only its GPU). The child runs in its own session
so that killing its process group also ends anything a kernel forked, and asks the kernel
(PR_SET_PDEATHSIG) for SIGKILL when the agent dies, so a hung kernel never outlives a SIGKILLed
agent. Linux sends that signal when the *thread* that forked the child ends, so every child is
forked by one long-lived spawner thread, never by an RPC worker thread that may come and go.
With `pin_core`, the child is pinned to that core; with `cores`, to that set of cores. The child's
OpenMP runtime gets one thread per core of the set (one without a set: a device without a
`threads` tag runs kernels on one thread), each bound to its core (OMP_PROC_BIND / OMP_PLACES):
unbound, Linux at times left a worker on the main thread's core for seconds. libgomp keeps its
threads between parallel regions, so the child's kernels share one pool.

An executor does not queue: its caller hands it one job at a time (the servicer waits for the
device on its event loop, holding no thread), and a second job submitted meanwhile is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from device_agent.backends.base import Backend
from device_agent.domain import Status
from device_agent.framing import FrameError, encode_frame, read_frame
from device_agent.jobs import Job, JobResult, StopSignal, job_to_frame, result_from_frame

_LOG = logging.getLogger(__name__)
# How often a wait on the child looks at the client's cancel flag.
_POLL_S = 0.05
# How long a child that closed its pipe gets to exit before it is killed.
_REAP_S = 5.0
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One thread forks every executor child and lives as long as the agent (see the module docstring).
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-executor-spawner")


# How many times a libgomp thread polls (x86 `pause`, ~24 ns on the 2-vCPU AMD EPYC) at a
# barrier before it sleeps. libgomp's default, 300,000 (~7 ms), has a kernel whose other thread
# was descheduled by another process hold its own core polling for a scheduler quantum, where
# that process could have run and given the core back: on two cores beside an unpinned busy
# process, MobileNetV2 and ResNet-18 built for two threads took 1.4-2x less time per call with
# 10,000 (~0.25 ms, still longer than the gap between one kernel's parallel loop and the
# next), and no more when the cores were their own.
OPENMP_SPIN_COUNT = 10_000


def openmp_env(cores: tuple[int, ...]) -> dict[str, str]:
    """The OpenMP settings of a child pinned to `cores` (none: one thread): a thread per core,
    each bound to its own core, polling OPENMP_SPIN_COUNT times at a barrier before it sleeps."""
    places = ",".join(f"{{{c}}}" for c in cores)
    threads = {"OMP_PLACES": places, "GOMP_SPINCOUNT": str(OPENMP_SPIN_COUNT)}
    return {
        "OMP_NUM_THREADS": str(max(1, len(cores))),
        "OMP_PROC_BIND": "true" if cores else "false",
        **(threads if cores else {}),
    }


@dataclass(frozen=True)
class TimeLimit:
    """How long a job may run, and the error of its TIMEOUT result when it runs past that."""

    seconds: float
    error: str

    @classmethod
    def requested(cls, seconds: float) -> TimeLimit:
        """The limit a request asked for."""
        return cls(seconds, f"ran past {seconds:g} s; executor killed")


class _DeadlineExceeded(Exception):
    pass


class _Cancelled(Exception):
    pass


class Executor:
    """Runs the jobs of one device, one at a time."""

    def __init__(
        self,
        device_id: str,
        backend: Backend,
        address_space_bytes: int,
        pin_core: int | None = None,
        state_dir: str = "",
        on_restart: Callable[[str], None] | None = None,
        cores: tuple[int, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.device_id = device_id
        self._env = dict(env or {})
        self._on_restart = on_restart
        self._backend = backend
        self._address_space_bytes = address_space_bytes
        self._pin_core = pin_core
        self._cores = tuple(cores)
        self._state_dir = state_dir
        self._busy = threading.Lock()  # one job at a time on the device
        self._state = threading.Lock()  # guards _proc and _closed
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_thread: threading.Thread | None = None
        self._closed = False
        if backend.sandboxed:
            with self._state:
                self._spawn()

    def submit(
        self, job: Job, limit: TimeLimit, cancelled: threading.Event | None = None
    ) -> JobResult:
        """Run `job` within `limit` (a sandboxed backend's child is killed past it).

        Every failure is a result; so is a job submitted while another runs (RUNTIME_ERROR).
        """
        if not self._busy.acquire(blocking=False):
            error = f"device {self.device_id} is running another job"
            return JobResult(Status.RUNTIME_ERROR, error=error)
        try:
            if self._closed:
                return JobResult(Status.DEVICE_LOST, error="the agent is stopping")
            if cancelled is not None and cancelled.is_set():
                # Stopped before it started: the child is idle, so nothing is killed.
                return _stopped(cancelled, started=False)
            if not self._backend.sandboxed:
                return self._backend.execute(job)
            return self._submit_to_child(job, time.monotonic() + limit.seconds, limit, cancelled)
        finally:
            self._busy.release()

    @property
    def child_pid(self) -> int | None:
        """The pid of the current executor child, or None (unsandboxed backend, or closed)."""
        with self._state:
            return None if self._proc is None else self._proc.pid

    def close(self) -> None:
        """Kill the child and join its log thread; later submits get DEVICE_LOST."""
        with self._state:
            self._closed = True
            proc, thread = self._proc, self._log_thread
            self._proc = None
        if proc is not None:
            _kill(proc)
            _close_pipes(proc)
        if thread is not None:
            thread.join(timeout=_REAP_S)

    def _submit_to_child(
        self, job: Job, deadline: float, limit: TimeLimit, cancelled: threading.Event | None
    ) -> JobResult:
        with self._state:
            if self._proc is None:
                self._spawn()
            proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        waiter = _Waiter(deadline, cancelled)
        try:
            waiter.write_all(proc.stdin.fileno(), encode_frame(*job_to_frame(job)))
            frame = read_frame(waiter.reader(proc.stdout.fileno()))
            result = result_from_frame(frame)
        except _DeadlineExceeded:
            self._replace_child(proc, "timeout", kill=True)
            return JobResult(Status.TIMEOUT, error=limit.error)
        except _Cancelled:
            self._replace_child(proc, "cancelled", kill=True)
            assert cancelled is not None
            return _stopped(cancelled, started=True)
        except (EOFError, OSError):
            returncode = self._replace_child(proc, "died", kill=False)
            return _death_result(returncode)
        except (FrameError, KeyError, ValueError, TypeError) as e:
            self._replace_child(proc, "malformed", kill=True)
            return JobResult(Status.RUNTIME_ERROR, error=f"executor sent a malformed result: {e}")
        if frame[0].get("retire") is True:
            # The child exits on its own after this frame; its successor serves the next job.
            self._replace_child(proc, "retired", kill=False)
        return result

    def _replace_child(self, proc: subprocess.Popen[bytes], reason: str, kill: bool) -> int:
        """End `proc` (waiting a little for it when not killing) and spawn its successor."""
        if kill:
            _kill(proc)
        else:
            try:
                proc.wait(timeout=_REAP_S)
            except subprocess.TimeoutExpired:
                _kill(proc)
        _close_pipes(proc)
        returncode = proc.returncode
        _LOG.info("executor of %s ended (%s); respawning", self.device_id, _describe(returncode))
        respawned = False
        with self._state:
            if self._proc is proc:
                self._proc = None
                if not self._closed:
                    self._spawn()
                    respawned = True
        if respawned and self._on_restart is not None:
            self._on_restart(reason)
        return returncode

    def _spawn(self) -> None:
        """Start a child; the caller holds `_state`."""
        env = dict(os.environ)
        # The child must import this package even where it is not installed (a copied checkout).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, env.get("PYTHONPATH")]))
        env.update(openmp_env(self._cores))
        env.update(self._env)
        cmd = [
            sys.executable,
            "-m",
            "device_agent.executor_child",
            "--backend",
            self._backend.name,
            "--address-space-bytes",
            str(self._address_space_bytes),
            "--parent-pid",
            str(os.getpid()),
            "--state-dir",
            self._state_dir,
        ]
        proc = _SPAWNER.submit(
            subprocess.Popen,
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        ).result()
        cores = set(self._cores) if self._pin_core is None else {self._pin_core, *self._cores}
        if cores:
            # Pinned here, before the first job can reach it (the child could race a test), and
            # before its first kernel loads libgomp, which reads the affinity once.
            os.sched_setaffinity(proc.pid, cores)
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)
        self._proc = proc
        self._log_thread = threading.Thread(
            target=_forward_log, args=(proc, self.device_id), daemon=True
        )
        self._log_thread.start()


class _Waiter:
    """Pipe I/O that gives up at a deadline or when the client cancels.

    On the hot path (a fast kernel) the write fits the pipe and the answer is one read: a syscall
    each, with a poll only when the pipe is not ready.
    """

    def __init__(self, deadline: float, cancelled: threading.Event | None) -> None:
        self._deadline = deadline
        self._cancelled = cancelled
        self._polls: dict[tuple[int, int], select.poll] = {}
        self._buffer = bytearray()

    def _wait(self, fd: int, events: int) -> bool:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _DeadlineExceeded
        if self._cancelled is not None and self._cancelled.is_set():
            raise _Cancelled
        poll = self._polls.get((fd, events))
        if poll is None:
            poll = self._polls[(fd, events)] = select.poll()
            poll.register(fd, events)
        return bool(poll.poll(int(min(remaining, _POLL_S) * 1000) + 1))

    def write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            # The fd is non-blocking: a full pipe raises BlockingIOError, then we wait.
            with contextlib.suppress(BlockingIOError):
                view = view[os.write(fd, view) :]
                continue
            self._wait(fd, select.POLLOUT)

    def reader(self, fd: int) -> Callable[[int], bytes]:
        def read_exact(n: int) -> bytes:
            while len(self._buffer) < n:
                if self._wait(fd, select.POLLIN):
                    data = os.read(fd, max(n - len(self._buffer), 1 << 16))
                    if not data:
                        raise EOFError("executor closed its pipe")
                    self._buffer += data
            out = bytes(self._buffer[:n])
            del self._buffer[:n]
            return out

        return read_exact


def _death_result(returncode: int) -> JobResult:
    if returncode < 0:
        return JobResult(
            Status.CRASH, error=f"executor {_describe(returncode)}", signal=-returncode
        )
    return JobResult(Status.RUNTIME_ERROR, error=f"executor {_describe(returncode)}")


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=_REAP_S)
    except subprocess.TimeoutExpired:
        _LOG.error("executor %d did not die after SIGKILL", proc.pid)


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _forward_log(proc: subprocess.Popen[bytes], device_id: str) -> None:
    """Copy the child's stderr into the agent log until the child and its descendants close it."""
    assert proc.stderr is not None
    with proc.stderr:
        for line in proc.stderr:
            _LOG.info("[%s] %s", device_id, line.decode(errors="replace").rstrip())


def _stopped(signal: threading.Event, started: bool) -> JobResult:
    """The result of a job stopped by `signal`: by the agent (its reason), else by its client."""
    if isinstance(signal, StopSignal) and signal.reason:
        how = "; executor killed" if started else " (stopped before it started)"
        return JobResult(Status.UNAUTHORIZED, error=signal.reason + how)
    how = "; executor killed" if started else " before it started"
    return JobResult(Status.RUNTIME_ERROR, error="cancelled by the client" + how)

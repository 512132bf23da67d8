"""The executor child: runs one backend's jobs for the agent that spawned it, one at a time.

Started by `device_agent.executor.Executor` as `python -m device_agent.executor_child --backend NAME
--address-space-bytes N --parent-pid PID [--state-dir D]`. Job frames arrive on stdin
and result frames leave on stdout (see `framing`); stderr is the agent's log. A kernel that crashes
takes only this process down; the agent's death takes this process down (PR_SET_PDEATHSIG).

A backend whose process state a job has ruined sets `Backend.poisoned` (the cuda backend,
after a sticky CUDA error: the GPU context is lost for the life of the process). The child then
marks its result frame `"retire": true`, exits once the frame is written, and the executor starts
its successor at once, so the next job meets a fresh process instead of the lost context. A
backend whose `Backend.limits_address_space` is false runs without the RLIMIT_AS cap (the CUDA driver
reserves virtual address space far past any such cap and fails to start under it).
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import logging
import os
import resource
import signal
import sys
from typing import BinaryIO

from device_agent.backends import get_backend
from device_agent.domain import Status
from device_agent.framing import encode_frame, file_reader, read_frame
from device_agent.jobs import JobResult, job_from_frame, result_to_frame

_LOG = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Serve jobs until stdin closes."""
    parser = argparse.ArgumentParser(prog="device_agent.executor_child")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--address-space-bytes", type=int, default=0)
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--state-dir", default="")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="executor %(process)d: %(message)s")
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    proto_in, proto_out = _claim_pipes()
    # A crashing kernel must not leave core files in the agent's working directory.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    backend = get_backend(args.backend)
    if backend.limits_address_space:
        _limit_address_space(args.address_space_bytes)
    # On a fatal signal, print the Python stack to the agent log, then die of the same signal so
    # the agent still reads the signal from the exit status.
    faulthandler.enable()
    backend.prepare(args.state_dir)
    read_exact = file_reader(proto_in)
    while True:
        try:
            frame = read_frame(read_exact)
        except EOFError:
            return 0
        try:
            result = backend.execute(job_from_frame(frame))
        except Exception as e:
            _LOG.exception("job failed")
            result = JobResult(
                Status.RUNTIME_ERROR, error=f"executor raised {type(e).__name__}: {e}"
            )
        header, blobs = result_to_frame(result)
        poisoned = backend.poisoned
        if poisoned:
            header["retire"] = True
        proto_out.write(encode_frame(header, blobs))
        proto_out.flush()
        if poisoned:
            _LOG.warning("retiring: %s", poisoned)
            # No interpreter teardown: libraries' exit handlers may call into the lost context.
            os._exit(0)


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux for SIGKILL when the parent dies; exit now if it already has (it raced us)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        _LOG.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent_pid:
        os._exit(0)


def _claim_pipes() -> tuple[BinaryIO, BinaryIO]:
    """Move the protocol pipes off fds 0 and 1, so a kernel that prints cannot corrupt a frame."""
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto_in, proto_out


def _limit_address_space(limit_bytes: int) -> None:
    if limit_bytes <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))


if __name__ == "__main__":
    sys.exit(main())

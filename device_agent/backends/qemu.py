"""Shared objects cross-compiled for aarch64, run on this host under qemu-user.

Python cannot run under qemu-user here, so a small C runner (`qemu_runner.c`, next to this file)
does the foreign part: `prepare` cross-compiles it once with `aarch64-linux-gnu-gcc` into the
backend's state directory (named by the hash of its source), and every call or timing of an entry
runs `qemu-aarch64 -L <sysroot> <runner> <artifact>` with one request on its stdin (the argument
buffers, made by the executor child from the seed exactly as the cpu backend makes them) and one
answer on its stdout (see the runner's header for the format).

Supervision is the executor's, as for cpu: qemu runs in the executor child's process group, so a
timeout kill ends it too; it also gets PR_SET_PDEATHSIG, so it dies with the executor child. A
guest that dies of a signal makes qemu die of the same signal, reported as CRASH with it.

Correctness checks (CheckSpec, WRONG_ANSWER) run for real. Timings are the emulator's, so every
result is labelled `emulated`: good for comparing nothing but emulated runs with each other.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import signal
import struct
import subprocess
import tempfile
from typing import Any

import numpy as np

from device_agent.backends.base import JobFailed, NativeBackend
from device_agent.domain import EntryPoint, EvaluatorConfig, Status

CROSS_CC = os.environ.get("KILN_QEMU_CC", "aarch64-linux-gnu-gcc")
QEMU = os.environ.get("KILN_QEMU", "qemu-aarch64")
SYSROOT = os.environ.get("QEMU_LD_PREFIX", "/usr/aarch64-linux-gnu")
_RUNNER_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qemu_runner.c")
_EM_AARCH64 = 183
_MAGIC = 0x314E514B
_MODE_CALL, _MODE_TIME = 0, 1
_HEAD = struct.Struct("<IiiI")
_STATUS = {
    1: Status.LOAD_ERROR,
    2: Status.LOAD_ERROR,
    3: Status.RUNTIME_ERROR,
    4: Status.RUNTIME_ERROR,
}
# How much of qemu's stderr an error message carries.
_STDERR_TAIL = 600
_PR_SET_PDEATHSIG = 1


class QemuBackend(NativeBackend):
    """Runs aarch64 SHARED_OBJECT artifacts under qemu-user; results are `emulated`."""

    name = "qemu"
    formats = frozenset({"SHARED_OBJECT"})
    emulated = True
    check_call_warms = False  # every call and every timing loop is a fresh emulator process

    def __init__(self) -> None:
        self._runner = ""

    def device_tags(self) -> dict[str, str]:
        """The guest's arch (it overrides the host's), what it offers code built for the
        aarch64-neon target (-march=armv8.2-a: qemu's default guest CPU has all of it), and
        the emulation."""
        return {"arch": "aarch64", "features": "neon", "emulated": "qemu-user"}

    def prepare(self, state_dir: str) -> None:
        """Cross-compile the runner into `state_dir` unless it is there already.

        Raises:
            RuntimeError: the cross compiler, qemu or the sysroot is missing, or the build fails.
        """
        missing = [tool for tool in (CROSS_CC, QEMU) if shutil.which(tool) is None]
        if missing:
            raise RuntimeError(
                f"the qemu backend needs {' and '.join(missing)} (Debian: gcc-aarch64-linux-gnu, "
                "qemu-user; scripts/setup.sh installs them)"
            )
        if not os.path.isdir(SYSROOT):
            raise RuntimeError(f"the qemu backend needs the aarch64 sysroot {SYSROOT}")
        with open(_RUNNER_SOURCE, "rb") as f:
            digest = hashlib.sha256(f.read() + CROSS_CC.encode()).hexdigest()[:16]
        state_dir = state_dir or os.path.join(tempfile.gettempdir(), "kiln-qemu")
        runner = os.path.join(os.path.abspath(state_dir), f"kiln-qemu-runner-{digest}")
        if not os.path.exists(runner):
            _build_runner(runner)
        self._runner = runner

    def load(self, path: str) -> str:
        """Check that `path` is an aarch64 ELF; the runner loads it in each call."""
        try:
            with open(path, "rb") as f:
                head = f.read(20)
        except OSError as e:
            raise JobFailed(Status.LOAD_ERROR, f"cannot read artifact: {e.strerror}") from e
        if len(head) < 20 or head[:4] != b"\x7fELF":
            raise JobFailed(Status.LOAD_ERROR, "cannot load artifact: not an ELF file")
        (machine,) = struct.unpack_from("<H", head, 18)
        if machine != _EM_AARCH64:
            raise JobFailed(
                Status.LOAD_ERROR,
                f"cannot load artifact: ELF machine {machine} is not aarch64 ({_EM_AARCH64})",
            )
        return path

    def call(self, module: Any, symbol: str, buffers: list[np.ndarray]) -> int:
        """`symbol(args)` once in the emulator; the buffers get the bytes the call left."""
        _check_symbol(symbol)
        rc, body = self._exchange(str(module), _MODE_CALL, symbol, buffers, b"")
        offset = 0
        for buffer in buffers:
            size = buffer.nbytes
            chunk = body[offset : offset + size]
            if len(chunk) != size:
                raise JobFailed(Status.RUNTIME_ERROR, "qemu runner answered a truncated buffer")
            np.copyto(buffer, np.frombuffer(chunk, dtype=buffer.dtype).reshape(buffer.shape))
            offset += size
        return rc

    def time(
        self, module: Any, entry: EntryPoint, buffers: list[np.ndarray], config: EvaluatorConfig
    ) -> tuple[list[float], int]:
        """The entry's own timing loop, run in the emulator."""
        _check_symbol(entry.timing_symbol)
        repeat = max(config.repeat, 1)
        timing = struct.pack(
            "<iiiddq",
            config.warmup,
            max(config.number, 1),
            repeat,
            config.min_repeat_ms,
            config.cooldown_ms,
            config.flush_cache_bytes,
        )
        rc, body = self._exchange(str(module), _MODE_TIME, entry.timing_symbol, buffers, timing)
        if rc != 0:
            raise JobFailed(Status.RUNTIME_ERROR, f"entry {entry.timing_symbol} returned {rc}")
        if len(body) != 4 + 8 * repeat:
            raise JobFailed(Status.RUNTIME_ERROR, "qemu runner answered truncated samples")
        (number_used,) = struct.unpack_from("<i", body)
        samples = list(struct.unpack_from(f"<{repeat}d", body, 4))
        return samples, number_used

    def _exchange(
        self, artifact: str, mode: int, symbol: str, buffers: list[np.ndarray], tail: bytes
    ) -> tuple[int, bytes]:
        """Run the runner once; return (the entry's return code, the answer after its head)."""
        name = symbol.encode()
        parts = [
            struct.pack("<III", _MAGIC, mode, len(name)),
            name,
            struct.pack("<I", len(buffers)),
        ]
        for buffer in buffers:
            parts += [struct.pack("<Q", buffer.nbytes), np.ascontiguousarray(buffer).tobytes()]
        parts.append(tail)
        proc = subprocess.run(
            [QEMU, "-L", SYSROOT, self._runner, artifact],
            input=b"".join(parts),
            capture_output=True,
            preexec_fn=_die_with_parent,  # safe: the executor child runs one thread
            check=False,
        )
        err = proc.stderr.decode(errors="replace").strip()[-_STDERR_TAIL:]
        if proc.returncode < 0:
            number = -proc.returncode
            raise JobFailed(
                Status.CRASH, f"emulated entry killed by {_signal_name(number)}: {err}", number
            )
        out = proc.stdout
        if proc.returncode != 0 or len(out) < _HEAD.size:
            raise JobFailed(
                Status.RUNTIME_ERROR, f"qemu runner exited with code {proc.returncode}: {err}"
            )
        magic, status, rc, msg_len = _HEAD.unpack_from(out)
        if magic != _MAGIC:
            raise JobFailed(Status.RUNTIME_ERROR, "qemu runner answered garbage")
        message = out[_HEAD.size : _HEAD.size + msg_len].decode(errors="replace")
        if status != 0:
            kind = _STATUS.get(status, Status.RUNTIME_ERROR)
            if status == 2:
                raise JobFailed(kind, f"symbol {symbol} not found in artifact")
            raise JobFailed(kind, f"qemu runner: {message}")
        return rc, out[_HEAD.size + msg_len :]


def _check_symbol(symbol: str) -> None:
    if not symbol:
        raise JobFailed(Status.LOAD_ERROR, "the entry names no symbol")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _die_with_parent() -> None:
    """In the forked qemu: SIGKILL when the executor child dies (set between fork and exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _build_runner(runner: str) -> None:
    """Compile the runner to a temp name beside `runner`, then rename it into place."""
    directory = os.path.dirname(runner)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".runner-")
    os.close(fd)
    try:
        proc = subprocess.run(
            [CROSS_CC, "-O2", "-o", tmp, _RUNNER_SOURCE, "-ldl"],
            capture_output=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{CROSS_CC} could not build the qemu runner: "
                f"{proc.stderr.decode(errors='replace')[-2000:]}"
            )
        os.chmod(tmp, 0o700)
        os.replace(tmp, runner)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def create() -> QemuBackend:
    """A new qemu backend."""
    return QemuBackend()

"""`kiln-agent --cores`: a device per core set, tagged with its thread count, its executor child
pinned to the set with one OpenMP thread per core (a real agent process on 127.0.0.1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from device_agent.__main__ import parse_args, parse_core_set
from device_agent.executor import OPENMP_SPIN_COUNT, openmp_env
from protos import agent_pb2, agent_pb2_grpc

RPC_S = 10.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CORES = sorted(os.sched_getaffinity(0))


def _spec(cores: list[int]) -> str:
    return ",".join(map(str, cores))


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {field} for {pid}")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _parse_cpu_list(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def test_core_sets_parse_and_must_be_disjoint(capsys: pytest.CaptureFixture[str]) -> None:
    first = CORES[0]
    assert parse_core_set(f"{first}") == (first,)
    if len(CORES) > 1 and CORES[1] == first + 1:
        assert parse_core_set(f"{first}-{first + 1}") == (first, first + 1)
    for bad, message in (("3-1", "like 0-3"), ("x", "like 0-3"), ("4096", "not usable")):
        with pytest.raises(ValueError, match=message):
            parse_core_set(bad)
    args = parse_args(["--key", "k", "--cores", _spec(CORES)])
    assert args.cores == (tuple(CORES),) and args.devices == 1
    for argv in (
        ["--cores", str(first), "--cores", str(first)],  # a core in two sets
        ["--cores", str(first), "--pin-cores", str(first)],
        ["--cores", str(first), "--devices", "3"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--key", "k", *argv])
        assert exit_info.value.code == 2
    assert "two sets" in capsys.readouterr().err
    assert openmp_env(()) == {"OMP_NUM_THREADS": "1", "OMP_PROC_BIND": "false"}
    assert openmp_env((2, 5))["OMP_PLACES"] == "{2},{5}"
    assert openmp_env((2, 5))["GOMP_SPINCOUNT"] == str(OPENMP_SPIN_COUNT)


def test_agent_process_tags_each_core_set_with_its_threads(tmp_path: Path) -> None:
    sets = [CORES[: len(CORES) // 2], CORES[len(CORES) // 2 :]] if len(CORES) > 1 else [CORES]
    ready = tmp_path / "ready"
    cmd = [sys.executable, "-m", "device_agent", "--backend", "cpu", "--key", "k"]
    for cores in sets:
        cmd += ["--cores", _spec(cores)]
    cmd += ["--listen", "127.0.0.1:0", "--ready-file", str(ready)]
    cmd += ["--cache-dir", str(tmp_path / "cache"), "--agent-id", "cores-agent"]
    proc = subprocess.Popen(
        cmd, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30.0
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), f"no ready file; agent exited with {proc.poll()}"
        with grpc.insecure_channel(ready.read_text().strip()) as channel:
            info = agent_pb2_grpc.AgentStub(channel).Info(agent_pb2.InfoRequest(), timeout=RPC_S)
        threads = [d.tags["threads"] for d in info.devices]
        assert threads == [str(len(cores)) for cores in sets]
        # one executor child per device, pinned to its set, one OpenMP thread per core
        children = [c for c in _children(proc.pid) if b"executor_child" in _cmdline(c)]
        assert len(children) == len(sets)
        seen = sorted(
            (sorted(_parse_cpu_list(_status(c, "Cpus_allowed_list"))), _environ(c))
            for c in children
        )
        for (allowed, env), cores in zip(seen, sorted(sets), strict=True):
            assert allowed == cores
            assert env["OMP_NUM_THREADS"] == str(len(cores)) and env["OMP_PROC_BIND"] == "true"
            assert env["GOMP_SPINCOUNT"] == str(OPENMP_SPIN_COUNT)  # no milliseconds of polling
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20.0)
        assert proc.returncode == 0, stderr.decode()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10.0)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""

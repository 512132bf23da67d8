"""An agent's lifecycle at a real tracker: stable ids, a graceful stop that leaves, a crash that
does not, and a restart that takes its devices back.

Real `python -m tracker` and `python -m device_agent` processes on 127.0.0.1, secured with a pool
secrets file (so Deregister must carry the `agent` token), heartbeats every 0.4 s. The agents run
without --agent-id: their ids are the stable default (host, key and cache dir).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from device_agent.agent import default_agent_id
from protos import tracker_pb2, tracker_pb2_grpc
from protos.auth import PoolSecrets, Role, call_metadata, write_secrets

REPO_ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 0.4
KEY = "lifecycle"
WAIT_S = 30.0  # bound on every wait below; none should come near it
RPC_S = 10.0


def wait_until(what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not reached in {WAIT_S} s"
        time.sleep(0.02)


@dataclass
class Pool:
    """A secured tracker and agents, all child processes of this test, ended by pid."""

    workdir: Path
    secrets: PoolSecrets
    secrets_path: Path
    tracker: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: int = 0

    def spawn(self, name: str, args: list[str]) -> str:
        """Start `python <args> --ready-file F`; return the first line it writes there."""
        self.starts += 1
        ready = self.workdir / f"{name}-{self.starts}.ready"
        with open(self.workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, *args, "--ready-file", str(ready)],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[f"{name}-{self.starts}"] = proc
        deadline = time.monotonic() + WAIT_S
        while not ready.exists():
            assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{self.log(name)}"
            assert time.monotonic() < deadline, f"{name} never became ready:\n{self.log(name)}"
            time.sleep(0.02)
        return ready.read_text().splitlines()[0]

    def start_tracker(self) -> None:
        self.tracker = self.spawn(
            "tracker",
            ["-m", "tracker", "--listen", "127.0.0.1:0", "--heartbeat-interval-s", str(HEARTBEAT_S),
             "--token-file", str(self.secrets_path)],
        )  # fmt: skip

    def start_agent(self, name: str) -> subprocess.Popen[bytes]:
        """An agent of KEY with two null devices and its own cache dir, and no --agent-id."""
        self.spawn(
            name,
            ["-m", "device_agent", "--tracker", self.tracker, "--key", KEY, "--backend", "null",
             "--devices", "2", "--listen", "127.0.0.1:0", "--token-file", str(self.secrets_path),
             "--cache-dir", self.cache_dir(name)],
        )  # fmt: skip
        return self.procs[f"{name}-{self.starts}"]

    def cache_dir(self, name: str) -> str:
        return str(self.workdir / f"{name}-cache")

    def device_ids(self, name: str) -> set[str]:
        """The device ids agent `name` registers: from its host, key and cache dir."""
        agent_id = default_agent_id(KEY, self.cache_dir(name))
        return {f"{agent_id}/0", f"{agent_id}/1"}

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def devices(self, channel: grpc.Channel) -> dict[str, int]:
        """Device id -> state of every device the tracker lists (as admin)."""
        reply = tracker_pb2_grpc.TrackerStub(channel).ListDevices(
            tracker_pb2.ListDevicesRequest(),
            timeout=RPC_S,
            metadata=call_metadata(self.secrets.token(Role.ADMIN)),
        )
        return {d.spec.device_id: d.state for d in reply.devices}

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(WAIT_S)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    secrets_path = tmp_path / "pool.secrets"
    p = Pool(tmp_path, write_secrets(secrets_path), secrets_path)
    try:
        p.start_tracker()
        yield p
    finally:
        p.stop()


@pytest.fixture
def channel(pool: Pool) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(pool.tracker) as ch:
        yield ch


def all_free(pool: Pool, channel: grpc.Channel, ids: set[str]) -> Callable[[], bool]:
    def check() -> bool:
        listed = pool.devices(channel)
        return all(listed.get(device_id) == tracker_pb2.FREE for device_id in ids)

    return check


def test_sigterm_deregisters_and_a_restart_comes_back_under_the_same_ids(
    pool: Pool, channel: grpc.Channel
) -> None:
    a, b = pool.device_ids("a"), pool.device_ids("b")
    assert a.isdisjoint(b), "two agents of one key on one host need distinct ids"
    first = pool.start_agent("a")
    pool.start_agent("b")
    wait_until("both agents FREE", all_free(pool, channel, a | b))
    assert set(pool.devices(channel)) == a | b

    first.send_signal(signal.SIGTERM)
    assert first.wait(WAIT_S) == 0, pool.log("a")
    # Gone as soon as the agent has exited: not FREE until its heartbeats lapse, then LOST.
    assert set(pool.devices(channel)) == b, pool.log("a")
    assert "deregistered 2 device(s)" in pool.log("a")

    pool.start_agent("a")
    wait_until("a's devices FREE again", all_free(pool, channel, a))
    assert set(pool.devices(channel)) == a | b


def test_sigkill_leaves_lost_devices_that_a_restart_replaces(
    pool: Pool, channel: grpc.Channel
) -> None:
    ids = pool.device_ids("a")
    first = pool.start_agent("a")
    wait_until("devices FREE", all_free(pool, channel, ids))

    first.kill()
    first.wait(WAIT_S)
    wait_until(
        "devices LOST",
        lambda: all(pool.devices(channel).get(d) == tracker_pb2.LOST for d in ids),
    )

    pool.start_agent("a")
    wait_until("devices FREE again", all_free(pool, channel, ids))
    assert set(pool.devices(channel)) == ids, "a restart added rows instead of replacing them"

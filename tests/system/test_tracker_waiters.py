"""Waiting Acquires hold no thread: a tracker with hundreds of them keeps serving everyone else.

A real `kiln-tracker` process (heartbeats every 0.4 s; memory store, then redis) with 300 Acquires waiting on one leased
device answers ListDevices, Release, a live agent's Heartbeat and a Register within 1 s each, keeps
the agent live, and its thread count does not grow with the waiters. (The threaded server it
replaced parked one of its 64 threads per waiter: the 65th call waited for a thread.)

In-process trackers (memory, then redis) whose pool the tests inspect: a waiter whose client cancels
leaves the queue at once and the device goes to the next waiter; a lease granted to such a waiter
in the race (the grant on its way to the store when the client left) is released.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc
from tracker.config import TrackerConfig
from tracker.server import ServingTracker, create_server
from tracker.testing import RedisServer

REPO_ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 0.4
WAITERS = 300
CHANNELS = 3
WAITER_DEADLINE_S = 20.0
ANSWER_S = 1.0  # the deadline of each call that must not queue behind the waiters
# Threads the tracker may add while the waiters queue, independent of their number: the pool and
# its store run on the event loop, so only gRPC's own (its executor) may start a few.
THREAD_GROWTH_BOUND = 4
START_TIMEOUT_S = 30.0
WAIT_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 10.0


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float = WAIT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout_s} s"
        time.sleep(0.01)


def thread_count(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no Threads line for pid {pid}")


def register(stub: Any, agent_id: str, key: str = "busy", timeout_s: float = RPC_TIMEOUT_S) -> Any:
    request = tracker_pb2.RegisterRequest(
        agent_id=agent_id,
        agent_address="127.0.0.1:7000",
        devices=[common_pb2.DeviceSpec(key=key)],
    )
    return stub.Register(request, timeout=timeout_s)


def acquire_now(stub: Any, user: str) -> Any:
    response = stub.Acquire(
        tracker_pb2.AcquireRequest(key="busy", user=user), timeout=RPC_TIMEOUT_S
    )
    assert response.status == common_pb2.OK, response.reason
    return response.lease


def wait_for(stub: Any, user: str) -> Any:
    request = tracker_pb2.AcquireRequest(key="busy", user=user, timeout_s=WAITER_DEADLINE_S)
    return stub.Acquire.future(request, timeout=WAITER_DEADLINE_S)


def the_device(stub: Any, timeout_s: float = RPC_TIMEOUT_S) -> Any:
    devices = stub.ListDevices(tracker_pb2.ListDevicesRequest(key="busy"), timeout=timeout_s)
    [device] = devices.devices
    return device


class Heartbeats:
    """A live agent's heartbeats, each with a 1 s deadline, from a thread; records failures."""

    def __init__(self, stub: Any, agent_id: str) -> None:
        self.failures: list[str] = []
        self.sent = 0
        self._stub = stub
        self._agent_id = agent_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(RPC_TIMEOUT_S)

    def _run(self) -> None:
        request = tracker_pb2.HeartbeatRequest(agent_id=self._agent_id)
        while not self._stop.wait(HEARTBEAT_S / 2):
            try:
                if not self._stub.Heartbeat(request, timeout=ANSWER_S).known:
                    self.failures.append("tracker forgot the agent")
            except grpc.RpcError as error:
                self.failures.append(f"{error.code().name}: {error.details()}")
            self.sent += 1


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory"
    redis_server: RedisServer = request.getfixturevalue("redis_server")
    return redis_server.url(prefix=f"waiters-{uuid.uuid4().hex[:12]}:")


@pytest.fixture
def tracker_process(tmp_path: Path, store: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    ready = tmp_path / "tracker.ready"
    log = tmp_path / "tracker.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tracker", "--listen", "127.0.0.1:0", "--store", store,
             "--heartbeat-interval-s", str(HEARTBEAT_S), "--startup-grace-s", "0",
             "--ready-file", str(ready)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "tracker never became ready"
            time.sleep(0.02)
        yield ready.read_text().splitlines()[0], process
    finally:
        process.terminate()
        try:
            process.wait(RPC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(RPC_TIMEOUT_S)


def test_300_waiters_leave_the_tracker_serving_everyone_else(
    tracker_process: tuple[str, subprocess.Popen[bytes]],
) -> None:
    address, process = tracker_process
    channels = [grpc.insecure_channel(address) for _ in range(CHANNELS)]
    stubs = [tracker_pb2_grpc.TrackerStub(channel) for channel in channels]
    stub = stubs[0]
    waiters: list[Any] = []
    try:
        register(stub, "agent-live")
        with Heartbeats(stub, "agent-live") as heartbeats:
            holder = acquire_now(stub, "holder")
            idle_threads = thread_count(process.pid)
            waiters = [wait_for(stubs[i % CHANNELS], f"waiter-{i}") for i in range(WAITERS)]
            wait_until(f"{WAITERS} queued", lambda: the_device(stub).queue_depth == WAITERS)
            busy_threads = thread_count(process.pid)
            assert busy_threads - idle_threads <= THREAD_GROWTH_BOUND, (idle_threads, busy_threads)

            # Each answered within ANSWER_S (its deadline), with every waiter still queued.
            device = the_device(stub, timeout_s=ANSWER_S)
            assert (device.state, device.lease_holder) == (tracker_pb2.LEASED, "holder")
            heartbeat = tracker_pb2.HeartbeatRequest(agent_id="agent-live")
            assert stub.Heartbeat(heartbeat, timeout=ANSWER_S).known
            response = register(stubs[1], "agent-new", key="other", timeout_s=ANSWER_S)
            assert response.heartbeat_interval_s == HEARTBEAT_S
            release = tracker_pb2.ReleaseRequest(lease_id=holder.lease_id)
            assert stubs[2].Release(release, timeout=ANSWER_S).released

            # The device went to one of the waiters; the others still wait.
            wait_until(
                "a waiter granted", lambda: the_device(stub).lease_holder.startswith("waiter-")
            )
            assert the_device(stub).queue_depth == WAITERS - 1
            # Several heartbeat intervals under load: the agent was never judged silent.
            time.sleep(3 * HEARTBEAT_S)
            assert the_device(stub).state == tracker_pb2.LEASED
        assert heartbeats.sent > 0 and heartbeats.failures == []
        assert thread_count(process.pid) - idle_threads <= THREAD_GROWTH_BOUND
    finally:
        for waiter in waiters:
            waiter.cancel()
        for channel in channels:
            channel.close()


# ---------------------------------------------------------------- in-process, per store


@pytest.fixture
def tracker(store: str) -> Iterator[ServingTracker]:
    config = TrackerConfig(heartbeat_interval_s=5.0, startup_grace_s=0.0, store=store)
    threads_before = set(threading.enumerate())
    serving = create_server("127.0.0.1:0", config)
    try:
        yield serving
    finally:
        serving.stop(grace_s=0.5)
    # The loop thread (the reaper and the store's watcher run on it) is gone. (gRPC's
    # asyncio poller thread starts with the first aio server of a process and stays.)
    left = [
        thread.name
        for thread in set(threading.enumerate()) - threads_before
        if "_poll_wrapper" not in thread.name
    ]
    assert left == []


@pytest.fixture
def stub(tracker: ServingTracker) -> Iterator[Any]:
    with grpc.insecure_channel(tracker.address) as channel:
        yield tracker_pb2_grpc.TrackerStub(channel)


def test_cancelled_waiter_leaves_at_once_and_the_next_waiter_gets_the_device(
    tracker: ServingTracker, stub: Any
) -> None:
    register(stub, "agent")
    holder = acquire_now(stub, "holder")
    ghost = wait_for(stub, "ghost")
    wait_until("the ghost queued", lambda: tracker.pool.waiting == 1)
    ghost.cancel()
    wait_until("the ghost dropped", lambda: tracker.pool.waiting == 0, timeout_s=0.5)
    assert the_device(stub).queue_depth == 0
    following = wait_for(stub, "next")
    wait_until("the next waiter queued", lambda: tracker.pool.waiting == 1)
    stub.Release(tracker_pb2.ReleaseRequest(lease_id=holder.lease_id), timeout=RPC_TIMEOUT_S)
    response = following.result(timeout=RPC_TIMEOUT_S)
    assert (response.status, response.lease.user) == (common_pb2.OK, "next")
    device = the_device(stub)
    assert (device.state, device.lease_holder, device.queue_depth) == (
        tracker_pb2.LEASED,
        "next",
        0,
    )


def test_a_lease_granted_to_a_waiter_whose_client_left_is_released(
    tracker: ServingTracker, stub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(stub, "agent")
    holder = acquire_now(stub, "holder")
    store = tracker.pool._store
    grant = store.grant
    granted_in_race: list[Any] = []

    async def grant_after_the_client_left(request: Any, *args: Any, **kwargs: Any) -> Any:
        if request.user == "ghost":
            # The dispatch that the holder's release started asks the store for the ghost's
            # device; its client leaves before the answer comes: the device is granted to the
            # waiter of a client that is gone.
            ghost.cancel()
            deadline = time.monotonic() + WAIT_TIMEOUT_S
            while tracker.pool.waiting and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            granted_in_race.append(await grant(request, *args, **kwargs))
            return granted_in_race[-1]
        return await grant(request, *args, **kwargs)

    ghost = wait_for(stub, "ghost")
    wait_until("the ghost queued", lambda: tracker.pool.waiting == 1)
    monkeypatch.setattr(store, "grant", grant_after_the_client_left)
    stub.Release(tracker_pb2.ReleaseRequest(lease_id=holder.lease_id), timeout=RPC_TIMEOUT_S)
    wait_until("the ghost dropped", lambda: len(granted_in_race) == 1 and not tracker.pool.waiting)
    [lease] = granted_in_race
    assert lease is not None and lease.user == "ghost"
    wait_until("the device free again", lambda: the_device(stub).state == tracker_pb2.FREE)
    renew = stub.Renew(tracker_pb2.RenewRequest(lease_id=lease.lease_id), timeout=RPC_TIMEOUT_S)
    assert (renew.status, renew.reason) == (common_pb2.DEVICE_LOST, "lease released")
    assert acquire_now(stub, "after").device.device_id == lease.device.device_id

"""The tracker awaits its store on its event loop: no store call hops to a thread.

A tracker over a real redis-server (and, alike, over the memory store) serves concurrent clients'
Acquire+Release pairs, Acquires that wait for a busy device, Heartbeats and ListDevices while its
loop refuses to hand any work to an executor. Every store call must have run on the loop's thread,
and the process must have started no thread of the tracker's own for them. (The tracker this
replaced ran redis calls on 16 worker threads of synchronous redis-py, which queued on the GIL.)
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc
from tracker.config import TrackerConfig
from tracker.server import ServingTracker, create_server
from tracker.store.base import TrackerStore
from tracker.testing import RedisServer

CLIENTS = 24
ROUNDS = 5
FREE_DEVICES = 8
RPC_TIMEOUT_S = 10.0
LOOP_THREAD = "kiln-tracker-loop"


class RefusingExecutor(ThreadPoolExecutor):
    """A loop's default executor that runs nothing: a call sent to a thread fails loudly."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        raise RuntimeError(f"thread hop refused: {getattr(fn, '__name__', fn)}")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server


@pytest.fixture(params=["memory", "redis"])
def store_name(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    if request.param == "memory":
        return "memory"
    return redis_server.url(prefix=f"onloop-{uuid.uuid4().hex[:12]}:")


def record_threads(store: TrackerStore, seen: dict[str, set[str]]) -> None:
    """Make every public method of `store` note the thread it runs on, per method name (a
    coroutine method when it runs, not when it is called)."""
    for name, method in inspect.getmembers(store, inspect.ismethod):
        if name.startswith("_") or name == "close":
            continue
        if inspect.iscoroutinefunction(method):

            async def noted(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
                seen.setdefault(_name, set()).add(threading.current_thread().name)
                return await _method(*args, **kw)

            setattr(store, name, functools.wraps(method)(noted))
        else:

            def noted_sync(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
                seen.setdefault(_name, set()).add(threading.current_thread().name)
                return _method(*args, **kw)

            setattr(store, name, functools.wraps(method)(noted_sync))


@pytest.fixture
def tracker(store_name: str) -> Iterator[tuple[ServingTracker, dict[str, set[str]]]]:
    config = TrackerConfig(heartbeat_interval_s=5.0, startup_grace_s=0.0, store=store_name)
    serving = create_server("127.0.0.1:0", config)
    refusing = RefusingExecutor(max_workers=1)
    seen: dict[str, set[str]] = {}
    try:
        assert serving.loop is not None and serving.store is not None
        serving.loop.loop.call_soon_threadsafe(serving.loop.loop.set_default_executor, refusing)
        serving.run(asyncio.sleep(0))  # the executor is in place before the first call
        record_threads(serving.store, seen)
        yield serving, seen
    finally:
        serving.stop(grace_s=0.5)
        refusing.shutdown()


def next_answer(pending: list[Any]) -> Any:
    """The answer of the first of `pending` (gRPC futures) to finish, which leaves the list."""
    deadline = time.monotonic() + RPC_TIMEOUT_S
    while True:
        for future in pending:
            if future.done():
                pending.remove(future)
                return future.result()
        assert time.monotonic() < deadline, "no waiter was answered"
        time.sleep(0.002)


def test_store_calls_run_on_the_loop_thread_with_no_executor(
    tracker: tuple[ServingTracker, dict[str, set[str]]],
) -> None:
    serving, seen = tracker
    threads_before = {thread.name for thread in threading.enumerate()}
    with grpc.insecure_channel(serving.address) as channel:
        stub = tracker_pb2_grpc.TrackerStub(channel)
        devices = [common_pb2.DeviceSpec(key="free") for _ in range(FREE_DEVICES)]
        devices.append(common_pb2.DeviceSpec(key="busy"))
        register = tracker_pb2.RegisterRequest(
            agent_id="agent", agent_address="127.0.0.1:1", devices=devices
        )
        stub.Register(register, timeout=RPC_TIMEOUT_S)
        busy = stub.Acquire(tracker_pb2.AcquireRequest(key="busy"), timeout=RPC_TIMEOUT_S)
        assert busy.status == common_pb2.OK, busy.reason
        waiters = [
            stub.Acquire.future(
                tracker_pb2.AcquireRequest(key="busy", timeout_s=30.0, user=f"waiter-{index}"),
                timeout=RPC_TIMEOUT_S * 3,
            )
            for index in range(CLIENTS)
        ]
        failures: list[str] = []

        def client(index: int) -> None:
            for round_ in range(ROUNDS):
                request = tracker_pb2.AcquireRequest(key="free", timeout_s=RPC_TIMEOUT_S)
                response = stub.Acquire(request, timeout=RPC_TIMEOUT_S)
                if response.status != common_pb2.OK:
                    failures.append(f"client {index} round {round_}: {response.reason}")
                    return
                release = tracker_pb2.ReleaseRequest(lease_id=response.lease.lease_id)
                if not stub.Release(release, timeout=RPC_TIMEOUT_S).released:
                    failures.append(f"client {index} round {round_}: release refused")

        clients = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for thread in clients:
            thread.start()
        heartbeat = tracker_pb2.HeartbeatRequest(agent_id="agent")
        assert stub.Heartbeat(heartbeat, timeout=RPC_TIMEOUT_S).known
        listed = stub.ListDevices(tracker_pb2.ListDevicesRequest(), timeout=RPC_TIMEOUT_S)
        assert len(listed.devices) == FREE_DEVICES + 1
        for thread in clients:
            thread.join(RPC_TIMEOUT_S * ROUNDS)
        assert not any(thread.is_alive() for thread in clients)
        assert failures == []
        # The busy device passes down the line of waiters, one release at a time.
        pending = list(waiters)
        while pending:
            stub.Release(
                tracker_pb2.ReleaseRequest(lease_id=busy.lease.lease_id), timeout=RPC_TIMEOUT_S
            )
            busy = next_answer(pending)
            assert busy.status == common_pb2.OK, busy.reason
    assert {"grant", "release", "enqueue", "heartbeat", "devices"} <= set(seen)
    assert {name: threads for name, threads in seen.items() if threads != {LOOP_THREAD}} == {}
    new_threads = {thread.name for thread in threading.enumerate()} - threads_before
    assert not {name for name in new_threads if name.startswith("kiln-")}, new_threads

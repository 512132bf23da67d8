"""Test kit: a real `redis-server` child process, and blocking access to the pool and its stores.

    with RedisServer(tmp_path) as server:          # a free port on 127.0.0.1, no persistence
        store = open_store(server.url(prefix="t1:"))

The server binds a port picked by binding a socket to port 0 (redis cannot take port 0 itself),
runs with `--save '' --appendonly no` unless `persistent=True`, is waited for with PING until a
deadline, and is stopped by its pid. `restart()` stops and starts it on the same port, which is how
a test makes Redis blip.

The store and the pool are coroutines on an event loop; `Blocking` drives them from synchronous
code (tests, scripts), each call run on a `LoopThread`:

    loop = LoopThread("test")
    store = Blocking(open_store(url), loop)          # store.grant(...) blocks until answered
    pool = BlockingPool(DevicePool(store.target, config), loop)
    pool.start()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import redis

from protos.aio_loop import LoopThread
from tracker.model import AcquireResult, LeaseRequest
from tracker.pool import REASON_CANCELLED, DevicePool

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
# Bound on one blocking call (an Acquire that waits included); tests wait far less.
CALL_TIMEOUT_S = 60.0
# How often a BlockingPool.acquire looks at its cancel flag.
_CANCEL_POLL_S = 0.005

_T = TypeVar("_T")


class RedisServerError(RuntimeError):
    """redis-server is missing or did not answer PING in time; the message has its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One redis-server child on 127.0.0.1, working in `workdir`."""

    def __init__(self, workdir: Path, persistent: bool = False) -> None:
        self.workdir = Path(workdir)
        self.persistent = persistent
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log = self.workdir / f"redis-{self.port}.log"

    def url(self, db: int = 0, prefix: str = "") -> str:
        """The store URL of this server (`redis://127.0.0.1:<port>/<db>[?prefix=...]`)."""
        query = f"?prefix={prefix}" if prefix else ""
        return f"redis://127.0.0.1:{self.port}/{db}{query}"

    def client(self) -> redis.Redis:
        """A plain client, for flushing and inspecting."""
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def start(self) -> None:
        """Start the server and wait until it answers PING.

        Raises:
            RedisServerError: no redis-server binary, or no PONG within START_TIMEOUT_S.
        """
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerError("redis-server is not installed (apt-get install redis-server)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir)]
        if self.persistent:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            args += ["--save", "", "--appendonly", "no"]
        with open(self._log, "ab") as log:
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1.0)
        try:
            while True:
                if self.process.poll() is not None:
                    raise RedisServerError(f"redis-server exited early:\n{self._tail()}")
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    if client.ping():
                        return
                if time.monotonic() > deadline:
                    self.stop()
                    raise RedisServerError(f"redis-server never answered PING:\n{self._tail()}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Terminate the server by pid (kill it if it lingers) and reap it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self.process = None

    def restart(self) -> None:
        """Stop and start again on the same port (state survives only when persistent)."""
        self.stop()
        self.start()

    def _tail(self) -> str:
        try:
            return self._log.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class Blocking(Generic[_T]):
    """`target`'s coroutine methods as blocking calls run on `loop`; other attributes as they are.

    Any thread may call; the calls interleave on the loop as an aio server's would. `target` is
    the object itself (its coroutines, for code already on the loop).
    """

    def __init__(self, target: _T, loop: LoopThread) -> None:
        self.target = target
        self.loop = loop

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.target, name)
        if not inspect.iscoroutinefunction(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.loop.call(value(*args, **kwargs), CALL_TIMEOUT_S)

        return call


class BlockingPool(Blocking[DevicePool]):
    """A DevicePool driven from threads, with a synchronous client's way to cancel an Acquire."""

    def acquire(
        self,
        request: LeaseRequest,
        cancelled: threading.Event | None = None,
        client_time_remaining_s: float | None = None,
    ) -> AcquireResult:
        """DevicePool.acquire; setting `cancelled` cancels it as a departing client would (the
        waiter leaves the queue at once) and answers REASON_CANCELLED."""
        return self.loop.call(
            self._acquire(request, cancelled, client_time_remaining_s), CALL_TIMEOUT_S
        )

    async def _acquire(
        self,
        request: LeaseRequest,
        cancelled: threading.Event | None,
        client_time_remaining_s: float | None,
    ) -> AcquireResult:
        task = asyncio.ensure_future(self.target.acquire(request, client_time_remaining_s))
        while cancelled is not None and not task.done():
            await asyncio.wait((task,), timeout=_CANCEL_POLL_S)
            if cancelled.is_set() and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return AcquireResult(None, REASON_CANCELLED)
        return await task

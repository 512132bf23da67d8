"""An asyncio event loop on a thread of its own, for daemons whose callers are synchronous.

Both daemons serve with grpc.aio, so a call waiting on something (a device, a busy executor)
is a suspended coroutine, not a parked thread. Their `create_server` functions stay synchronous
for the CLI and the tests: they start a `LoopThread` and run the server's coroutines on it with
`call`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class LoopThread:
    """A running event loop in a daemon thread named `name`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # Stopped: give what is left a chance to finish its cleanup, then close.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def call(self, coroutine: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        """Run `coroutine` on the loop and wait for its result (raises what it raised).

        Raises:
            TimeoutError: it ran past `timeout_s`; it is cancelled.
        """
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop (cancelling what still runs on it) and join its thread. Idempotent."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def bind_port(server: Any, listen: str, credentials: Any = None) -> int:
    """Add `listen` to an aio server (TLS when `credentials` are given); returns the bound port.

    Raises:
        OSError: nothing could be bound there.
    """
    try:
        if credentials is not None:
            port = int(server.add_secure_port(listen, credentials))
        else:
            port = int(server.add_insecure_port(listen))
    except RuntimeError as error:
        raise OSError(f"cannot listen on {listen}: {error}") from error
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return port

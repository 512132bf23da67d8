"""How the daemons (kiln-tracker, kiln-agent) turn SIGTERM and SIGINT into a graceful stop.

with StopSignals(_LOG, "shutting down") as signals:
    ...                  # start serving; a signal from here on is remembered, not fatal
    signals.wait()       # until SIGTERM or SIGINT
    server.stop(grace)   # still inside: a second signal during the stop is logged, not fatal
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The longest the main thread blocks at once while waiting; see StopSignals.wait.
WAIT_SLICE_S = 0.5

_Handler = Callable[[int, FrameType | None], Any] | int | None


class StopSignals:
    """While inside `with`, SIGTERM and SIGINT request a stop instead of ending the process.

    Each signal logs `received <NAME>; <action>` on the daemon's logger at INFO. Leaving the block
    puts back the handlers found on entering it. Enter it in the main thread only (Python runs
    signal handlers there and nowhere else).

    Args:
        log: the daemon's logger, so its log names it.
        action: what the daemon does next, for the log line ("shutting down", "stopping").
    """

    def __init__(self, log: logging.Logger, action: str = "stopping") -> None:
        self._log = log
        self._action = action
        self._stop = threading.Event()
        self._previous: dict[signal.Signals, _Handler] = {}
        self.received: signal.Signals | None = None
        """The last signal received, or None."""

    def __enter__(self) -> StopSignals:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, previous in self._previous.items():
            # None: the previous handler was not installed from Python; the default is the best
            # stand-in (it is what such a process had before Python started).
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)
        self._log.info("received %s; %s", self.received.name, self._action)
        self._stop.set()

    def wait(self, slice_s: float = WAIT_SLICE_S) -> None:
        """Block until a stop signal arrives, or return at once if one arrived already.

        Waits in slices of `slice_s`: a signal handler runs only in the main thread between
        bytecodes, so a bounded wait lets it run even if a wake-up were lost.
        """
        while not self._stop.wait(slice_s):
            pass

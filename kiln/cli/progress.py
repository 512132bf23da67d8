"""A live progress display for the tuning loop: one line redrawn on a terminal, plain lines elsewhere.

    bar = ProgressBar()                   # writes to stderr
    tune(..., callbacks=[on_progress(bar)])
    bar.close()

"best" here is the fastest single measurement so far; the final report names the best after
confirmation (re-measured, upper median), which may be another config or a slower figure.

On a TTY the line is redrawn in place with a carriage return; when the output is a file or a pipe
(CI logs, `2> log`), each batch prints one ordinary line, so logs stay readable.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from tuner.loop import TuneProgress


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def status_line(p: TuneProgress, width: int = 20, bar: bool = True, emulated: bool = False) -> str:
    """The one-line summary of a progress: trials, best GFLOP/s, errors, elapsed, ETA, model share."""
    total = max(p.total, 1)
    done = min(p.trials, total)
    parts = []
    if bar:
        filled = int(width * done / total)
        parts.append(f"[{'#' * filled}{'.' * (width - filled)}]")
    parts += [
        f"trials {p.trials}/{p.total}",
        f"best measured {p.best_gflops:.1f} GFLOP/s" + (" (emulated)" if emulated else ""),
        f"errors {p.errors}",
        f"elapsed {_duration(p.wall_s)}",
        f"eta {_duration(p.eta_s)}",
        f"model {100 * p.model_share:.1f}%",
    ]
    if p.resumed:
        parts.append(f"resumed {p.resumed}")
    return "  ".join(parts)


class ProgressBar:
    """A callable for `on_progress(...)` that shows the progress on `stream`.

    Args:
        stream: where to write (default stderr).
        tty: redraw in place; default: whether `stream` is a terminal.
        emulated: the devices are emulated (qemu): their GFLOP/s are labelled so.
    """

    def __init__(
        self, stream: TextIO | None = None, tty: bool | None = None, emulated: bool = False
    ) -> None:
        self.emulated = emulated
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._width = 0
        self.lines = 0
        self.last: TuneProgress | None = None

    def __call__(self, progress: TuneProgress) -> None:
        self.last = progress
        if self.tty:
            line = status_line(progress, emulated=self.emulated)
            pad = " " * max(0, self._width - len(line))
            self.stream.write(f"\r{line}{pad}")
            self._width = len(line)
        else:
            self.stream.write(status_line(progress, bar=False, emulated=self.emulated) + "\n")
        self.stream.flush()
        self.lines += 1

    def close(self) -> None:
        """End the redrawn line, so what is printed next starts on a line of its own."""
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0

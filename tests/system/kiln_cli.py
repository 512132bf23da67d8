"""Run the `kiln` CLI as a child process, the way a user does: no stdin, output captured."""

from __future__ import annotations

import subprocess
import sys


def kiln(
    *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )

"""The runner protocol: built artifacts in, one MeasureResult per artifact out, never an exception."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from compiler.artifact import Artifact
from tuner.measure import MeasureResult


class Runner(Protocol):
    def run(self, artifacts: Sequence[Artifact]) -> list[MeasureResult]:
        """Measure the first entry of each artifact; a failure is a result with its status."""
        ...

    def close(self) -> None:
        """Give back every device and connection the runner holds."""
        ...

"""The runner protocol: built artifacts in, one MeasureResult per artifact out, never an exception.

A candidate may come with a `Reference`: a kernel of the same argument layout that computes the
op plainly (`compiler.ops.reference`). The device runs both on the same seeded inputs and answers
WRONG_ANSWER when their outputs differ beyond the tolerance; the reference's outputs are cached
on the device, so it runs once per layout and seed, not once per candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from compiler.artifact import Artifact
from tuner.measure.result import MeasureResult


@dataclass(frozen=True)
class Reference:
    """What a candidate's outputs are checked against: |got - ref| <= atol + rtol * |ref|."""

    artifact: Artifact
    symbol: str
    rtol: float
    atol: float


class Runner(Protocol):
    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        """Measure the first entry of each artifact, checked against its reference when one is
        given (`references` is empty or one per artifact); a failure is a result."""
        ...

    def close(self) -> None:
        """Give back every device and connection the runner holds."""
        ...

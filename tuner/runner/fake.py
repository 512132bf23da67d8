"""A runner that opens no socket: each artifact's time comes from a function, for tests of the tuner."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compiler.artifact import Artifact
from tuner.measure import MeasureResult, Status


class FakeRunner:
    """Measures nothing; `seconds(artifact)` gives each candidate's time, or raises to fail it."""

    def __init__(self, seconds: Callable[[Artifact], float], device_id: str = "fake/0") -> None:
        self._seconds = seconds
        self._device_id = device_id
        self.measured: list[str] = []

    def run(self, artifacts: Sequence[Artifact]) -> list[MeasureResult]:
        out = []
        for art in artifacts:
            self.measured.append(art.sha256)
            try:
                t = float(self._seconds(art))
            except Exception as exc:
                out.append(MeasureResult.failed(Status.RUNTIME_ERROR, str(exc), self._device_id))
                continue
            out.append(
                MeasureResult(Status.OK, (t, t, t), device_id=self._device_id, number_used=1)
            )
        return out

    def close(self) -> None:
        pass

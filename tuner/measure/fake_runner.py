"""A runner that opens no socket: each candidate's time comes from a function, for tests of the tuner.

Times come from `seconds(artifact)` or, more conveniently, `config_seconds(config_index)`: the
config index is read from the trailing digits of the artifact's first entry symbol (the builder
names kernels `kiln_<op>_<shape>_c<index>`). Failures are injected by config index (`fail_configs`)
or by the position of the measurement in the runner's life (`fail_calls`, 0-based, counting
every artifact of every `run`); a callable that raises also fails its candidate (RUNTIME_ERROR).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from compiler.artifact import Artifact
from tuner.measure.result import MeasureResult, Status
from tuner.measure.runner import Reference

_TRAILING_DIGITS = re.compile(r"(\d+)$")


def config_index_of(art: Artifact) -> int:
    """The config index named by the trailing digits of `art`'s first entry symbol.

    Raises:
        ValueError: the symbol does not end in digits.
    """
    symbol = art.entries[0].symbol if art.entries else ""
    match = _TRAILING_DIGITS.search(symbol)
    if match is None:
        raise ValueError(f"entry symbol {symbol!r} does not end in a config index")
    return int(match.group(1))


class FakeRunner:
    """Measures nothing; results are deterministic functions of the candidates.

    Args:
        seconds: time of one call of an artifact; raising fails the candidate.
        device_id: reported on every result.
        config_seconds: time by config index (used when `seconds` is None).
        fail_configs: config index -> the status its candidate fails with, every time.
        fail_calls: measurement number (0-based over the runner's life) -> the status it fails
            with; the same candidate measured again later is not failed by it.
        repeat: samples per result (all equal to the time).

    Raises:
        ValueError: neither `seconds` nor `config_seconds` given, or a status of OK to inject.
    """

    def __init__(
        self,
        seconds: Callable[[Artifact], float] | None = None,
        device_id: str = "fake/0",
        *,
        config_seconds: Callable[[int], float] | None = None,
        fail_configs: Mapping[int, Status] | None = None,
        fail_calls: Mapping[int, Status] | None = None,
        repeat: int = 3,
    ) -> None:
        if seconds is None and config_seconds is None:
            raise ValueError("FakeRunner needs seconds(artifact) or config_seconds(index)")
        self._fail_configs = dict(fail_configs or {})
        self._fail_calls = dict(fail_calls or {})
        for status in (*self._fail_configs.values(), *self._fail_calls.values()):
            if status is Status.OK:
                raise ValueError("an injected failure cannot have status OK")
        self._seconds = seconds
        self._config_seconds = config_seconds
        self._device_id = device_id
        self._repeat = max(1, repeat)
        self.measured: list[str] = []  # sha256 of every artifact measured, in order
        self.batches: list[int] = []  # the size of every run() call

    def _time(self, art: Artifact) -> float:
        if self._seconds is not None:
            return float(self._seconds(art))
        assert self._config_seconds is not None
        return float(self._config_seconds(config_index_of(art)))

    def _one(self, art: Artifact) -> MeasureResult:
        call = len(self.measured)
        self.measured.append(art.sha256)
        status = self._fail_calls.get(call)
        if status is None and self._fail_configs:
            try:
                status = self._fail_configs.get(config_index_of(art))
            except ValueError:
                status = None
        if status is not None:
            return MeasureResult.failed(status, f"injected {status.value}", self._device_id)
        try:
            t = self._time(art)
        except Exception as exc:
            return MeasureResult.failed(Status.RUNTIME_ERROR, str(exc), self._device_id)
        return MeasureResult(
            Status.OK, (t,) * self._repeat, device_id=self._device_id, number_used=1
        )

    def run(
        self, artifacts: Sequence[Artifact], references: Sequence[Reference | None] = ()
    ) -> list[MeasureResult]:
        """One result per artifact, in order; never raises. Nothing is executed here, so
        `references` are not checked (a pool runner's device does that)."""
        self.batches.append(len(artifacts))
        return [self._one(art) for art in artifacts]

    def close(self) -> None:
        """Nothing to give back."""

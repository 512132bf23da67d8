"""Records in a JSON-lines file (the default store), appended and fsync'd per batch."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tuner.records import record as rec
from tuner.records.base import RecordStoreError


class FileRecords:
    """Records in a JSON-lines file, appended and fsync'd per batch."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    def append(self, records: Sequence[rec.Record]) -> None:
        if not records:
            return
        try:
            rec.append(self.path, records)
        except OSError as exc:
            raise RecordStoreError(f"cannot append records to {self.path}: {exc}") from exc

    def load(
        self, workload: rec.Workload | None = None, target: str | None = None
    ) -> list[rec.Record]:
        if not self.path.exists():
            return []
        try:
            return [r for r in rec.load(self.path) if rec.matches(r, workload, target)]
        except (OSError, UnicodeDecodeError) as exc:
            raise RecordStoreError(f"cannot read records from {self.path}: {exc}") from exc

    def best(self, workload: rec.Workload, target: str) -> rec.Record | None:
        return rec.best(self.load(workload, target), workload, target)

    def close(self) -> None:
        pass

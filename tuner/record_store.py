"""Where records live: one small interface over a JSON-lines file and a Redis records database.

    store = open_store("r.jsonl")                      # a file (created on first append)
    store = open_store("redis://127.0.0.1:6379/0")     # shared across workstations
    store.append(batch); store.load(workload, target); store.best(workload, target)

A store is append-only: a record, once appended, is never changed or dropped; readers skip records
they cannot read with a warning naming where they were.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from tuner import records as rec


class RecordStoreError(RuntimeError):
    """The store cannot be reached or written (Redis down, disk full); the message names it."""


class RecordStore(Protocol):
    """An append-only collection of tuning records."""

    def append(self, records: Sequence[rec.Record]) -> None:
        """Store `records` durably (all of them, before returning)."""
        ...

    def load(
        self, workload: rec.Workload | None = None, target: str | None = None
    ) -> list[rec.Record]:
        """The readable records of `workload` on `target` (None: any), in the order appended."""
        ...

    def best(self, workload: rec.Workload, target: str) -> rec.Record | None:
        """The fastest OK record of `workload` on `target`; never one of another target."""
        ...

    def close(self) -> None:
        """Release connections; the records stay."""
        ...


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


def is_redis_url(spec: str | os.PathLike[str]) -> bool:
    return isinstance(spec, str) and spec.startswith(("redis://", "rediss://", "redis+unix://"))


def open_store(spec: str | os.PathLike[str]) -> RecordStore:
    """A FileRecords for a path, a RedisRecords for a Redis URL.

    Redis URLs: `redis://host:port/db[?prefix=P]`, `rediss://...` (TLS) or
    `redis+unix:///path/redis.sock[?db=N&prefix=P]`.

    Raises:
        ValueError: a Redis URL that cannot be parsed.
    """
    if is_redis_url(spec):
        from tuner.records_redis import RedisRecords  # redis is only needed for a redis URL

        return RedisRecords(str(spec))
    return FileRecords(spec)

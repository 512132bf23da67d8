"""The records store interface: what every implementation (file, Redis) MUST do.

A store is append-only: a record, once appended, is never changed or dropped; readers skip records
they cannot read with a warning naming where they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tuner.records import record as rec


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
        """The readable records of `workload` on `target` (None: any), in the order appended;
        `target` with its thread count (`record.records_target`; none: one thread)."""
        ...

    def best(self, workload: rec.Workload, target: str) -> rec.Record | None:
        """The fastest OK record of `workload` on `target`; never one of another target or of
        another thread count."""
        ...

    def close(self) -> None:
        """Release connections; the records stay."""
        ...

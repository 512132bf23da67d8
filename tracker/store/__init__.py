"""Store implementations, found by module name: `memory` (embedded default); `redis` comes later."""

from __future__ import annotations

from tracker.errors import UnknownStore
from tracker.store.base import TrackerStore

AVAILABLE_STORES = ("memory",)


def open_store(name: str) -> TrackerStore:
    """Create the store called `name`.

    Raises:
        UnknownStore: `name` is not one of AVAILABLE_STORES.
    """
    if name == "memory":
        from tracker.store.memory import MemoryStore

        return MemoryStore()
    raise UnknownStore(f"unknown store {name!r}; available: {', '.join(AVAILABLE_STORES)}")

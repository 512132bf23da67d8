"""Store implementations: `memory` (embedded default) and `redis` (durable, shared by replicas).

`open_store(name)` takes what `--store` was given:

    memory                                   state in this process (lost on exit)
    redis://host:port/db[?prefix=P]          Redis over TCP; keys under P (default "kiln:")
    rediss://host:port/db[?prefix=P]         the same over TLS
    redis+unix:///path/redis.sock[?db=N&prefix=P]   Redis over a unix socket

The URL forms, passwords included, are those of protos.redis_url.
"""

from __future__ import annotations

from protos.redis_url import SCHEMES
from tracker.errors import UnknownStore
from tracker.store.base import TrackerStore

AVAILABLE_STORES = ("memory", *SCHEMES)


def is_store_name(name: str) -> bool:
    """True when `name` is "memory" or starts with a redis scheme (the URL is checked on open)."""
    return name == "memory" or name.startswith(SCHEMES)


def open_store(name: str) -> TrackerStore:
    """Create the store that `name` describes (see the module docstring).

    Connecting is lazy: an unreachable Redis surfaces as StoreUnavailable on first use.

    Raises:
        UnknownStore: `name` is neither "memory" nor a well-formed redis URL.
    """
    if name == "memory":
        from tracker.store.memory import MemoryStore

        return MemoryStore()
    if is_store_name(name):
        from tracker.store.redis import RedisStore

        return RedisStore(name)
    raise UnknownStore(
        f"unknown store {name!r}; use memory, redis[s]://host:port/db or redis+unix:///path"
    )

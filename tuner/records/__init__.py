"""Tuning records and where they live: one store interface, a file and a Redis implementation.

    store = open_store("r.jsonl")                      # a file (created on first append)
    store = open_store("redis://127.0.0.1:6379/0")     # shared across workstations
    store.append(batch); store.load(workload, target); store.best(workload, target)

`record` holds the record type and its JSON-lines schema (re-exported here, so
`from tuner import records as rec; rec.Record(...)` reads as before); `base` the `RecordStore`
interface; `file` and `redis` its two implementations, chosen by `open_store`.
"""

from __future__ import annotations

import os

from tuner.records.base import RecordStore, RecordStoreError
from tuner.records.file import FileRecords
from tuner.records.record import (
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    THREADS_MARK,
    BestConfig,
    Record,
    RecordFormatError,
    Workload,
    append,
    apply_best,
    best,
    canonical_target,
    dumps,
    load,
    matches,
    matches_pair,
    now_iso,
    parse,
    records_target,
    settled_time,
    split_threads,
)

__all__ = [
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "THREADS_MARK",
    "BestConfig",
    "FileRecords",
    "Record",
    "RecordFormatError",
    "RecordStore",
    "RecordStoreError",
    "Workload",
    "append",
    "apply_best",
    "best",
    "canonical_target",
    "dumps",
    "is_redis_url",
    "load",
    "matches",
    "matches_pair",
    "now_iso",
    "open_store",
    "parse",
    "records_target",
    "settled_time",
    "split_threads",
]


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
        from tuner.records.redis import RedisRecords  # redis is only needed for a redis URL

        return RedisRecords(str(spec))
    return FileRecords(spec)

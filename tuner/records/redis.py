"""A Redis records database, shared by every workstation tuning against it.

Layout under the key prefix P (default "kiln:records:"), per (workload, target) pair `W`, where `W`
is the sorted-keys JSON of {"workload": ..., "target": ...}:

    P log:W     list of record JSON lines (schema of tuner.records), append-only, in append order
    P index     set of every W that has records

A batch of appends goes in one MULTI/EXEC transaction, so a reader never sees half a batch. The
best config of a pair is computed from its log (`records.best`: a config measured several times
counts by the upper median of its measurements), one LRANGE. Databases written before this
version also hold `P best:W` hashes (the fastest single record); nothing reads them now.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import redis

from protos.redis_url import parse_redis_url
from tuner.records import record as rec
from tuner.records.base import RecordStoreError

_LOG = logging.getLogger(__name__)

DEFAULT_PREFIX = "kiln:records:"
_SOCKET_TIMEOUT_S = 10.0
_T = TypeVar("_T")


def _pair_key(workload: rec.Workload, target: str) -> str:
    return json.dumps({"workload": workload.to_json(), "target": target}, sort_keys=True)


class RedisRecords:
    """The RecordStore of a Redis database; see the module docstring for the layout."""

    def __init__(self, url: str, prefix: str | None = None) -> None:
        """Connect (lazily) to the database at `url`; `prefix` overrides the URL's `?prefix=`.

        Raises:
            ValueError: the URL is malformed.
        """
        parsed = parse_redis_url(url, default_prefix=DEFAULT_PREFIX)
        self.shown = parsed.shown
        self.prefix = parsed.prefix if prefix is None else prefix
        try:
            self._redis: Any = redis.Redis.from_url(
                parsed.client_url,
                decode_responses=True,
                socket_timeout=_SOCKET_TIMEOUT_S,
                socket_connect_timeout=_SOCKET_TIMEOUT_S,
            )
        except ValueError as exc:
            raise ValueError(f"records URL {self.shown}: {exc}") from None

    def __str__(self) -> str:
        return f"{self.shown} (prefix {self.prefix!r})"

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except redis.RedisError as exc:
            raise RecordStoreError(f"records database {self.shown}: {what} failed: {exc}") from exc

    def _log_key(self, pair: str) -> str:
        return f"{self.prefix}log:{pair}"

    def append(self, records: Sequence[rec.Record]) -> None:
        """Append a batch in one transaction."""
        if not records:
            return

        def run() -> None:
            pipe = self._redis.pipeline(transaction=True)
            for r in records:
                pair = _pair_key(r.workload, r.target)
                pipe.rpush(self._log_key(pair), rec.dumps(r))
                pipe.sadd(self.prefix + "index", pair)
            pipe.execute()

        self._call("append", run)

    def pairs(self) -> list[tuple[rec.Workload, str]]:
        """Every (workload, target) with records, skipping (with a warning) unreadable entries."""
        out = []
        for pair in sorted(
            self._call("index", lambda: self._redis.smembers(self.prefix + "index"))
        ):
            try:
                obj = json.loads(pair)
                out.append((rec.Workload.from_json(obj["workload"]), str(obj["target"])))
            except (ValueError, KeyError, TypeError) as exc:
                _LOG.warning("%s: skipped index entry %r: %s", self.shown, pair, exc)
        return out

    def load(
        self, workload: rec.Workload | None = None, target: str | None = None
    ) -> list[rec.Record]:
        """The readable records of `workload` on `target` (None: any), in append order per pair."""
        if workload is not None and target is not None:
            pairs = [(workload, rec.canonical_target(target))]  # the spelling records are keyed by
        else:
            pairs = [(w, t) for w, t in self.pairs() if rec.matches_pair(w, t, workload, target)]
        out: list[rec.Record] = []
        for w, t in pairs:
            key = self._log_key(_pair_key(w, t))
            lines: list[str] = self._call("load", partial(self._redis.lrange, key, 0, -1))
            for i, line in enumerate(lines):
                r = rec.parse(line, f"{self.shown} {key}[{i}]")
                if r is not None:
                    out.append(r)
        return out

    def best(self, workload: rec.Workload, target: str) -> rec.Record | None:
        """The best config's record of the pair (`records.best` over its log)."""
        return rec.best(self.load(workload, target), workload, target)

    def close(self) -> None:
        self._redis.close()

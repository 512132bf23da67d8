"""Tuning records as JSON lines, one candidate a line, with a versioned schema.

Schema version 1, one object per line:

    {"v": 1, "workload": {"op": "matmul", "shape": [M, N, K], "dtype": "float32"},
     "target": "x86_64-avx512", "config": {"index": 17, "knobs": {"tile_m": 32, ...}},
     "result": {"status": "OK", "samples_s": [...], "error": "", "device_id": "a/0",
                "number_used": 64},
     "flop": 268435456.0, "timestamp": "2026-11-22T03:30:00+00:00"}

Readers skip lines they cannot parse or whose version is newer than they know, with a warning that
names the file and line, so a torn last line or a future writer never breaks an old reader.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tuner.measure import MeasureResult, Status

_LOG = logging.getLogger(__name__)

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Workload:
    """What is being tuned: an op template name, its shape tuple and dtype."""

    op: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Workload:
        return cls(op=str(obj["op"]), shape=tuple(int(x) for x in obj["shape"]), dtype=obj["dtype"])


@dataclass(frozen=True)
class Record:
    """One measured candidate."""

    workload: Workload
    target: str
    config_index: int
    knobs: dict[str, Any]
    result: MeasureResult
    flop: float
    timestamp: str

    @property
    def gflops(self) -> float:
        return self.flop / self.result.median_s / 1e9 if self.result.ok else 0.0

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "v": SCHEMA_VERSION,
            "workload": self.workload.to_json(),
            "target": self.target,
            "config": {"index": self.config_index, "knobs": self.knobs},
            "result": {
                "status": r.status.value,
                "samples_s": list(r.samples_s),
                "error": r.error,
                "device_id": r.device_id,
                "number_used": r.number_used,
            },
            "flop": self.flop,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Record:
        res = obj["result"]
        result = MeasureResult(
            status=Status(res["status"]),
            samples_s=tuple(float(s) for s in res["samples_s"]),
            error=str(res.get("error", "")),
            device_id=str(res.get("device_id", "")),
            number_used=int(res.get("number_used", 0)),
        )
        cfg = obj["config"]
        return cls(
            workload=Workload.from_json(obj["workload"]),
            target=str(obj["target"]),
            config_index=int(cfg["index"]),
            knobs=dict(cfg["knobs"]),
            result=result,
            flop=float(obj.get("flop", 0.0)),
            timestamp=str(obj.get("timestamp", "")),
        )


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def append(path: str | os.PathLike[str], records: Iterable[Record]) -> None:
    """Append records and flush them to disk, so a killed run loses at most what was not written."""
    lines = "".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(lines)
        f.flush()
        os.fsync(f.fileno())


def load(path: str | os.PathLike[str]) -> Iterator[Record]:
    """Yield the readable records of a file, warning about (and skipping) each line that is not."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                version = obj.get("v")
                if version != SCHEMA_VERSION:
                    _LOG.warning(
                        "%s:%d: skipped: schema version %r, this reader knows %d",
                        path,
                        lineno,
                        version,
                        SCHEMA_VERSION,
                    )
                    continue
                yield Record.from_json(obj)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                _LOG.warning("%s:%d: skipped unreadable record: %s", path, lineno, exc)


def best(records: Iterable[Record], workload: Workload, target: str) -> Record | None:
    """The fastest OK record of a workload on a target; records of other targets never count."""
    candidates = [
        r for r in records if r.workload == workload and r.target == target and r.result.ok
    ]
    return min(candidates, key=lambda r: r.result.median_s, default=None)

"""Tuning records as JSON lines, one candidate a line, with a versioned schema.

Schema version 2 (what this module writes), one object per line:

    {"v": 2, "workload": {"op": "matmul", "shape": [M, N, K], "dtype": "float32"},
     "target": "x86_64-avx512", "space_size": 288,
     "config": {"index": 17, "knobs": {"tile_m": 32, ...}},
     "status": "OK", "device": "a/0",
     "result": {"status": "OK", "samples_s": [...], "error": "", "number_used": 64},
     "flop": 268435456.0, "timestamp": "2026-11-22T03:30:00+00:00"}

`space_size` is the size of the config space the index was drawn from (0: unknown), so a reader
can tell a record of a space that has since changed; `"confirmation": true` (present only then)
marks a config measured again at the end of a run to confirm its speed, which is not a trial; `status` and `device` repeat the result's
status and the device it ran on at top level, for grep and for summaries. `result.caches` is
"cold" (present only then) for a time taken with the caches swept before each repeat (`kiln tune
--caches cold`, the default for models whose weights outgrow the caches); no such field means
warm. `best` never compares a cold time with a warm one.

Version 1 (read, migrated on read) had no `space_size`, no top-level `status`/`device`, and kept the
device as `result.device_id`.

`target` names the compiler target and, when the kernel ran on more than one thread, the thread
count: "x86_64-avx512/threads=4" (`records_target`). One thread is the bare name, which is also
what every record written before thread counts existed says (all of them ran on one thread), so
those keep their meaning with no migration. A record read or made with "/threads=1" is stored as
the bare name. Matching compares whole targets, so a record tuned for one thread count is never
applied to another.

Readers skip lines they cannot parse or whose version is newer than they know, with a warning that
names the file and line, so a torn last line or a future writer never breaks an old reader.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tuner.measure import MeasureResult, Status

_LOG = logging.getLogger(__name__)

SCHEMA_VERSION = 2
CACHE_MODES = ("warm", "cold")  # how a result was timed (`result.caches`; absent: warm)
READABLE_VERSIONS = (1, 2)


class RecordFormatError(ValueError):
    """A record object that this reader cannot turn into a Record; the message says why."""


THREADS_MARK = "/threads="


def records_target(target: str, threads: int = 1) -> str:
    """The target a record of `target` (a resolved compiler target's name) on `threads` threads
    carries: the bare name for one thread, "NAME/threads=N" for more.

    Raises:
        ValueError: `target` already carries a thread count, or `threads` is below 1.
    """
    if THREADS_MARK in target:
        raise ValueError(f"target {target!r} already carries a thread count")
    if threads < 1:
        raise ValueError(f"a kernel runs on at least one thread, not {threads}")
    return target if threads == 1 else f"{target}{THREADS_MARK}{threads}"


def split_threads(target: str) -> tuple[str, int]:
    """(compiler target, thread count) of a records target; no count means one thread.

    Raises:
        ValueError: the count is not a whole number of at least 1.
    """
    base, mark, count = target.partition(THREADS_MARK)
    if not mark:
        return target, 1
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"target {target!r}: the thread count must be a whole number >= 1")
    return base, int(count)


def canonical_target(target: str) -> str:
    """`target` spelled as records store it ("NAME/threads=1" is "NAME")."""
    return records_target(*split_threads(target))


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

    def __str__(self) -> str:
        return f"{self.op}({','.join(map(str, self.shape))}) {self.dtype}"


@dataclass(frozen=True)
class Record:
    """One measured candidate.

    `space_size` is the size of the config space `config_index` belongs to; 0 means unknown (a
    migrated version-1 record). `confirmation` marks a measurement of an already measured
    config taken to confirm its speed (`tuner.loop.confirm_best`): not a trial of its own.
    """

    workload: Workload
    target: str
    config_index: int
    knobs: dict[str, Any]
    result: MeasureResult
    flop: float
    timestamp: str
    space_size: int = field(default=0)
    confirmation: bool = field(default=False)

    def __post_init__(self) -> None:
        # one spelling per (target, threads), so equal targets compare equal (and key alike)
        object.__setattr__(self, "target", canonical_target(self.target))

    @property
    def threads(self) -> int:
        """The threads the candidate ran on (1 for every record without a count)."""
        return split_threads(self.target)[1]

    @property
    def gflops(self) -> float:
        return self.flop / self.result.median_s / 1e9 if self.result.ok else 0.0

    @property
    def status(self) -> Status:
        return self.result.status

    @property
    def device(self) -> str:
        return self.result.device_id

    def to_json(self) -> dict[str, Any]:
        """The version-2 JSON object of this record."""
        r = self.result
        return {
            "v": SCHEMA_VERSION,
            "workload": self.workload.to_json(),
            "target": self.target,
            "space_size": self.space_size,
            "config": {"index": self.config_index, "knobs": self.knobs},
            "status": r.status.value,
            "device": r.device_id,
            "result": {
                "status": r.status.value,
                "samples_s": list(r.samples_s),
                "error": r.error,
                "number_used": r.number_used,
                **({"noisy": True} if r.noisy else {}),
                **({"caches": "cold"} if r.cold else {}),
            },
            "flop": self.flop,
            "timestamp": self.timestamp,
            **({"confirmation": True} if self.confirmation else {}),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Record:
        """A Record from a version-1 or version-2 object (version 1 is migrated).

        Raises:
            RecordFormatError: the version is unknown or a field is missing or malformed.
        """
        if not isinstance(obj, dict):
            raise RecordFormatError(f"a record is a JSON object, got {type(obj).__name__}")
        version = obj.get("v")
        if version not in READABLE_VERSIONS:
            raise RecordFormatError(
                f"schema version {version!r}, this reader knows {', '.join(map(str, READABLE_VERSIONS))}"
            )
        try:
            res = obj["result"]
            caches = res.get("caches", "warm")
            if caches not in CACHE_MODES:
                raise RecordFormatError(f"result.caches is {caches!r}, not one of {CACHE_MODES}")
            # version 1 kept the device in the result; version 2 at top level
            device = str(res.get("device_id", "") if version == 1 else obj.get("device", ""))
            result = MeasureResult(
                status=Status(res["status"]),
                samples_s=tuple(float(s) for s in res["samples_s"]),
                error=str(res.get("error", "")),
                device_id=device,
                number_used=int(res.get("number_used", 0)),
                noisy=bool(res.get("noisy", False)),
                cold=caches == "cold",
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
                space_size=int(obj.get("space_size", 0)),
                confirmation=obj.get("confirmation", False) is True,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RecordFormatError(f"{type(exc).__name__}: {exc}") from None


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def dumps(record: Record) -> str:
    """One record as its JSON line, without the newline."""
    return json.dumps(record.to_json(), sort_keys=True)


def parse(line: str, where: str) -> Record | None:
    """The record of one line, or None (with a warning naming `where`) when it is unreadable."""
    try:
        return Record.from_json(json.loads(line))
    except RecordFormatError as exc:
        _LOG.warning("%s: skipped: %s", where, exc)
    except ValueError as exc:  # not JSON, e.g. a torn last line
        _LOG.warning("%s: skipped unreadable record: %s", where, exc)
    return None


def append(path: str | os.PathLike[str], records: Iterable[Record]) -> None:
    """Append records and flush them to disk, so a killed run loses at most what was not written."""
    lines = "".join(dumps(r) + "\n" for r in records)
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
            record = parse(line, f"{path}:{lineno}")
            if record is not None:
                yield record


def matches(record: Record, workload: Workload | None = None, target: str | None = None) -> bool:
    """Whether a record is of `workload` (any if None) on `target` (any if None)."""
    return matches_pair(record.workload, record.target, workload, target)


def matches_pair(
    workload: Workload, target: str, want_workload: Workload | None, want_target: str | None
) -> bool:
    """Whether (workload, target) is what was asked for (None: anything); targets match with
    their thread counts, a target without one meaning one thread."""
    return (want_workload is None or workload == want_workload) and (
        want_target is None or canonical_target(target) == canonical_target(want_target)
    )


def settled_time(records: Sequence[Record]) -> Record:
    """The record standing for one config measured `len(records)` times: its upper median.

    A config measured once is that measurement. One measured again (a confirmation round, a
    resumed run) is judged by the slower middle of its measurements, so a single lucky run on
    a shared machine does not make it the best.
    """
    ordered = sorted(records, key=lambda r: r.result.median_s)
    return ordered[len(ordered) // 2]


def best(
    records: Iterable[Record], workload: Workload, target: str, space_size: int | None = None
) -> Record | None:
    """The fastest OK config of a workload on a target; records of other targets never count.

    Each config counts once, by `settled_time` over its OK records (the upper median), and the
    record returned is that one. Cold and warm times (`MeasureResult.cold`) are never compared:
    when the workload has both, the records of the newest one's mode decide (a re-tune in the
    other mode takes over; the records of the old mode stay for the reader).

    Args:
        records: any records, of any workloads and targets.
        workload: the workload wanted.
        target: the target wanted, by its resolved name (e.g. "x86_64-avx512", not "host"),
            with its thread count ("x86_64-avx512/threads=2"; none: one thread).
        space_size: when given, records of a config space of another (known) size are ignored,
            because their index means another config in today's space.
    """
    chosen = [
        r
        for r in records
        if matches(r, workload, target)
        and r.result.ok
        and (space_size is None or r.space_size in (0, space_size))
    ]
    if not chosen:
        return None
    # the newest by timestamp, the later written of equal ones
    cold = max(enumerate(chosen), key=lambda p: (p[1].timestamp, p[0]))[1].result.cold
    by_config: dict[tuple[int, int], list[Record]] = {}
    for r in chosen:
        if r.result.cold == cold:
            by_config.setdefault((r.config_index, r.space_size), []).append(r)
    settled = (settled_time(rs) for rs in by_config.values())
    return min(settled, key=lambda r: r.result.median_s, default=None)


@dataclass(frozen=True)
class BestConfig:
    """What `apply_best` hands a compiler: the config to build, and how fast it was."""

    index: int
    knobs: dict[str, Any]
    gflops: float
    median_s: float
    device: str


def apply_best(
    records: Iterable[Record], workload: Workload, target: str, space_size: int | None = None
) -> BestConfig | None:
    """The best config of `workload` on `target` from `records`, or None if none was measured OK.

    Records of another target, or of the same one on another thread count, never apply,
    however fast they were.
    """
    b = best(records, workload, target, space_size)
    if b is None:
        return None
    return BestConfig(b.config_index, dict(b.knobs), b.gflops, b.result.median_s, b.device)

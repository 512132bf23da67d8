"""The agent's content-addressed artifact cache: hash validation, atomic store, lookups."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest

from device_agent.cache import MAX_META_BYTES, ArtifactCache, footprint, validate_sha256
from device_agent.domain import ArgRole, ArtifactMeta, EntryPoint, TensorSpec
from device_agent.errors import (
    ArtifactTooLargeError,
    HashMismatchError,
    InvalidRequestError,
    TruncatedUploadError,
)

DATA = b"\x7fELF not really" * 100


def _meta(data: bytes = DATA, size_bytes: int = 0) -> ArtifactMeta:
    entry = EntryPoint(
        "k", "k__time", (TensorSpec("x", (2, 3), "float32", ArgRole.INPUT),), flop=6.0
    )
    return ArtifactMeta(
        sha256=hashlib.sha256(data).hexdigest(),
        format="SHARED_OBJECT",
        target="x86_64",
        entries=(entry,),
        size_bytes=size_bytes,
    )


def _store(cache: ArtifactCache, meta: ArtifactMeta, data: bytes, chunk: int = 7) -> None:
    pending = cache.begin(meta)
    for i in range(0, len(data), chunk):
        pending.write(data[i : i + chunk])
    pending.commit()


@pytest.mark.parametrize(
    "bad",
    ["../x", "", "a" * 63, "a" * 65, "g" * 64, "/etc/passwd", "../" + "a" * 61, "a" * 63 + "\n"],
)
def test_validate_rejects_anything_but_64_hex_digits(bad: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_sha256(bad)


def test_validate_lowers_case() -> None:
    assert validate_sha256("AB" * 32) == "ab" * 32


def test_store_then_has_and_get(tmp_path: Path) -> None:
    cache = ArtifactCache(str(tmp_path), max_artifact_bytes=1 << 20)
    meta = _meta()
    assert not cache.has(meta.sha256)
    _store(cache, meta, DATA)
    assert cache.has(meta.sha256)
    cached = cache.get(meta.sha256)
    assert cached is not None
    assert os.path.basename(cached.path) == meta.sha256
    with open(cached.path, "rb") as f:
        assert f.read() == DATA
    assert cached.meta.entries == meta.entries
    assert cached.meta.size_bytes == len(DATA)


def test_nothing_is_visible_before_commit(tmp_path: Path) -> None:
    cache = ArtifactCache(str(tmp_path), max_artifact_bytes=1 << 20)
    meta = _meta()
    pending = cache.begin(meta)
    pending.write(DATA)
    assert not cache.has(meta.sha256)
    assert not os.path.exists(os.path.join(str(tmp_path), meta.sha256))
    pending.abort()
    assert not cache.has(meta.sha256)
    assert os.listdir(os.path.join(str(tmp_path), "tmp")) == []


def test_hash_mismatch_stores_nothing(tmp_path: Path) -> None:
    cache = ArtifactCache(str(tmp_path), max_artifact_bytes=1 << 20)
    meta = _meta()
    with pytest.raises(HashMismatchError) as err:
        _store(cache, meta, DATA + b"!")
    assert meta.sha256 in str(err.value)
    assert hashlib.sha256(DATA + b"!").hexdigest() in str(err.value)
    assert not cache.has(meta.sha256)
    assert sorted(os.listdir(str(tmp_path))) == ["tmp"]
    assert os.listdir(os.path.join(str(tmp_path), "tmp")) == []


def test_oversize_stores_nothing(tmp_path: Path) -> None:
    cache = ArtifactCache(str(tmp_path), max_artifact_bytes=100)
    meta = _meta()
    with pytest.raises(ArtifactTooLargeError):
        _store(cache, meta, DATA)
    assert not cache.has(meta.sha256)
    assert os.listdir(os.path.join(str(tmp_path), "tmp")) == []


def test_declared_size_over_limit_is_refused_up_front(tmp_path: Path) -> None:
    cache = ArtifactCache(str(tmp_path), max_artifact_bytes=100)
    with pytest.raises(ArtifactTooLargeError):
        cache.begin(_meta(size_bytes=101))


def test_get_absent_is_none_and_stale_temp_files_are_cleared(tmp_path: Path) -> None:
    os.makedirs(os.path.join(str(tmp_path), "tmp"))
    with open(os.path.join(str(tmp_path), "tmp", "upload-stale"), "wb") as f:
        f.write(b"partial")
    cache = ArtifactCache(str(tmp_path), max_artifact_bytes=100)
    assert cache.get("0" * 64) is None
    assert os.listdir(os.path.join(str(tmp_path), "tmp")) == []


def _artifact(i: int, size: int = 100) -> tuple[ArtifactMeta, bytes]:
    data = bytes([i]) * size
    return _meta(data), data


# What one 100-byte test artifact counts against a bound, its meta file included; every test
# artifact has the same.
UNIT = footprint(dataclasses.replace(_artifact(0)[0], size_bytes=100))


def _bounded(path: Path, max_total_bytes: int = 2 * UNIT + 50) -> ArtifactCache:
    return ArtifactCache(str(path), max_artifact_bytes=1 << 20, max_total_bytes=max_total_bytes)


def test_least_recently_used_goes_first_and_has_refreshes(tmp_path: Path) -> None:
    cache = _bounded(tmp_path)
    (m1, d1), (m2, d2), (m3, d3) = (_artifact(i) for i in range(3))
    _store(cache, m1, d1)
    _store(cache, m2, d2)
    assert cache.has(m1.sha256)  # now m2 is the least recently used
    _store(cache, m3, d3)
    assert cache.has(m1.sha256) and cache.has(m3.sha256)
    assert not cache.has(m2.sha256)
    assert not os.path.exists(os.path.join(str(tmp_path), m2.sha256))
    assert not os.path.exists(os.path.join(str(tmp_path), m2.sha256 + ".json"))
    assert cache.total_bytes == 2 * UNIT


def test_an_artifact_in_use_is_never_evicted(tmp_path: Path) -> None:
    cache = _bounded(tmp_path)
    (m1, d1), (m2, d2), (m3, d3) = (_artifact(i) for i in range(3))
    _store(cache, m1, d1)
    held = cache.acquire(m1.sha256)
    assert held is not None
    _store(cache, m2, d2)
    _store(cache, m3, d3)  # m1 is the oldest, but in use: m2 goes instead
    assert cache.has(m1.sha256) and not cache.has(m2.sha256)
    with open(held.path, "rb") as f:
        assert f.read() == d1
    # Only artifacts in use left over the bound: it stays over until they are released.
    tight = _bounded(tmp_path / "tight", max_total_bytes=UNIT + 50)
    _store(tight, m1, d1)
    assert tight.acquire(m1.sha256) is not None
    _store(tight, m2, d2)
    assert tight.has(m1.sha256) and not tight.has(m2.sha256)


def test_release_evicts_what_was_kept_over_the_bound(tmp_path: Path) -> None:
    cache = _bounded(tmp_path, max_total_bytes=UNIT + 50)
    (m1, d1), (m2, d2) = (_artifact(i) for i in range(2))
    _store(cache, m1, d1)
    assert cache.acquire(m1.sha256) is not None
    assert cache.acquire(m1.sha256) is not None
    held2 = cache.acquire(m1.sha256)
    assert held2 is not None
    cache.release(m1.sha256)
    cache.release(m1.sha256)
    _store(cache, m2, d2)
    assert cache.has(m1.sha256) and not cache.has(m2.sha256)
    cache.release(m1.sha256)
    assert cache.total_bytes <= UNIT + 50


def test_an_artifact_over_the_whole_bound_is_refused(tmp_path: Path) -> None:
    cache = _bounded(tmp_path, max_total_bytes=50)
    meta, data = _artifact(1)
    with pytest.raises(ArtifactTooLargeError):
        _store(cache, meta, data)


def test_restart_rereads_the_directory_in_recency_order_and_cleans_partials(
    tmp_path: Path,
) -> None:
    cache = _bounded(tmp_path, max_total_bytes=10 * UNIT)
    arts = [_artifact(i) for i in range(3)]
    for meta, data in arts:
        _store(cache, meta, data)
    # Recency survives in the mtimes: artifact 0 the most recent, 1 the least.
    for age, (meta, _) in zip((1, 3, 2), arts, strict=True):
        os.utime(os.path.join(str(tmp_path), meta.sha256), (1e9 - age, 1e9 - age))
    half = "ee" * 32
    (tmp_path / (half + ".json")).write_text("{}")  # a commit cut short: meta without bytes
    (tmp_path / ("ff" * 32)).write_bytes(b"bytes without meta")
    (tmp_path / "tmp" / "upload-x").write_bytes(b"partial")
    (tmp_path / "backends").mkdir()  # not the cache's: left alone
    restarted = _bounded(tmp_path, max_total_bytes=2 * UNIT + 50)
    assert restarted.total_bytes == 2 * UNIT
    assert restarted.has(arts[0][0].sha256) and restarted.has(arts[2][0].sha256)
    assert not restarted.has(arts[1][0].sha256)  # the least recent went at start
    got = restarted.get(arts[0][0].sha256)
    assert got is not None and got.meta.entries == arts[0][0].entries
    names = set(os.listdir(str(tmp_path)))
    assert half + ".json" not in names and "ff" * 32 not in names and "backends" in names
    assert os.listdir(os.path.join(str(tmp_path), "tmp")) == []


def test_truncated_upload_stores_nothing(tmp_path: Path) -> None:
    cache = ArtifactCache(str(tmp_path), max_artifact_bytes=1 << 20)
    meta = _meta(size_bytes=len(DATA))
    with pytest.raises(TruncatedUploadError, match=f"ended after {len(DATA) - 5} of {len(DATA)}"):
        _store(cache, meta, DATA[:-5])
    assert not cache.has(meta.sha256)
    assert os.listdir(os.path.join(str(tmp_path), "tmp")) == []


def _fat_meta(data: bytes, entries: int) -> ArtifactMeta:
    """A meta of `entries` entries (over 100 bytes of JSON each) for `data`, as stored."""
    one = _meta(data).entries[0]
    fat = tuple(dataclasses.replace(one, symbol=f"k{i}") for i in range(entries))
    return dataclasses.replace(_meta(data), entries=fat, size_bytes=len(data))


def test_meta_files_count_against_the_bound_and_a_huge_one_is_refused(tmp_path: Path) -> None:
    """Eight 10-byte artifacts with 2.4 MB metas once filled 27 MB under a 1 MiB bound."""
    cache = ArtifactCache(str(tmp_path), max_artifact_bytes=1 << 20, max_total_bytes=150_000)
    metas = [_fat_meta(bytes([i]) * 10, 400) for i in range(4)]
    assert all(50_000 < footprint(m) < 75_000 for m in metas)  # two fit, three do not
    for i, meta in enumerate(metas):
        _store(cache, meta, bytes([i]) * 10)
    assert cache.total_bytes <= 150_000
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir() if p.is_file())
    assert on_disk == cache.total_bytes <= 150_000
    assert sum(cache.has(m.sha256) for m in metas) == 2  # the two most recent
    huge = _fat_meta(b"x", MAX_META_BYTES // 50)
    with pytest.raises(ArtifactTooLargeError, match=r"artifact meta of .* exceeds the limit"):
        cache.begin(huge)

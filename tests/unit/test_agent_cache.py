"""The agent's content-addressed artifact cache: hash validation, atomic store, lookups."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from device_agent.cache import ArtifactCache, validate_sha256
from device_agent.domain import ArgRole, ArtifactMeta, EntryPoint, TensorSpec
from device_agent.errors import ArtifactTooLargeError, HashMismatchError, InvalidRequestError

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

"""Content-addressed on-disk artifact cache with a size bound, least recently used out.

Layout under the cache directory: `<sha256>` holds the bytes, `<sha256>.json` the domain meta, and
`tmp/` uploads in progress. Every name is derived from a validated 64-hex-digit hash; no path or file
name is ever taken from the wire. The meta is written first and the bytes last, so the bytes file's
presence is the commit point. Other entries of the directory (a backend's `backends/` folder) are
left alone.

Bound: after each commit, least recently used artifacts are deleted until the bytes of all of them,
their meta files counted, fit in `max_total_bytes`; a meta larger than MAX_META_BYTES is refused
before anything is written (eight 10-byte artifacts with 2.4 MB metas once filled 27 MB under a
1 MiB bound). An artifact in use (between `acquire` and `release`, i.e. while a job
runs it) is never evicted; if only such artifacts are left, the cache stays over its bound until
they are released. `has` and `acquire` refresh recency, which is also written to the bytes file's
mtime, so a restarted agent re-reads the directory in the same order. On start, partial uploads in
`tmp/` and half-committed entries (a meta without bytes, bytes without a meta) are removed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from dataclasses import dataclass

from device_agent.domain import ArtifactMeta, meta_from_dict, meta_to_dict
from device_agent.errors import (
    ArtifactTooLargeError,
    HashMismatchError,
    InvalidRequestError,
    TruncatedUploadError,
)

_LOG = logging.getLogger(__name__)
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_META_SUFFIX = ".json"
# The largest meta file an artifact may have: its entries and their argument specs. A model build
# (about 60 entries) needs some tens of KB; a meta of megabytes is an attack on the bound.
MAX_META_BYTES = 256 * 1024


def validate_sha256(sha256: str) -> str:
    """The hash in lower case.

    Raises:
        InvalidRequestError: `sha256` is not exactly 64 hex digits.
    """
    if not isinstance(sha256, str) or not _HEX64.fullmatch(sha256):
        raise InvalidRequestError(f"artifact hash must be 64 hex digits, got {sha256!r:.80}")
    return sha256.lower()


@dataclass(frozen=True)
class CachedArtifact:
    path: str
    meta: ArtifactMeta


class ArtifactCache:
    """Artifacts by sha256 in one directory; safe for concurrent readers and writers.

    Args:
        directory: where the artifacts live (created when missing).
        max_artifact_bytes: the largest single artifact accepted.
        max_total_bytes: the bound on the bytes of all cached artifacts (None = unbounded).
    """

    def __init__(
        self, directory: str, max_artifact_bytes: int, max_total_bytes: int | None = None
    ) -> None:
        self.directory = os.path.abspath(directory)
        self.max_total_bytes = max_total_bytes
        self.max_artifact_bytes = (
            max_artifact_bytes
            if max_total_bytes is None
            else min(max_artifact_bytes, max_total_bytes)
        )
        self._tmp_dir = os.path.join(self.directory, "tmp")
        os.makedirs(self._tmp_dir, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()
        # sha256 -> size in bytes, least recently used first.
        self._sizes: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._in_use: collections.Counter[str] = collections.Counter()
        self._metas: dict[str, ArtifactMeta] = {}
        self._total_bytes = 0
        self._scan()

    @property
    def total_bytes(self) -> int:
        """Bytes of all cached artifacts."""
        with self._lock:
            return self._total_bytes

    def usage(self) -> tuple[int, int]:
        """(artifacts, bytes) cached now, meta files counted in the bytes."""
        with self._lock:
            return len(self._sizes), self._total_bytes

    def has(self, sha256: str) -> bool:
        """Whether the artifact is stored; refreshes its recency (InvalidRequestError if malformed)."""
        sha256 = validate_sha256(sha256)
        with self._lock:
            if sha256 not in self._sizes:
                return False
            self._touch(sha256)
            return True

    def get(self, sha256: str) -> CachedArtifact | None:
        """The stored artifact, or None when absent (does not pin it; see `acquire`)."""
        sha256 = validate_sha256(sha256)
        with self._lock:
            return self._lookup(sha256)

    def acquire(self, sha256: str) -> CachedArtifact | None:
        """Like `get`, but the artifact cannot be evicted until `release(sha256)`."""
        sha256 = validate_sha256(sha256)
        with self._lock:
            cached = self._lookup(sha256)
            if cached is not None:
                self._in_use[sha256] += 1
                self._touch(sha256)
            return cached

    def release(self, sha256: str) -> None:
        """End one `acquire`; evicts what the bound no longer allows."""
        with self._lock:
            self._in_use[sha256] -= 1
            if self._in_use[sha256] <= 0:
                del self._in_use[sha256]
            self._evict()

    def begin(self, meta: ArtifactMeta) -> PendingArtifact:
        """Start storing an artifact; the caller writes chunks, then commits or aborts."""
        validate_sha256(meta.sha256)
        if meta.size_bytes > self.max_artifact_bytes:
            raise ArtifactTooLargeError(
                f"artifact of {meta.size_bytes} bytes exceeds the limit of "
                f"{self.max_artifact_bytes} bytes"
            )
        meta_bytes = len(_meta_text(meta))
        if meta_bytes > MAX_META_BYTES:
            raise ArtifactTooLargeError(
                f"artifact meta of {meta_bytes} bytes exceeds the limit of {MAX_META_BYTES} bytes"
            )
        return PendingArtifact(self, meta)

    def _lookup(self, sha256: str) -> CachedArtifact | None:
        """The caller holds `_lock`."""
        if sha256 not in self._sizes:
            return None
        meta = self._metas.get(sha256)
        if meta is None:
            try:
                with open(self._meta_path(sha256), encoding="utf-8") as f:
                    meta = meta_from_dict(json.load(f))
            except (OSError, ValueError, KeyError, TypeError) as e:
                _LOG.warning("dropping artifact %s with an unreadable meta: %s", sha256, e)
                self._remove(sha256)
                return None
            self._metas[sha256] = meta
        return CachedArtifact(self._bytes_path(sha256), meta)

    def _touch(self, sha256: str) -> None:
        """Mark most recently used, in memory and on disk; the caller holds `_lock`."""
        self._sizes.move_to_end(sha256)
        with contextlib.suppress(OSError):
            os.utime(self._bytes_path(sha256))

    def _added(self, meta: ArtifactMeta, meta_bytes: int) -> None:
        with self._lock:
            old = self._sizes.pop(meta.sha256, None)
            size = meta.size_bytes + meta_bytes
            self._total_bytes += size - (old or 0)
            self._sizes[meta.sha256] = size
            self._metas[meta.sha256] = meta
            self._evict()

    def _evict(self) -> None:
        """Delete least recently used artifacts not in use until under the bound (holds `_lock`)."""
        if self.max_total_bytes is None or self._total_bytes <= self.max_total_bytes:
            return
        for sha in list(self._sizes):
            if self._total_bytes <= self.max_total_bytes:
                return
            if sha in self._in_use:
                continue
            _LOG.info("evicting artifact %s (%d bytes) from the cache", sha, self._sizes[sha])
            self._remove(sha)

    def _remove(self, sha256: str) -> None:
        """Forget and delete one artifact, bytes first (the commit point); holds `_lock`."""
        self._total_bytes -= self._sizes.pop(sha256, 0)
        self._metas.pop(sha256, None)
        _remove_quietly(self._bytes_path(sha256))
        _remove_quietly(self._meta_path(sha256))

    def _scan(self) -> None:
        """Read the directory: drop leftovers of an earlier process, index what is committed."""
        for name in os.listdir(self._tmp_dir):
            _remove_quietly(os.path.join(self._tmp_dir, name))
        found: list[tuple[float, str, int]] = []
        names = set(os.listdir(self.directory))
        for name in names:
            sha = name.removesuffix(_META_SUFFIX)
            if not _HEX64.fullmatch(sha) or sha != sha.lower():
                continue
            has_bytes, has_meta = sha in names, sha + _META_SUFFIX in names
            if not (has_bytes and has_meta):
                _LOG.info("removing half-stored artifact %s", sha)
                _remove_quietly(os.path.join(self.directory, name))
                continue
            if name != sha:
                continue
            try:
                stat = os.stat(self._bytes_path(sha))
                meta_bytes = os.stat(self._meta_path(sha)).st_size
            except OSError:
                continue
            found.append((stat.st_mtime, sha, stat.st_size + meta_bytes))
        for _, sha, size in sorted(found):
            self._sizes[sha] = size
            self._total_bytes += size
        with self._lock:
            self._evict()
        if found:
            _LOG.info(
                "cache %s holds %d artifact(s), %d bytes",
                self.directory,
                len(self._sizes),
                self._total_bytes,
            )

    def _bytes_path(self, sha256: str) -> str:
        return os.path.join(self.directory, sha256)

    def _meta_path(self, sha256: str) -> str:
        return os.path.join(self.directory, sha256 + _META_SUFFIX)


class PendingArtifact:
    """An upload in progress: bytes go to a temp file and are hashed as they arrive."""

    def __init__(self, cache: ArtifactCache, meta: ArtifactMeta) -> None:
        self._cache = cache
        self._meta = dataclasses.replace(meta, sha256=meta.sha256.lower())
        self._hash = hashlib.sha256()
        self._size = 0
        fd, self._tmp_path = tempfile.mkstemp(dir=cache._tmp_dir, prefix="upload-")
        self._file = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        """Append a chunk.

        Raises:
            ArtifactTooLargeError: the artifact grew past the cache's limit (the upload is aborted).
        """
        self._size += len(data)
        if self._size > self._cache.max_artifact_bytes:
            self.abort()
            raise ArtifactTooLargeError(
                f"artifact exceeds the limit of {self._cache.max_artifact_bytes} bytes"
            )
        self._hash.update(data)
        self._file.write(data)

    def commit(self) -> CachedArtifact:
        """Verify the hash and store the artifact atomically, then evict past the bound.

        Raises:
            TruncatedUploadError: the meta announced another size (nothing is stored).
            HashMismatchError: the bytes hash to something else (nothing is stored).
        """
        self._file.close()
        expected = self._meta.size_bytes
        if expected and self._size != expected:
            self.abort()
            raise TruncatedUploadError(
                f"upload of {self._meta.sha256} ended after {self._size} of {expected} bytes"
            )
        actual = self._hash.hexdigest()
        if actual != self._meta.sha256:
            self.abort()
            raise HashMismatchError(
                f"uploaded bytes hash to {actual}, the meta says {self._meta.sha256}"
            )
        meta = dataclasses.replace(self._meta, size_bytes=self._size)
        sha = meta.sha256
        text = _meta_text(meta)
        _write_atomic(self._cache._meta_path(sha), text, self._cache)
        os.replace(self._tmp_path, self._cache._bytes_path(sha))
        _LOG.info("stored artifact %s (%d bytes)", sha, self._size)
        self._cache._added(meta, len(text))
        return CachedArtifact(self._cache._bytes_path(sha), meta)

    def abort(self) -> None:
        """Drop the partial upload; safe to call more than once."""
        if not self._file.closed:
            self._file.close()
        _remove_quietly(self._tmp_path)


def _meta_text(meta: ArtifactMeta) -> bytes:
    """The meta file's bytes."""
    return json.dumps(meta_to_dict(meta)).encode()


def footprint(meta: ArtifactMeta) -> int:
    """What a stored artifact counts against the bound: its bytes and its meta file's."""
    return meta.size_bytes + len(_meta_text(meta))


def _write_atomic(path: str, data: bytes, cache: ArtifactCache) -> None:
    fd, tmp = tempfile.mkstemp(dir=cache._tmp_dir, prefix="meta-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)

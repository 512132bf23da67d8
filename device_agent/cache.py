"""Content-addressed on-disk artifact cache.

Layout under the cache directory: `<sha256>` holds the bytes, `<sha256>.json` the domain meta, and
`tmp/` uploads in progress. Every name is derived from a validated 64-hex-digit hash; no path or file
name is ever taken from the wire. The bytes file is written last, so its presence is the commit point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass

from device_agent.domain import ArtifactMeta, meta_from_dict, meta_to_dict
from device_agent.errors import ArtifactTooLargeError, HashMismatchError, InvalidRequestError

_LOG = logging.getLogger(__name__)
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


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
    """Artifacts by sha256 in one directory; safe for concurrent readers and writers."""

    def __init__(self, directory: str, max_artifact_bytes: int) -> None:
        self.directory = os.path.abspath(directory)
        self.max_artifact_bytes = max_artifact_bytes
        self._tmp_dir = os.path.join(self.directory, "tmp")
        os.makedirs(self._tmp_dir, mode=0o700, exist_ok=True)
        # Leftovers of uploads cut short by a crash of an earlier agent process.
        for name in os.listdir(self._tmp_dir):
            _remove_quietly(os.path.join(self._tmp_dir, name))

    def has(self, sha256: str) -> bool:
        """Whether the artifact is stored (raises InvalidRequestError for a malformed hash)."""
        sha256 = validate_sha256(sha256)
        return os.path.exists(self._bytes_path(sha256)) and os.path.exists(self._meta_path(sha256))

    def get(self, sha256: str) -> CachedArtifact | None:
        """The stored artifact, or None when absent."""
        sha256 = validate_sha256(sha256)
        try:
            with open(self._meta_path(sha256), encoding="utf-8") as f:
                meta = meta_from_dict(json.load(f))
        except FileNotFoundError:
            return None
        path = self._bytes_path(sha256)
        return CachedArtifact(path, meta) if os.path.exists(path) else None

    def begin(self, meta: ArtifactMeta) -> PendingArtifact:
        """Start storing an artifact; the caller writes chunks, then commits or aborts."""
        validate_sha256(meta.sha256)
        if meta.size_bytes > self.max_artifact_bytes:
            raise ArtifactTooLargeError(
                f"artifact of {meta.size_bytes} bytes exceeds the limit of "
                f"{self.max_artifact_bytes} bytes"
            )
        return PendingArtifact(self, meta)

    def _bytes_path(self, sha256: str) -> str:
        return os.path.join(self.directory, sha256)

    def _meta_path(self, sha256: str) -> str:
        return os.path.join(self.directory, sha256 + ".json")


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
        """Verify the hash and store the artifact atomically.

        Raises:
            HashMismatchError: the bytes hash to something else (nothing is stored).
        """
        self._file.close()
        actual = self._hash.hexdigest()
        if actual != self._meta.sha256:
            self.abort()
            raise HashMismatchError(
                f"uploaded bytes hash to {actual}, the meta says {self._meta.sha256}"
            )
        meta = dataclasses.replace(self._meta, size_bytes=self._size)
        sha = meta.sha256
        _write_atomic(
            self._cache._meta_path(sha), json.dumps(meta_to_dict(meta)).encode(), self._cache
        )
        os.replace(self._tmp_path, self._cache._bytes_path(sha))
        _LOG.info("stored artifact %s (%d bytes)", sha, self._size)
        return CachedArtifact(self._cache._bytes_path(sha), meta)

    def abort(self) -> None:
        """Drop the partial upload; safe to call more than once."""
        if not self._file.closed:
            self._file.close()
        _remove_quietly(self._tmp_path)


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

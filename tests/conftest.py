"""Fixtures shared by the test tiers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from compiler import toolchain


@pytest.fixture
def build_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty compiler build cache ($KILN_CACHE_DIR) for one test, so every compile is real and
    nothing lands in the user's cache. A file whose tests all compile takes it for each with
    `pytestmark = pytest.mark.usefixtures("build_cache")`."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(toolchain.CACHE_ENV, str(cache))
    yield cache

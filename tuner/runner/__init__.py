"""Runners measure built candidates: `PoolRunner` on devices leased from a tracker, `FakeRunner` in tests."""

from tuner.runner.base import Runner
from tuner.runner.fake import FakeRunner

__all__ = ["FakeRunner", "Runner"]

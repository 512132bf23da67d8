"""run_model's checks before anything is uploaded: the device must be able to run the build.

The runner here is a stand-in that only answers `device_tags` (the checks come first, so no
device is needed); the run itself is covered by the system tests of `kiln run`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from compiler.artifact import Artifact
from compiler.graph.build_model import ModelArtifact, TensorSpec
from tuner.network.run import ModelRunError, run_model


class TagsOnlyRunner:
    """Answers which device it leased and its tags; any upload or run is a test failure."""

    def __init__(self, tags: dict[str, str]) -> None:
        self.tags = tags

    def device_tags(self) -> tuple[str, dict[str, str]]:
        return "board/0", self.tags

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"run_model went on to {name} after a failed check")


def _model(target: str) -> ModelArtifact:
    art = Artifact(b"so", hashlib.sha256(b"so").hexdigest(), "shared_object", target, ())
    spec = TensorSpec("x", (2,), "float32")
    return ModelArtifact(art, [], (spec,), (spec,), 0, (), "")


@pytest.mark.parametrize(
    ("target", "tags", "message"),
    [
        (
            "x86_64-avx2",
            {"arch": "aarch64"},
            r"x86_64-avx2 \(x86_64\) cannot run on device board/0",
        ),
        ("aarch64-neon", {"arch": "x86_64"}, r"aarch64-neon \(aarch64\) cannot run on device"),
        ("x86_64-avx512", {"arch": "x86_64", "features": "avx2,fma"}, r"needs avx512f"),
        ("riscv-magic", {"arch": "x86_64"}, r"riscv-magic"),
    ],
)
def test_a_build_the_device_cannot_run_is_refused_naming_both(
    target: str, tags: dict[str, str], message: str
) -> None:
    feeds = {"x": np.zeros(2, np.float32)}
    with pytest.raises(ModelRunError, match=message):
        run_model(_model(target), feeds, TagsOnlyRunner(tags))  # type: ignore[arg-type]

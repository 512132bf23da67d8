"""benchmarks/models.py --profile's split of a model's time: every kernel in one part, the parts
and the gap adding up to the whole."""

from __future__ import annotations

import pytest

from benchmarks.models import KernelTime, split


def kt(role: str, op: str, ms: float, template: bool = False) -> KernelTime:
    return KernelTime(f"k_{role}_{op}", 0, role, op, op, ms * 1e-3, template)


def test_the_parts_and_the_gap_add_up_to_the_whole() -> None:
    times = [
        kt("anchor", "conv2d_nchwc", 6.0, template=True),
        kt("anchor", "dense", 1.0, template=True),
        kt("pad", "conv2d_nchwc", 0.5),
        kt("tail", "conv2d_nchwc", 0.25),
        kt("group", "layout_transform", 0.75),
        kt("group", "max_pool2d", 0.5),
        kt("anchor", "batch_matmul", 0.25),  # an anchor no template covers: not tuned
    ]
    parts = dict(split(times, 10e-3))
    assert parts["tuned kernels"] == pytest.approx(7e-3)
    assert parts["pads around them"] == pytest.approx(0.5e-3)
    assert parts["tails around them"] == pytest.approx(0.25e-3)
    assert parts["other: layout_transform"] == pytest.approx(0.75e-3)
    assert parts["other: batch_matmul"] == pytest.approx(0.25e-3)
    assert parts["gap (whole - sum alone)"] == pytest.approx(10e-3 - 9.25e-3)
    assert sum(parts.values()) == pytest.approx(10e-3)
    others = [k for k, _ in split(times, 10e-3) if k.startswith("other")]
    assert others == ["other: layout_transform", "other: max_pool2d", "other: batch_matmul"]

"""benchmarks/cuda.py's conv figure against the faster peer of each layer: cuDNN's FP32 pick
lost to im2col + cuBLAS sgemm by 2-3x on ResNet-18's late layers (H100, 2026-11-28), so the
ratio against cuDNN alone (1.57) flattered ours (0.96 against the faster)."""

from __future__ import annotations

import math

import pytest

from benchmarks.cuda_sections import best_peer_geomean


def test_each_layer_is_judged_against_its_faster_peer() -> None:
    # (ours, cuDNN, im2col+sgemm) ms: cuDNN faster on the first, im2col on the second
    times = [(1.0, 2.0, 3.0), (1.0, 4.0, 0.5)]
    assert best_peer_geomean(times) == pytest.approx(math.sqrt(2.0 * 0.5))


def test_a_peer_that_was_not_measured_does_not_count() -> None:
    assert best_peer_geomean([(2.0, 4.0, math.nan)]) == pytest.approx(2.0)

"""Seeded argument buffers, the timing-config ctypes mirror, and the executor's frame codec."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from device_agent.abi import TimingConfigC
from device_agent.arrays import make_args
from device_agent.domain import ArgRole, EntryPoint, EvaluatorConfig, Status, TensorSpec
from device_agent.framing import FrameError, encode_frame, read_frame
from device_agent.jobs import (
    MEASURE,
    Job,
    JobResult,
    ReferenceCheck,
    job_from_frame,
    job_to_frame,
    result_from_frame,
    result_to_frame,
)

SPECS = (
    TensorSpec("a", (4, 5), "float32", ArgRole.INPUT),
    TensorSpec("w", (16,), "uint8", ArgRole.WORKSPACE),
    TensorSpec("b", (3,), "int8", ArgRole.INPUT),
    TensorSpec("out", (4, 5), "float32", ArgRole.OUTPUT),
)


def test_same_seed_same_args() -> None:
    first, second = make_args(SPECS, seed=7), make_args(SPECS, seed=7)
    for x, y in zip(first, second, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(first[0], make_args(SPECS, seed=8)[0])


def test_args_follow_specs() -> None:
    a, w, b, out = make_args(SPECS, seed=1)
    assert (a.shape, a.dtype) == ((4, 5), np.float32)
    assert (b.dtype, b.min() >= -4, b.max() <= 4) == (np.int8, True, True)
    assert not np.any(w) and not np.any(out)
    assert np.std(a) > 0


def test_only_inputs_draw_from_the_seed() -> None:
    reordered = (SPECS[3], SPECS[0], SPECS[2])
    np.testing.assert_array_equal(make_args(reordered, 5)[1], make_args(SPECS, 5)[0])
    np.testing.assert_array_equal(make_args(reordered, 5)[2], make_args(SPECS, 5)[2])


def test_given_inputs_are_checked() -> None:
    ok: list[np.ndarray] = [np.ones((4, 5), np.float32), np.ones(3, np.int8)]
    np.testing.assert_array_equal(make_args(SPECS, 0, ok)[0], ok[0])
    with pytest.raises(ValueError, match="expected 2 inputs"):
        make_args(SPECS, 0, ok[:1])
    with pytest.raises(ValueError, match="must be float32"):
        make_args(SPECS, 0, [np.ones((4, 5), np.float64), ok[1]])


def test_timing_config_mirror_has_natural_c_layout() -> None:
    offsets = [getattr(TimingConfigC, field[0]).offset for field in TimingConfigC._fields_]
    pointer = ctypes.sizeof(ctypes.c_void_p)
    assert offsets == [0, 4, 8, 16, 24, 32, 32 + pointer]
    assert ctypes.sizeof(TimingConfigC) == 40 + pointer


def test_job_and_result_survive_a_frame() -> None:
    entry = EntryPoint("k", "k__time", SPECS, 3.0)
    job = Job(
        MEASURE,
        "/cache/x",
        entry,
        seed=9,
        timing=EvaluatorConfig(warmup=1, number=2, repeat=3, min_repeat_ms=4.0),
        check=ReferenceCheck("/cache/y", entry, 1e-3, 1e-4),
        inputs=(np.arange(6, dtype=np.int16).reshape(2, 3),),
    )
    header, blobs = job_to_frame(job)
    data = encode_frame(header, blobs)
    pos = 0

    def read_exact(n: int) -> bytes:
        nonlocal pos
        pos += n
        return data[pos - n : pos]

    back = job_from_frame(read_frame(read_exact))
    assert back.inputs is not None and job.inputs is not None
    np.testing.assert_array_equal(back.inputs[0], job.inputs[0])
    assert (back.entry, back.timing, back.check, back.seed) == (
        job.entry,
        job.timing,
        job.check,
        job.seed,
    )
    result = JobResult(Status.CRASH, (1.0, 2.0), 4, "boom", 11, (np.ones((2, 2), np.float32),))
    again = result_from_frame(result_to_frame(result))
    assert (again.status, again.samples_s, again.signal) == (Status.CRASH, (1.0, 2.0), 11)
    np.testing.assert_array_equal(again.outputs[0], result.outputs[0])


def test_malformed_frame_is_refused() -> None:
    data = b"\x05\x00\x00\x00\x00\x00\x00\x00nope!"
    pos = 0

    def read_exact(n: int) -> bytes:
        nonlocal pos
        pos += n
        return data[pos - n : pos]

    with pytest.raises(FrameError):
        read_frame(read_exact)

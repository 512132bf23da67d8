"""Halide's blur (examples/blur.py): the clean and tuned schedules and the plain C loop against
numpy, at sizes no tile divides, on 1 and 2 OpenMP threads, into aligned and misaligned outputs;
the tuned schedule's loop structure, its per-column blur_x region through the loop-IR
interpreter, and its C (blur_x in registers, streamed stores)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.build import build_source
from compiler.ir import interpreter
from compiler.lower import lower
from examples import blur
from examples.blur import (
    RTOL,
    TunedConfig,
    aligned_zeros,
    blur_calls,
    clean_schedule,
    kiln_call,
    plain_call,
    random_image,
    reference,
    tuned_schedule,
    with_threads,
)

pytestmark = pytest.mark.usefixtures("build_cache")

SMALL = TunedConfig(rows=3, lanes=8)  # tails everywhere at 37 x 53


def check(got: np.ndarray, image: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, reference(image), rtol=RTOL, atol=RTOL, err_msg=what)


def test_the_tuned_schedule_keeps_a_column_of_blur_x_in_registers() -> None:
    h, w = 37, 53
    sch, args = tuned_schedule(h, w, TunedConfig(rows=4, lanes=8))
    func = lower(sch, args, "blur")
    text = str(func)
    assert text.startswith("def blur") and "parallel(" in text and "vectorized(8)" in text
    # bound inference: 4 rows of one 8-wide column of blur_y read 4 + 2 rows of blur_x there
    assert "blur_x = allocate(float32[6, 8], local)" in text
    assert "pragma nontemporal=1" in text
    image = random_image(h, w, seed=3)
    out = np.full((h, w), np.nan, np.float32)
    interpreter.run(func, image, out)
    check(out, image, "interpreter")
    source = build_source(sch, args, "blur", "x86_64-avx512")
    kernel = source[
        source.index("int32_t blur(") : source.index("\n}\n", source.index("int32_t blur("))
    ]
    assert "kiln_vec_float32x8 blur_x_0;" in kernel and "blur_x[" not in kernel  # registers
    assert "kiln_vstream_float32x8(&blur_y[" in kernel


@pytest.mark.parametrize(
    ("height", "width", "cfg"),
    [
        (37, 53, SMALL),
        (70, 301, TunedConfig()),
        (70, 301, TunedConfig(nontemporal=False)),
        (20, 2053, TunedConfig(rows=16)),  # one group and a tail of 4 rows
        (5, 7, SMALL),
        (64, 64, TunedConfig(16, 16)),
        (33, 67, TunedConfig(rows=1, lanes=32)),
        (1, 16, TunedConfig(rows=4)),  # fewer rows than one group
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_clean_tuned_and_plain_c_match_numpy(
    height: int, width: int, cfg: TunedConfig, threads: int
) -> None:
    image = random_image(height, width, seed=height * width)
    threads_before = blur._libgomp().omp_get_max_threads()
    for name, (sch, args) in {
        "clean": clean_schedule(height, width),
        "tuned": tuned_schedule(height, width, cfg),
    }.items():
        for offset in (0, 1):  # aligned rows stream their stores, the others store plainly
            raw = aligned_zeros((height * width + offset,))
            out = raw[offset:].reshape(height, width)
            out.fill(np.nan)
            with_threads(kiln_call(sch, args, image, out, f"blur_{name}"), threads)()
            check(out, image, f"{name}, output {offset} floats past 64 bytes")
    assert blur._libgomp().omp_get_max_threads() == threads_before  # put back after each call
    out = np.full((height, width), np.nan, np.float32)
    plain_call(image, out)()
    check(out, image, "plain C")


def test_aligned_zeros_start_on_the_boundary() -> None:
    for shape in [(3,), (7, 5), (2050, 2050)]:
        a = aligned_zeros(shape)
        assert a.shape == shape and a.dtype == np.float32 and a.ctypes.data % 64 == 0
        assert not a.any()
    assert random_image(5, 9).ctypes.data % 64 == 0


def test_the_examples_own_check_passes_and_catches_a_wrong_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    image = random_image(19, 45, seed=1)
    calls = blur_calls(19, 45, 2, image)
    assert list(calls) == ["clean", "tuned, 1 thread", "tuned, 2 threads", "plain C -O3"]
    monkeypatch.setattr(blur, "reference", lambda img: reference(img) + np.float32(1e-3))
    with pytest.raises(AssertionError, match="clean: differs from numpy"):
        blur_calls(19, 45, 2, image)


def test_stores_stream_only_where_image_and_output_exceed_the_cache() -> None:
    mib = 2**20
    # 2048 x 2048: 16.8 MB in and 16.8 MB out
    assert blur.config_for(2048, 2048, cache_bytes=32 * mib).nontemporal
    assert not blur.config_for(2048, 2048, cache_bytes=64 * mib).nontemporal
    # 1920 x 1080: 16.6 MB in all, inside a 32 MiB cache
    assert not blur.config_for(1080, 1920, cache_bytes=32 * mib).nontemporal
    # by default, this machine's cache decides, and the schedule follows the config
    cfg = blur.config_for(1080, 1920)
    cache = blur.last_level_cache_bytes()
    assert cache is None or cache >= 2**16
    assert cfg.nontemporal == (cache is None or cache < 4 * (1082 * 1922 + 1080 * 1920))
    for nontemporal in (False, True):
        sch, args = tuned_schedule(40, 64, TunedConfig(nontemporal=nontemporal))
        assert ("pragma nontemporal=1" in str(lower(sch, args, "b"))) == nontemporal

"""Halide's blur (examples/blur.py): the clean and tuned schedules and the plain C loop against
numpy, at sizes no tile divides, on 1 and 2 OpenMP threads; the tuned schedule's loop structure
and its per-tile blur_x region through the loop-IR interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir import interpreter
from compiler.lower import lower
from examples import blur
from examples.blur import (
    RTOL,
    TunedConfig,
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

SMALL = TunedConfig(tile_y=8, tile_x=32, lanes=8, unroll_y=3)  # tails everywhere at 37 x 53


def check(got: np.ndarray, image: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, reference(image), rtol=RTOL, atol=RTOL, err_msg=what)


def test_the_tuned_schedule_computes_blur_x_per_tile_in_parallel_rows_of_tiles() -> None:
    h, w = 37, 53
    sch, args = tuned_schedule(h, w, TunedConfig(tile_y=8, tile_x=32, lanes=8, unroll_y=4))
    func = lower(sch, args, "blur")
    text = str(func)
    assert text.startswith("def blur") and "parallel(" in text and "vectorized(8)" in text
    # bound inference: a tile of 8 x 32 outputs reads 8 + 2 rows of blur_x, 32 wide
    assert "blur_x = allocate(float32[10, 32]" in text
    image = random_image(h, w, seed=3)
    out = np.full((h, w), np.nan, np.float32)
    interpreter.run(func, image, out)
    check(out, image, "interpreter")


@pytest.mark.parametrize(
    ("height", "width", "cfg"),
    [
        (37, 53, SMALL),
        (70, 301, TunedConfig()),
        (70, 301, TunedConfig(32, 256)),  # the paper's tiles
        (20, 2053, TunedConfig(tile_y=8)),  # a tail of the 2048-wide tile
        (5, 7, SMALL),
        (64, 64, TunedConfig(16, 16, 16, 1)),
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
        out = np.full((height, width), np.nan, np.float32)
        with_threads(kiln_call(sch, args, image, out, f"blur_{name}"), threads)()
        check(out, image, name)
    assert blur._libgomp().omp_get_max_threads() == threads_before  # put back after each call
    out = np.full((height, width), np.nan, np.float32)
    plain_call(image, out)()
    check(out, image, "plain C")


def test_the_examples_own_check_passes_and_catches_a_wrong_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    image = random_image(19, 45, seed=1)
    calls = blur_calls(19, 45, 2, image)
    assert list(calls) == ["clean", "tuned, 1 thread", "tuned, 2 threads", "plain C -O3"]
    monkeypatch.setattr(blur, "reference", lambda img: reference(img) + np.float32(1e-3))
    with pytest.raises(AssertionError, match="clean: differs from numpy"):
        blur_calls(19, 45, 2, image)

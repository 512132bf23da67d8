"""The untuned 1x1 build's flat tile (`Conv2d1x1Template.default_rank` through
`model_kernels.default_config`): at most DEFAULT_FLAT_MAX_PIXELS pixels, one that divides the
image's pixels where one fits, else the largest; strided 1x1s keep the space's first tile."""

from __future__ import annotations

import pytest
from test_compiler_ops import check_close, reduction_length, run_built, template

from compiler.graph.model_kernels import default_config
from compiler.ops.base import PARALLEL_KNOB
from compiler.ops.conv2d import DEFAULT_FLAT_MAX_PIXELS, FLAT_TILES

AVX512 = "x86_64-avx512"

# (workload, layout blocks, the tile the rule picks on AVX-512): MobileNetV2's 56x56 layers on
# one vector of output channels (24 and 20 pixels fit, but 3136 = 16 x 196), its 14x14 and 7x7
# layers on two vectors (12 pixels fit; 7 divides 196 and 49), a 24x24 image that 24 divides
# (the cap takes 16, which divides 576 too), a 13x13 image no fitting tile divides.
CASES = [
    ((1, 24, 56, 56, 144, 1, 1, 1, 0, 3), {"ic_block": 8, "oc_block": 16}, 16),
    ((1, 144, 56, 56, 24, 1, 1, 1, 0, 1), {"ic_block": 16, "oc_block": 8}, 16),
    ((1, 96, 14, 14, 576, 1, 1, 1, 0, 3), {"ic_block": 32, "oc_block": 32}, 7),
    ((1, 960, 7, 7, 320, 1, 1, 1, 0, 1), {"ic_block": 32, "oc_block": 32}, 7),
    ((1, 32, 24, 24, 32, 1, 1, 1, 0, 1), {"ic_block": 16, "oc_block": 16}, 16),
    ((1, 64, 13, 13, 64, 1, 1, 1, 0, 1), {"ic_block": 32, "oc_block": 32}, 12),
]


@pytest.mark.parametrize(("workload", "blocks", "tile"), CASES)
def test_the_default_flat_tile_divides_the_pixels_and_stays_small(
    workload: tuple[int, ...], blocks: dict[str, int], tile: int
) -> None:
    t = template("conv2d_1x1_nchwc")
    config = default_config(t, workload, AVX512, blocks)
    assert config["reg_n"] == tile
    assert config["oc_order"] == "outer"  # the rest of the config is the space's first
    space = t.config_space(workload)
    fitting = [
        n
        for n in FLAT_TILES
        if t.worth_measuring(workload, space.get(space.index_of({**config, "reg_n": n})), AVX512)
    ]
    small = [n for n in fitting if n <= DEFAULT_FLAT_MAX_PIXELS]
    dividing = [n for n in small if (workload[2] * workload[3]) % n == 0]
    assert tile == max(dividing or small)


def test_two_threads_take_the_same_tile_and_a_fused_loop_never_splits_a_tail() -> None:
    t = template("conv2d_1x1_nchwc")
    for workload, blocks, tile in CASES[:4]:
        config = default_config(t, workload, AVX512, blocks, threads=2)
        assert config["reg_n"] == tile and config[PARALLEL_KNOB] != "none"
    seven = default_config(t, CASES[3][0], AVX512, CASES[3][1], threads=2)
    assert seven[PARALLEL_KNOB] == "outer"  # 10 output blocks share out evenly as they are


def test_a_strided_1x1_keeps_the_first_row_tile_that_fits() -> None:
    t = template("conv2d_1x1_nchwc")
    workload = (1, 64, 56, 56, 128, 1, 1, 2, 0, 1)
    config = default_config(t, workload, AVX512, {"ic_block": 16, "oc_block": 16})
    space = t.config_space(workload)
    first = next(
        c
        for c in map(space.get, range(len(space)))
        if c["ic_block"] == 16 and c["oc_block"] == 16 and t.worth_measuring(workload, c, AVX512)
    )
    assert config == first


def test_the_default_tiles_compute_the_convolution() -> None:
    t = template("conv2d_1x1_nchwc")
    small = [
        ((1, 32, 7, 7, 64, 1, 1, 1, 0, 2), {"ic_block": 32, "oc_block": 32}),
        ((1, 16, 12, 12, 16, 1, 1, 1, 0, 1), {"ic_block": 16, "oc_block": 16}),
    ]
    cases = [(w, default_config(t, w, "host", b)) for w, b in small]
    for (workload, config), (ours, ref) in zip(cases, run_built(t, cases), strict=True):
        what = f"{workload} {dict(config)}"
        check_close(ours, ref, what, reduction_length(t, workload, ref.size))

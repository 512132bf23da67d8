"""The Winograd conv template's own parts: its transform matrices, the weight transform, and the
lowering that keeps one branch of each transform's Select chain (the op-level checks against
numpy, built and interpreted, are in test_compiler_ops.py with every other template)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from compiler import ops
from compiler.codegen.c import render_c
from compiler.ir.printer import to_str
from compiler.lower import lower
from compiler.ops.conv2d import conv2d_reference
from compiler.ops.winograd import (
    Conv2dWinogradTemplate,
    _as_array,
    transform_weight,
    winograd_matrices,
)


@pytest.mark.parametrize("m", [2, 4])
def test_matrices_compute_a_one_dimensional_correlation(m: int) -> None:
    at, g, bt = (_as_array(x) for x in winograd_matrices(m))
    assert at.shape == (m, m + 2) and g.shape == (m + 2, 3) and bt.shape == (m + 2, m + 2)
    rng = np.random.default_rng(m)
    for _ in range(5):
        d, w = rng.standard_normal(m + 2), rng.standard_normal(3)
        expected = [d[i : i + 3] @ w for i in range(m)]
        np.testing.assert_allclose(at @ ((g @ w) * (bt @ d)), expected, rtol=1e-12, atol=1e-12)


def test_f4_matrices_are_lavins() -> None:
    """F(4x4, 3x3) over the points 0, +-1, +-2: the matrices of Lavin and Gray (2016)."""
    at, g, bt = (_as_array(x) for x in winograd_matrices(4))
    assert at.tolist()[3] == [0, 1, -1, 8, -8, 1]
    assert bt.tolist()[0] == [4, 0, -5, 0, 1, 0]
    assert g[1].tolist() == pytest.approx([-1 / 6] * 3)


def test_unknown_tile_is_refused() -> None:
    with pytest.raises(ValueError, match="tile must be one of"):
        winograd_matrices(3)


@pytest.mark.parametrize("m", [2, 4])
def test_transformed_weights_give_the_convolution_of_one_tile(m: int) -> None:
    """A^T [U . (B^T d B)] A over one tile equals the direct 3x3 convolution of that tile."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 3, 3, 3)).astype(np.float32)
    d = rng.standard_normal((1, 3, m + 2, m + 2)).astype(np.float32)
    u = transform_weight(w, m, 16)  # [alpha][alpha][1][IC][16]
    at, _, bt = (_as_array(x) for x in winograd_matrices(m))
    v = np.einsum("ea,cab,fb->efc", bt, d[0].astype(np.float64), bt)
    mm = np.einsum("efc,efco->efo", v, u[:, :, 0].astype(np.float64))
    y = np.einsum("re,efo,sf->ors", at, mm, at)
    np.testing.assert_allclose(y, conv2d_reference(d, w, None, 1, 0, False)[0], atol=1e-4)


@pytest.mark.parametrize("tile", [2, 4])
def test_lowering_keeps_one_branch_of_each_transform(tile: int) -> None:
    """Once the transform axes are unrolled no Select is left: only the non-zero coefficients
    of B^T d B and A^T M A are computed (a Select left would evaluate every branch)."""
    t = ops.get_template("conv2d_winograd_nchwc")
    assert isinstance(t, Conv2dWinogradTemplate)
    shape = (1, 16, 10, 9, 16, 3, 3, 1, 1, 2)
    space = t.config_space(shape)
    config = next(c for c in (space.get(i) for i in range(len(space))) if c["tile"] == tile)
    sch, args = t.instantiate(shape, config)
    func = lower(sch, args, "wino")
    unlowered = to_str(lower(sch, args, "wino", passes=["flatten", "simplify"]))
    assert unlowered.count("select(") >= 2  # one chain per transform before the unroll
    assert "select(" not in to_str(func)
    source = render_c([(func, "wino")])
    assert "?" not in source.split("wino(", 1)[1]


def test_input_is_padded_to_whole_tiles() -> None:
    t = Conv2dWinogradTemplate()
    shape = (1, 16, 7, 9, 16, 3, 3, 1, 1, 0)  # 7x9 output: 2x3 tiles of 4
    space = t.config_space(shape)
    config = next(c for c in (space.get(i) for i in range(len(space))) if c["tile"] == 4)
    assert t.padded_hw(shape, config) == (10, 14)
    x, _ = t.random_inputs(shape, np.random.default_rng(0))
    packed = t.pack_inputs(shape, config, [x, np.zeros((16, 16, 3, 3), np.float32)])
    assert packed[0].shape == (1, 1, 10, 14, 16)
    np.testing.assert_array_equal(packed[0][0, 0, 1:8, 1:10, :], x[0].transpose(1, 2, 0))
    assert not packed[0][0, 0, 8:].any() and not packed[0][0, 0, :, 10:].any()


@pytest.mark.parametrize("tile", [2, 4])
def test_transforms_are_computed_in_halves_where_that_sums_fewer_terms(tile: int) -> None:
    """F(4x4) computes d B then B^T (d B) per input tile, and M A then A^T (M A) per output
    tile: the C reads each input vector once per non-zero of B^T's rows and columns (6 x 22),
    not once per non-zero of B^T d B's 484 terms, and each product once per non-zero of A^T's
    rows. F(2x2), as cheap either way, stays one stage."""
    t = Conv2dWinogradTemplate()
    shape = (1, 64, 8, 8, 32, 3, 3, 1, 1, 0)
    space = t.config_space(shape)
    config = next(
        c
        for c in (space.get(i) for i in range(len(space)))
        if (c["tile"], c["ic_block"], c["oc_block"]) == (tile, 64, 32)
    )
    sch, args = t.instantiate(shape, config)
    source = render_c([(lower(sch, args, "wino"), "wino")], vector_bytes=64)
    body = source.split("wino(", 1)[1]
    at, _, bt = winograd_matrices(tile)
    nonzeros_b = sum(1 for row in bt for x in row if x)
    nonzeros_a = sum(1 for row in at for x in row if x)
    # a read of `data` or of a base pointer into it (codegen.bases)
    data_reads = len(re.findall(r"kiln_vload_float32x16\(&data(?:_at\w*)?\[", body))
    product_reads = len(re.findall(r"kiln_vload_float32x16\(&wino_mm(?:_at\w*)?\[", body))
    if tile == 4:
        assert {s.name for s in sch.stages} >= {"wino_db", "wino_ma"}
        assert data_reads == 4 * (tile + 2) * nonzeros_b  # 4 vectors of 16 input lanes
        assert product_reads == 2 * (tile + 2) * nonzeros_a  # 2 vectors of 16 output lanes
    else:
        assert not {s.name for s in sch.stages} & {"wino_db", "wino_ma"}
        assert data_reads == 4 * nonzeros_b**2  # every term, for each of the 4 vectors

"""The GPU templates of depthwise conv2d, pooling, softmax, layer norm and injective ops
(compiler/ops/cuda/{depthwise,pool,norm,injective}.py): every sampled config run in the loop-IR
interpreter against numpy at odd sizes, knobs that change the rendered CUDA, and the rendered
kernels compiled by nvcc for sm_90 in one call (skipped without nvcc). Nothing here runs on a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from compiler import ops, te
from compiler.codegen.cuda import CUDA_PRELUDE, render_cuda
from compiler.errors import ScheduleError
from compiler.ir import PrimFunc, interpreter
from compiler.ir import expr as E
from compiler.ir.stmt import Allocate
from compiler.ir.transform import walk_stmts
from compiler.lower import lower
from compiler.ops.base import OpTemplate
from compiler.ops.cuda.depthwise import SHARED_BYTES
from compiler.ops.cuda.injective import schedule_injective_cuda
from compiler.ops.space import Config
from compiler.schedule import create_schedule
from compiler.toolchain import compile_cuda, find_nvcc

# template -> a small odd workload for the interpreter (channels 3-5, widths 9-13, rows of 37)
ODD: dict[str, tuple[int, ...]] = {
    "cuda_depthwise_conv2d": (1, 3, 9, 13, 3, 3, 1, 1, 0),
    "cuda_max_pool2d": (1, 3, 11, 13, 3, 2, 1),
    "cuda_avg_pool2d": (2, 3, 9, 13, 3, 1, 1),
    "cuda_global_avg_pool2d": (2, 5, 7, 9),
    "cuda_softmax": (5, 37),
    "cuda_layer_norm": (5, 37),
    "cuda_elementwise_add": (3, 37),
    "cuda_elementwise_multiply": (3, 37),
    "cuda_elementwise_relu": (3, 37),
    "cuda_elementwise_add_relu": (3, 37),
}
# more odd workloads of the templates with options the ones above leave out
MORE_ODD = [
    ("cuda_depthwise_conv2d", (1, 5, 11, 9, 3, 3, 2, 1, 3)),  # stride 2, bias + ReLU6
    ("cuda_depthwise_conv2d", (2, 3, 7, 6, 2, 3, 1, 0, 1)),  # no padding, + bias
    ("cuda_depthwise_conv2d", (1, 19, 5, 13, 3, 3, 1, 1, 2)),  # 19 channels, + bias, ReLU
    ("cuda_softmax", (3, 5)),  # rows shorter than a warp
    ("cuda_layer_norm", (9, 13)),
    ("cuda_layer_norm", (3, 101)),  # 64 threads a row: a shared step, then a warp's shuffles
]
# model-sized workloads: what nvcc compiles and where the knobs are not capped by the size
REAL: dict[str, tuple[int, ...]] = {
    "cuda_depthwise_conv2d": (1, 96, 112, 112, 3, 3, 2, 1, 3),
    "cuda_max_pool2d": (1, 64, 112, 112, 3, 2, 1),
    "cuda_avg_pool2d": (1, 64, 56, 56, 3, 1, 1),
    "cuda_global_avg_pool2d": (1, 512, 7, 7),
    "cuda_softmax": (128, 1000),
    "cuda_layer_norm": (128, 768),
    "cuda_elementwise_add": (256, 3136),
    "cuda_elementwise_multiply": (256, 3136),
    "cuda_elementwise_relu": (256, 3136),
    "cuda_elementwise_add_relu": (256, 3136),
}


def template(name: str) -> OpTemplate:
    t = ops.get_template(name)
    assert isinstance(t, OpTemplate)
    return t


def sample(name: str, shape: tuple[int, ...], count: int = 4) -> list[Config]:
    """The default (index 0), the last config and `count` seeded random others."""
    space = template(name).config_space(shape)
    rng = np.random.default_rng(len(space))
    picks = {0, len(space) - 1, *(int(i) for i in rng.integers(0, len(space), count))}
    return [space.get(i) for i in sorted(picks)]


def run_in_interpreter(name: str, shape: tuple[int, ...], config: Config) -> None:
    t = template(name)
    sch, args = t.instantiate(shape, config)
    func = lower(sch, args, "op")
    logical = t.random_inputs(shape, np.random.default_rng(7))
    out = np.full(args[-1].shape, np.nan, np.float32)
    interpreter.run(func, *t.pack_inputs(shape, config, logical), out)
    got = t.unpack_output(shape, config, out)
    np.testing.assert_allclose(
        got, t.reference_for(shape, *logical), rtol=1e-5, atol=1e-5, err_msg=f"{dict(config)}"
    )


@pytest.mark.parametrize(("name", "shape"), [*ODD.items(), *MORE_ODD])
def test_sampled_configs_match_numpy_in_the_interpreter(name: str, shape: tuple[int, ...]) -> None:
    for config in sample(name, shape):
        run_in_interpreter(name, shape, config)


@pytest.mark.parametrize("name", ["cuda_softmax", "cuda_layer_norm"])
def test_every_row_config_matches_numpy_in_the_interpreter(name: str) -> None:
    # the row templates carry the cross-thread reductions: all 24 configs, a row of 37
    space = template(name).config_space(ODD[name])
    for index in range(len(space)):
        run_in_interpreter(name, ODD[name], space.get(index))


def _differs(name: str, shape: tuple[int, ...], base: Mapping[str, Any], knob: str) -> bool:
    """Whether every other value of `knob` renders other CUDA than `base`'s."""
    t = template(name)
    space = t.config_space(shape)

    def source(values: Mapping[str, Any]) -> str:
        config = space.get(space.index_of(values))
        sch, args = t.instantiate(shape, config)
        return render_cuda(lower(sch, args, "op"), "op").source

    reference = source(base)
    choices = next(k.choices for k in space.knobs if k.name == knob)
    return all(source({**base, knob: v}) != reference for v in choices if v != base[knob])


@pytest.mark.parametrize("name", sorted(REAL))
def test_every_knob_changes_the_rendered_kernel(name: str) -> None:
    shape = REAL[name]
    space = template(name).config_space(shape)
    base = dict(space.get(0))
    for knob in space.knobs:
        if len(knob.choices) > 1:
            assert _differs(name, shape, base, knob.name), knob.name


def test_row_modes_launch_a_row_per_block_or_per_warp() -> None:
    t = template("cuda_softmax")
    shape = REAL["cuda_softmax"]
    space = t.config_space(shape)
    launches, barriers = {}, {}
    for rows in ("block", "warp"):
        values = {"rows": rows, "threads": 256, "unroll": False, "cache_row": False}
        config = space.get(space.index_of(values))
        sch, args = t.instantiate(shape, config)
        kernel = render_cuda(lower(sch, args, "op"), "op")
        launches[rows] = (kernel.grid, kernel.block)
        barriers[rows] = kernel.source.count("__syncthreads();")
        assert "__shfl_down_sync(0xffffffffu, v, s)" in kernel.source  # each tree's last warp
    assert launches == {"block": ((128, 1, 1), (256, 1, 1)), "warp": ((16, 1, 1), (32, 8, 1))}
    # per statistic: partials, the shared steps 256 -> 32 (block only), the warp, the result
    assert barriers == {"block": 2 * 6, "warp": 2 * 3}


def test_cached_rows_are_read_from_global_memory_once_where_they_fit() -> None:
    t = template("cuda_layer_norm")
    shape = (64, 768)
    space = t.config_space(shape)
    base = {"rows": "warp", "threads": 256, "unroll": False}
    for cache_row in (False, True):
        config = space.get(space.index_of({**base, "cache_row": cache_row}))
        sch, args = t.instantiate(shape, config)
        source = render_cuda(lower(sch, args, "op"), "op").source
        reads = len(re.findall(r"= x\[|\(x\[|, x\[", source))
        assert ("__shared__ __align__(16) float x_shared[6144];" in source) is cache_row
        # the mean, the variance's x - mean (twice) and the output, or the one copy
        assert reads == (1 if cache_row else 4), source
    # 32 rows of 768 (96 KB) do not fit: the knob would change nothing, so not worth a trial
    big = space.get(space.index_of({**base, "threads": 1024, "cache_row": True}))
    assert not t.worth_measuring(shape, big) and t.worth_measuring(shape, space.get(0))


def test_depthwise_stages_its_input_tile_in_shared_memory() -> None:
    t = template("cuda_depthwise_conv2d")
    shape = REAL["cuda_depthwise_conv2d"]
    space = t.config_space(shape)
    values = {"tile_c": 2, "tile_h": 4, "tile_w": 16, "reg_w": 2, "unroll_kw": True}
    sch, args = t.instantiate(shape, space.get(space.index_of(values)))
    kernel = render_cuda(lower(sch, args, "op"), "op")
    # 2 channels x ((4 - 1) * 2 + 3) rows x ((32 - 1) * 2 + 3) columns, padding included
    assert "__shared__ __align__(16) float data_pad[1170];" in kernel.source
    assert kernel.block == (16, 4, 2)
    # the whole 3x3 window unrolled: the thread's channel weights in registers
    assert "float weight_local[9];" in kernel.source


def test_a_fused_injective_group_runs_on_one_schedule() -> None:
    # a bias broadcast along the channels, a residual add and a ReLU6 over a 4-D tensor
    n, c, h, w = 2, 5, 3, 7
    x = te.placeholder((n, c, h, w), name="x")
    res = te.placeholder((n, c, h, w), name="res")
    bias = te.placeholder((c,), name="bias")
    biased = te.compute((n, c, h, w), lambda a, b, y, z: x[a, b, y, z] + bias[b], name="biased")
    summed = te.compute(
        (n, c, h, w), lambda a, b, y, z: biased[a, b, y, z] + res[a, b, y, z], name="summed"
    )
    out = te.compute(
        (n, c, h, w),
        lambda a, b, y, z: E.Min(E.Max(summed[a, b, y, z], E.FloatImm(0.0)), E.FloatImm(6.0)),
        name="out",
    )
    rng = np.random.default_rng(3)
    xs, rs = (rng.uniform(-4, 8, (n, c, h, w)).astype(np.float32) for _ in range(2))
    bs = rng.uniform(-1, 1, c).astype(np.float32)
    want = np.clip(xs + bs.reshape(1, c, 1, 1) + rs, 0.0, 6.0)
    for config in ({}, {"threads": 64, "unroll": 4, "vector": 2}, {"threads": 128, "unroll": 2}):
        sch = create_schedule(out)
        schedule_injective_cuda(sch, out, config)
        func = lower(sch, [x, res, bias, out], "group")
        assert "biased" not in str(func) and "summed" not in str(func)  # inlined: one pass
        got = np.full((n, c, h, w), np.nan, np.float32)
        interpreter.run(func, xs, rs, bs, got)
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=str(config))


def test_a_vector_of_four_makes_a_flat_copy_128_bit_accesses() -> None:
    a = te.placeholder((4096,), name="a")
    out = te.compute((4096,), lambda i: a[i], name="out")
    sources = {}
    for vector in (1, 4):
        sch = create_schedule(out)
        schedule_injective_cuda(sch, out, {"threads": 64, "vector": vector})
        sources[vector] = render_cuda(lower(sch, [a, out], "copy"), "copy").source
    assert "float4" not in sources[1]
    assert "*(float4 *)(out + " in sources[4] and "*(const float4 *)(a + " in sources[4]


def test_the_injective_schedule_refuses_a_reduction() -> None:
    x = te.placeholder((4, 4), name="x")
    k = te.reduce_axis((0, 4), name="k")
    out = te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="out")
    with pytest.raises(ScheduleError, match="stage out: schedule_injective_cuda takes injective"):
        schedule_injective_cuda(create_schedule(out), out, {})


def shared_bytes(func: PrimFunc) -> int:
    """Bytes of the shared arrays a kernel declares (all live at once: CUDA's static limit)."""
    return sum(
        s.buffer.size * 4
        for s in walk_stmts(func.body)
        if isinstance(s, Allocate) and s.buffer.scope == "shared"
    )


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("cuda_softmax", (128, 1000)),
        ("cuda_layer_norm", (128, 768)),
        ("cuda_layer_norm", (64, 3072)),
        ("cuda_layer_norm", (8, 12288)),  # a block row alone is the whole 48 KB
    ],
)
def test_every_row_config_fits_static_shared_memory(name: str, shape: tuple[int, ...]) -> None:
    t = template(name)
    space = t.config_space(shape)
    for index in range(len(space)):
        sch, args = t.instantiate(shape, space.get(index))
        assert shared_bytes(lower(sch, args, "op")) <= SHARED_BYTES, dict(space.get(index))


@pytest.mark.parametrize(
    "shape",
    [
        REAL["cuda_depthwise_conv2d"],
        (1, 32, 112, 112, 7, 7, 2, 3, 0),
        (1, 8, 64, 64, 5, 5, 1, 2, 0),
    ],
)
def test_the_largest_depthwise_tile_fits_static_shared_memory(shape: tuple[int, ...]) -> None:
    t = template("cuda_depthwise_conv2d")
    space = t.config_space(shape)
    largest = space.get(len(space) - 1)  # every knob's last choice: the biggest tile
    sch, args = t.instantiate(shape, largest)
    assert shared_bytes(lower(sch, args, "op")) <= SHARED_BYTES


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
@pytest.mark.usefixtures("build_cache")
def test_nvcc_compiles_sampled_kernels_for_sm_90() -> None:
    # one nvcc call: the default and last config of every template at model sizes, plus two
    # sampled configs at odd sizes, as one translation unit
    kernels = []
    for name, shape in [*REAL.items(), *ODD.items()]:
        space = template(name).config_space(shape)
        real = shape == REAL[name]
        picks = [space.get(0), space.get(len(space) - 1)] if real else sample(name, shape, 1)[1:3]
        for i, config in enumerate(picks):
            sch, args = template(name).instantiate(shape, config)
            symbol = f"{name}_{'real' if real else 'odd'}_{i}"
            kernels.append(render_cuda(lower(sch, args, symbol), symbol).source)
    unit = CUDA_PRELUDE + "".join(k.removeprefix(CUDA_PRELUDE) for k in kernels)
    cubin = compile_cuda(unit, "sm_90")
    assert cubin[:4] == b"\x7fELF"
    for name in REAL:
        assert f"{name}_real_1".encode() in cubin

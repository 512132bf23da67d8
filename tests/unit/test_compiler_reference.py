"""Reference kernels: every library template's naive kernel for a config takes that config's
argument layout, matches numpy (built with gcc), is scheduled naively, and depends on the config
only through the template's layout knobs (byte-identical C for configs that share a layout)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from compiler import ops, toolchain
from compiler.build import build_source, build_source_many
from compiler.ops.base import OpTemplate, output_arrays
from compiler.ops.reference import REFERENCE_PREFIX, reference_kernel, reference_symbol
from compiler.ops.space import Config
from compiler.te.tensor import PlaceholderOp, Tensor

pytestmark = pytest.mark.usefixtures("build_cache")

# Small workloads whose spaces have at least two layouts where the template has layout knobs.
SHAPES: dict[str, list[tuple[int, ...]]] = {
    "matmul": [(9, 20, 13)],
    "vta_dense": [(33, 17, 19)],
    "vta_conv2d": [(20, 7, 9, 24, 3, 2, 1)],
    "dense": [(7, 33, 128), (5, 32, 64)],  # N not a multiple of nr (a [M][N] output), and one
    "conv2d_nchwc": [(1, 32, 6, 5, 32, 3, 3, 1, 1, 2), (1, 16, 7, 7, 32, 3, 3, 2, 1, 3)],
    "conv2d_1x1_nchwc": [(1, 32, 5, 5, 32, 1, 1, 1, 0, 1), (1, 16, 6, 6, 32, 1, 1, 2, 0, 0)],
    "grouped_conv2d_1x1_nchwc": [
        (1, 24, 5, 6, 60, 1, 1, 1, 0, 2, 3),
        (1, 32, 4, 4, 64, 1, 1, 1, 0, 0, 2),
    ],
    "conv2d_stem_nchwc": [(1, 3, 10, 9, 32, 7, 7, 2, 3, 2)],
    "conv2d_winograd_nchwc": [(1, 16, 7, 9, 32, 3, 3, 1, 1, 1)],  # tiles past the image's edge
    "depthwise_conv2d_nchwc": [(1, 32, 7, 7, 3, 3, 2, 1, 3), (1, 48, 6, 6, 3, 3, 1, 0, 0)],
    "max_pool2d_nchwc": [(1, 32, 7, 7, 3, 2, 1)],
    "avg_pool2d_nchwc": [(1, 32, 6, 6, 2, 2, 0)],
    "global_avg_pool2d_nchwc": [(1, 32, 5, 5)],
    "reduce_sum": [(9, 20, 0), (9, 20, 1)],
    "softmax": [(3, 40)],
    "layer_norm": [(3, 40)],
    "add": [(3, 40)],
    "multiply": [(3, 40)],
    "relu": [(3, 40)],
    "add_relu": [(3, 40)],
    # GPU templates: the agent checks a GPU candidate against this host reference
    "cuda_dense": [(9, 20, 13), (8, 16, 24, 2)],
    "cuda_batch_matmul": [(2, 9, 20, 13)],
    "cuda_dense_fp16_tc": [(32, 48, 64)],
    "cuda_conv2d": [(1, 5, 9, 8, 7, 3, 3, 1, 1, 2), (2, 3, 7, 7, 4, 3, 3, 2, 0, 0)],
    "cuda_conv2d_gemm": [(1, 5, 9, 8, 7, 3, 3, 1, 1, 1), (1, 8, 6, 6, 16, 1, 1, 2, 0, 0)],
    "cuda_depthwise_conv2d": [(1, 19, 9, 11, 3, 3, 2, 1, 3)],
    "cuda_max_pool2d": [(1, 5, 9, 11, 3, 2, 1)],
    "cuda_avg_pool2d": [(1, 5, 8, 8, 2, 2, 0)],
    "cuda_global_avg_pool2d": [(1, 5, 7, 9)],
    "cuda_softmax": [(3, 37)],
    "cuda_layer_norm": [(3, 37)],
    "cuda_elementwise_add": [(3, 37)],
    "cuda_elementwise_multiply": [(3, 37)],
    "cuda_elementwise_relu": [(3, 37)],
    "cuda_elementwise_add_relu": [(3, 37)],
}
ALTERNATIVES_PER_KNOB = 2


def layout_knobs(t: Any) -> tuple[str, ...]:
    knobs: tuple[str, ...] = t.layout_knobs
    return knobs


def neighbours(t: Any, shape: tuple[int, ...]) -> Iterator[tuple[str, Config]]:
    """(knob, config 0 with that knob changed), up to ALTERNATIVES_PER_KNOB per knob."""
    space = t.config_space(shape)
    base = space.get(0)
    for knob in space.knobs:
        for choice in [c for c in knob.choices if c != base[knob.name]][:ALTERNATIVES_PER_KNOB]:
            yield knob.name, space.get(space.index_of({**base, knob.name: choice}))


def layout_configs(t: Any, shape: tuple[int, ...]) -> list[Config]:
    """Config 0, each layout knob changed alone, and every layout knob at its last choice."""
    space = t.config_space(shape)
    base = space.get(0)
    configs = [base, *(c for knob, c in neighbours(t, shape) if knob in layout_knobs(t))]
    last = {k.name: k.choices[-1] for k in space.knobs if k.name in layout_knobs(t)}
    configs.append(space.get(space.index_of({**base, **last})))
    return configs


def arg_specs(args: Sequence[Tensor]) -> list[tuple[str, tuple[int, ...], str, bool]]:
    return [(a.name, tuple(a.shape), a.dtype, isinstance(a.op, PlaceholderOp)) for a in args]


def run(lib: ctypes.CDLL, symbol: str, arrays: list[np.ndarray]) -> None:
    fn = lib[symbol]
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int32
    assert fn((ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))) == 0


def numpy_case(
    t: Any, shape: tuple[int, ...], config: Config, rng: np.random.Generator
) -> tuple[list[np.ndarray], Any]:
    """(the kernel's inputs for `config`, a function from its output to (ours, numpy's))."""
    if isinstance(t, OpTemplate):
        logical = t.random_inputs(shape, rng)
        expected = t.reference_for(shape, *logical)
        return t.pack_inputs(shape, config, logical), lambda out: (
            t.unpack_output(shape, config, out),
            expected,
        )
    m, n, k = shape  # the skeleton's matmul: natural layout, no conversion
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((m, k), (k, n)))
    return [a, b], lambda out: (out, t.reference(a, b))


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_reference_kernels_match_numpy_in_every_layout(name: str) -> None:
    t = ops.get_template(name)
    cases = [(shape, c) for shape in SHAPES[name] for c in layout_configs(t, shape)]
    kernels = {k.symbol: k for k in (reference_kernel(t, s, c) for s, c in cases)}
    if layout_knobs(t):
        assert all(
            len({reference_symbol(t, s, c) for s_, c in cases if s_ == s}) >= 2
            for s in SHAPES[name]
        ), "every shape should have two layouts"
    lib = ctypes.CDLL(str(toolchain.compile_shared(build_source_many(list(kernels.values()))).path))
    rng = np.random.default_rng(0)
    for shape, config in cases:
        kernel = reference_kernel(t, shape, config)
        inputs, compare = numpy_case(t, shape, config, rng)
        arrays = [*inputs, *output_arrays(kernel.args)]
        for array, tensor in zip(arrays, kernel.args, strict=True):
            assert array.size == int(np.prod(tensor.shape)), f"{tensor.name} of {dict(config)}"
        run(lib, kernel.symbol, arrays)
        ours, expected = compare(arrays[-1].reshape(kernel.args[-1].shape))
        reduction = max(1, round(t.flop(shape) / max(expected.size, 1)))
        np.testing.assert_allclose(
            ours,
            expected,
            rtol=1e-4,
            atol=2e-5 * max(1.0, float(np.sqrt(reduction))),
            err_msg=f"{name} {shape} {dict(config)}",
        )


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_reference_source_depends_on_the_layout_knobs_alone(name: str) -> None:
    t = ops.get_template(name)
    shape = SHAPES[name][0]
    base = t.config_space(shape).get(0)
    ref = reference_kernel(t, shape, base)
    base_source = build_source(ref.sch, ref.args, ref.symbol)
    assert ref.symbol.startswith(REFERENCE_PREFIX)
    for knob, config in neighbours(t, shape):
        what = f"{name} {shape}: {knob} = {config[knob]}"
        kernel = reference_kernel(t, shape, config)
        source = build_source(kernel.sch, kernel.args, kernel.symbol)
        if knob in layout_knobs(t):
            assert kernel.symbol != ref.symbol and source != base_source, what
        else:
            assert kernel.symbol == ref.symbol and source == base_source, what
        # The candidate's arguments are the reference's, whatever the knob changed.
        _, candidate_args = t.instantiate(shape, config)
        assert arg_specs(candidate_args) == arg_specs(kernel.args), what


@pytest.mark.parametrize("name", ["dense", "conv2d_nchwc", "conv2d_winograd_nchwc", "softmax"])
def test_reference_schedules_are_naive(name: str) -> None:
    t = ops.get_template(name)
    shape = SHAPES[name][0]
    for config in layout_configs(t, shape):
        sch = reference_kernel(t, shape, config).sch
        for stage in sch.stages:
            assert stage.attach == "root" and stage.scope == "global", stage.name
            assert not stage.relations and not stage.kinds, stage.name  # no split, no annotation
            assert set(stage.leaf_iter_vars) == {*stage.axis, *stage.reduce_axis}, stage.name


def test_every_library_template_is_covered() -> None:
    assert set(ops.template_names()) == set(SHAPES)

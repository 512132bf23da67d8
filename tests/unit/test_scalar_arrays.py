"""A scalar (0-d) tensor stays 0-d on every path from a feed to the agent's buffers.

np.ascontiguousarray returns at least 1-d, so a scalar input went over the wire as shape [1] and
the agent refused it against its spec's [] (onnx's test_pow_bcast_scalar, Gemm's scalar bias).
"""

from __future__ import annotations

import numpy as np

from device_agent import arrays, serde
from device_agent.domain import ArgRole, TensorSpec
from tuner.measure.pool_runner import _ndarray_pb
from tuner.network.run import check_feeds


def test_scalars_stay_scalars() -> None:
    scalar = np.float32(2.5) * np.ones((), dtype=np.float32)
    assert list(_ndarray_pb(scalar).shape) == []
    back = serde.ndarray_from_pb(serde.ndarray_to_pb(scalar))
    assert back.shape == () and back == scalar
    spec = TensorSpec("y", (), "float32", ArgRole.INPUT)
    assert arrays.make_input(spec, np.random.default_rng(0)).shape == ()
    given = arrays.make_args([spec], seed=0, inputs=[scalar])
    assert given[0].shape == () and given[0].flags.c_contiguous


def test_feeds_keep_scalars_and_make_c_order() -> None:
    from compiler.graph.build_model import TensorSpec as ModelSpec

    specs = (ModelSpec("y", (), "float32"), ModelSpec("x", (2, 3), "float32"))
    fortran = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    y, x = check_feeds(specs, {"y": np.float32(1.0) * np.ones(()), "x": fortran})
    assert y.shape == () and y.dtype == np.float32
    assert x.flags.c_contiguous and np.array_equal(x, fortran)

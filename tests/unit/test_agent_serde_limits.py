"""Wire values the agent cannot use are the client's error (InvalidRequestError), not a crash."""

from __future__ import annotations

import pytest

from device_agent import serde
from device_agent.errors import InvalidRequestError
from protos import common_pb2


def test_an_array_of_more_dimensions_than_numpy_takes_is_refused() -> None:
    ok = serde.ndarray_from_pb(common_pb2.NDArray(shape=[1] * 32, dtype="float32", data=b"\0" * 4))
    assert ok.ndim == 32
    with pytest.raises(InvalidRequestError, match="300 dimensions"):
        serde.ndarray_from_pb(common_pb2.NDArray(shape=[1] * 300, dtype="float32", data=b"\0" * 4))


def test_unknown_enum_numbers_in_an_artifact_meta_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="unknown format 99"):
        serde.meta_from_pb(common_pb2.ArtifactMeta(format=99))  # type: ignore[arg-type]
    entry = common_pb2.EntryPoint(symbol="f", args=[common_pb2.TensorSpec(name="a", role=77)])  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="unknown role of arg 'a' 77"):
        serde.meta_from_pb(common_pb2.ArtifactMeta(entries=[entry]))

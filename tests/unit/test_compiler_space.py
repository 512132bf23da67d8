"""Config spaces and the op template registry."""

from __future__ import annotations

import pytest

from compiler import ops
from compiler.ops.matmul import tile_choices
from compiler.ops.space import ConfigSpace, Knob


def test_index_round_trip_over_a_whole_space() -> None:
    space = ConfigSpace([Knob("a", (1, 2, 3)), Knob("b", (False, True)), Knob("c", ("x", "y"))])
    assert len(space) == 12
    seen = set()
    for index in range(len(space)):
        config = space.get(index)
        assert config.index == index
        assert space.index_of(config) == index
        seen.add(tuple(config.values()))
    assert len(seen) == 12
    assert dict(space.get(0)) == {"a": 1, "b": False, "c": "x"}
    assert dict(space.get(1)) == {"a": 1, "b": False, "c": "y"}  # the last knob varies fastest


def test_bad_indices_and_values() -> None:
    space = ConfigSpace([Knob("a", (1, 2))])
    with pytest.raises(IndexError, match="outside"):
        space.get(2)
    with pytest.raises(IndexError):
        space.get(-1)
    with pytest.raises(ValueError, match="3 is not a choice of knob a"):
        space.index_of({"a": 3})
    with pytest.raises(ValueError, match="no value for knob a"):
        space.index_of({})
    with pytest.raises(ValueError, match="repeat"):
        ConfigSpace([Knob("a", (1,)), Knob("a", (2,))])


def test_config_is_read_only() -> None:
    config = ConfigSpace([Knob("a", (1, 2))]).get(1)
    with pytest.raises(TypeError):
        config["a"] = 3  # type: ignore[index]


def test_matmul_template() -> None:
    template = ops.get_template("matmul")
    assert template.flop((7, 13, 5)) == 2 * 7 * 13 * 5
    space = template.config_space((7, 13, 5))
    assert [k.name for k in space.knobs] == ["tile_m", "tile_n", "tile_k", "vectorize", "unroll"]
    assert space.knobs[0].choices == (1, 2, 4, 7)
    assert tile_choices(1024, 64) == (1, 2, 4, 8, 16, 32, 64)
    assert tile_choices(12, 128) == (1, 2, 3, 4, 6, 8, 12)
    with pytest.raises(KeyError, match=r"known: .*matmul"):
        ops.get_template("conv9d")
    with pytest.raises(ValueError, match="positive ints"):
        template.config_space((7, 13))

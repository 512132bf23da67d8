"""Config spaces: ordered knobs with candidate values, and a dense index over their product.

Index i names one config: the knobs are digits of a mixed-radix number whose last knob varies
fastest, so `space.get(space.index_of(c)) == c` for every config c.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Knob:
    """A tuning knob: `name` and its distinct candidate values, in a fixed order.

    `added_later` marks a knob added to a template after configs were written without it
    (kernels_best.json, a user's notes): `index_of` then takes its first choice, which must be
    the template's behaviour before the knob, for a config that does not name it.
    """

    name: str
    choices: tuple[Any, ...]
    added_later: bool = False

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"knob {self.name} has no choices")
        if len(set(self.choices)) != len(self.choices):
            raise ValueError(f"knob {self.name} repeats a choice: {self.choices}")


class Config(Mapping[str, Any]):
    """An immutable knob name -> value mapping that also carries its `index` in the space."""

    __slots__ = ("_values", "index")

    def __init__(self, values: Mapping[str, Any], index: int) -> None:
        self._values = dict(values)
        self.index = index

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash((self.index, tuple(self._values.items())))

    def __repr__(self) -> str:
        return f"Config(#{self.index}, {self._values})"


class ConfigSpace:
    """The product of its knobs' choices, indexed 0 .. len(space) - 1."""

    def __init__(self, knobs: Sequence[Knob]) -> None:
        names = [k.name for k in knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"knob names repeat: {names}")
        self._knobs = tuple(knobs)

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return self._knobs

    def __len__(self) -> int:
        return math.prod(len(k.choices) for k in self._knobs)

    def get(self, index: int) -> Config:
        """The config at `index`; raises IndexError outside [0, len(self))."""
        if not 0 <= index < len(self):
            raise IndexError(f"config index {index} is outside [0, {len(self)})")
        values: dict[str, Any] = {}
        rest = index
        for knob in reversed(self._knobs):
            rest, digit = divmod(rest, len(knob.choices))
            values[knob.name] = knob.choices[digit]
        return Config({k.name: values[k.name] for k in self._knobs}, index)

    def index_of(self, values: Mapping[str, Any]) -> int:
        """The index of the config with these knob values (a knob `added_later` may be left
        out: its first choice); raises ValueError if there is none."""
        index = 0
        for knob in self._knobs:
            if knob.name not in values and not knob.added_later:
                raise ValueError(f"no value for knob {knob.name}")
            value = values.get(knob.name, knob.choices[0])
            if value not in knob.choices:
                raise ValueError(f"{value!r} is not a choice of knob {knob.name}")
            index = index * len(knob.choices) + knob.choices.index(value)
        return index

    def __repr__(self) -> str:
        knobs = ", ".join(f"{k.name}[{len(k.choices)}]" for k in self._knobs)
        return f"ConfigSpace({len(self)} configs: {knobs})"

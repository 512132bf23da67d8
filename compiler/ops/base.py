"""The interface every op template provides to the tuner and to tests."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from compiler.ops.space import Config, ConfigSpace
from compiler.schedule.schedule import Schedule
from compiler.te.tensor import Tensor


class Template(Protocol):
    """A compute definition with a numpy reference and a tunable schedule.

    `shape` is the op's workload tuple (for matmul, (M, N, K)). `instantiate` must give a
    correct schedule for every config of `config_space(shape)`; configs change speed only.
    """

    name: str

    def compute(self, shape: tuple[int, ...]) -> tuple[Tensor, ...]:
        """The op's tensors, inputs first, output last."""
        ...

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """The output for `inputs`, by numpy."""
        ...

    def flop(self, shape: tuple[int, ...]) -> float: ...

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace: ...

    def instantiate(self, shape: tuple[int, ...], config: Config) -> tuple[Schedule, list[Any]]:
        """The scheduled computation and its argument tensors, in call order."""
        ...

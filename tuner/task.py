"""A tuning task: one workload of one op template on a thread count, its config space and its
FLOP count. `threads` > 1 adds the template's `parallel` knob to the space
(`compiler.ops.base.threaded_space`); one thread is the space records always had."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from compiler import ops
from compiler.ops.base import Template, threaded_space
from compiler.ops.space import ConfigSpace
from tuner.records import Workload


@dataclass(frozen=True)
class Task:
    workload: Workload
    threads: int = 1

    @cached_property
    def template(self) -> Template:
        return ops.get_template(self.workload.op)

    @cached_property
    def space(self) -> ConfigSpace:
        return threaded_space(self.template, self.workload.shape, self.threads)

    @property
    def flop(self) -> float:
        return float(self.template.flop(self.workload.shape))

    def worth_measuring(self, index: int, target: str = "host") -> bool:
        """Whether config `index` is plausible on `target` (the template's register-tile check;
        True for templates without one)."""
        check = getattr(self.template, "worth_measuring", None)
        return (
            True
            if check is None
            else bool(check(self.workload.shape, self.space.get(index), target))
        )

    def knobs(self, index: int) -> dict[str, Any]:
        """The knob values of config `index`, as plain JSON-able values."""
        return dict(self.space.get(index).items())

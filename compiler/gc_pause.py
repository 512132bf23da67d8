"""Pausing Python's cyclic garbage collector while the compiler builds IR.

Lowering allocates millions of small immutable IR nodes that form no reference cycles, so
reference counting frees them all; but each allocation counts toward the collector's thresholds,
and every collection walks every live node. Measured on the untuned build of a DenseNet-style
model (185 kernels): 16.3 s of lowering with the collector on, 10.4 s with it paused.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collector off inside; back on after if it was on before (nesting is harmless)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` run with the cyclic collector paused."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return fn(*args, **kwargs)

    return wrapper

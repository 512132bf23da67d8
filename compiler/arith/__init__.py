"""Arithmetic analysis of index expressions: linear forms, canonical sums, intervals, simplifier."""

from compiler.arith.interval import const_bounds, symbolic_interval
from compiler.arith.linear import linear_form
from compiler.arith.simplify import FALSE, TRUE, difference, is_const, simplify

__all__ = [
    "FALSE",
    "TRUE",
    "const_bounds",
    "difference",
    "is_const",
    "linear_form",
    "simplify",
    "symbolic_interval",
]

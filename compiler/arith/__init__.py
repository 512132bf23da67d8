"""Arithmetic analysis of index expressions (linear forms now; simplifier and intervals later)."""

from compiler.arith.linear import linear_form

__all__ = ["linear_form"]

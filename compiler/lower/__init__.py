"""Lowering: from a schedule to a loop-IR PrimFunc (loop nests now; TVM's pass list later)."""

from compiler.lower.loop_nest import lower

__all__ = ["lower"]

"""PrimFunc: a loop-nest function over buffers, the unit lowering produces and codegen renders."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import expr as _expr
from compiler.ir.buffer import Buffer
from compiler.ir.stmt import Stmt


@dataclass(frozen=True, eq=False)
class PrimFunc:
    """A function whose parameters are buffers, in the order callers pass them."""

    name: str
    params: tuple[Buffer, ...]
    body: Stmt

    def __post_init__(self) -> None:
        names = [b.name for b in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"PrimFunc {self.name}: parameter names repeat: {names}")

    def __str__(self) -> str:
        return _expr.node_text(self)

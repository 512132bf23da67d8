"""Statements of the loop IR."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from compiler.ir.buffer import Buffer
from compiler.ir.expr import Expr, Var


class ForKind(enum.Enum):
    """How a loop's iterations may run; all kinds mean the same thing to the interpreter."""

    SERIAL = "serial"
    VECTORIZED = "vectorized"  # iterations are independent and become SIMD lanes
    UNROLLED = "unrolled"
    PARALLEL = "parallel"  # iterations are independent and may run on different threads


class Stmt:
    """Base of every statement."""

    __slots__ = ()

    def __str__(self) -> str:
        from compiler.ir.printer import to_str  # the printer imports this module

        return to_str(self)


@dataclass(frozen=True, eq=False)
class For(Stmt):
    """`for var in [0, extent)`; `extent` may depend on enclosing loop variables."""

    var: Var
    extent: Expr
    kind: ForKind
    body: Stmt


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    """buffer[index] = value, with `index` into the flat buffer."""

    buffer: Buffer
    index: Expr
    value: Expr

    def __post_init__(self) -> None:
        if self.value.dtype != self.buffer.dtype:
            raise TypeError(
                f"store of {self.value.dtype} into {self.buffer.dtype} buffer {self.buffer.name}"
            )


@dataclass(frozen=True, eq=False)
class Seq(Stmt):
    """Statements run in order."""

    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False)
class IfThenElse(Stmt):
    condition: Expr
    then_case: Stmt
    else_case: Stmt | None = None


def seq(*stmts: Stmt) -> Stmt:
    """A Seq of `stmts`, flattening nested Seqs; a single statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.stmts if isinstance(s, Seq) else (s,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))

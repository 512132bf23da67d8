"""The unroll pass: replicate the body of small constant unrolled loops in the IR.

An UNROLLED loop whose extent is a constant of at most MAX_EXPLICIT_UNROLL (or any loop with the
pragma "unroll_explicit") becomes its body once per iteration with the variable replaced by the
constant, so the following passes and the C compiler see constant indices (register tiles need
that). Larger unrolled loops stay loops; the C renderer asks gcc to unroll them.
"""

from __future__ import annotations

from compiler.ir import expr as E
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import For, ForKind, Stmt, seq
from compiler.ir.transform import StmtMutator, substitute_stmt
from compiler.lower.simplify import StmtSimplifier

MAX_EXPLICIT_UNROLL = 16


class _Unroll(StmtMutator):
    """Replicates unrolled loops; the copies of a nest of them are simplified once, at its top.

    Simplifying the copies at every level of a nest re-simplified the innermost body once per
    enclosing unrolled loop (and the next level's substitution had to walk the result again).
    """

    def __init__(self) -> None:
        self.depth = 0  # unrolled loops enclosing the node being visited

    def visit_for(self, s: For) -> Stmt:
        explicit = any(k == "unroll_explicit" and v for k, v in s.pragmas)
        unrolled = (
            isinstance(s.extent, E.IntImm)
            and (s.kind is ForKind.UNROLLED or explicit)
            and (s.extent.value <= MAX_EXPLICIT_UNROLL or explicit)
        )
        self.depth += unrolled
        body = self.visit(s.body)
        self.depth -= unrolled
        if unrolled:
            assert isinstance(s.extent, E.IntImm)
            copies = seq(
                *(substitute_stmt(body, {s.var: E.IntImm(i)}) for i in range(s.extent.value))
            )
            return copies if self.depth else StmtSimplifier().visit(copies)
        return s if body is s.body else For(s.var, s.extent, s.kind, body, s.thread_tag, s.pragmas)


def unroll(func: PrimFunc) -> PrimFunc:
    """`func` with small unrolled loops replicated."""
    return PrimFunc(func.name, func.params, _Unroll().visit(func.body))

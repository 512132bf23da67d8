"""The vectorize pass: shape vectorized loops into what the vector renderer takes.

A vectorized loop with a constant extent that is not a power of two is cut into power-of-two
pieces, largest first (12 lanes: 8 + 4; 7: 4 + 2 + 1), each vectorized, so every piece becomes
whole vector statements instead of a scalar fallback. Loops that stay unsuitable (a body that
is not one store, non-linear indices) are left for the renderer's `ivdep` scalar loop.
"""

from __future__ import annotations

import dataclasses

from compiler.ir import expr as E
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import For, ForKind, Stmt, Store, seq
from compiler.ir.transform import StmtMutator, substitute_stmt
from compiler.lower.simplify import StmtSimplifier


class _Vectorize(StmtMutator):
    def visit_for(self, s: For) -> Stmt:
        body = self.visit(s.body)
        if body is not s.body:
            s = dataclasses.replace(s, body=body)
        if s.kind is not ForKind.VECTORIZED or not isinstance(s.extent, E.IntImm):
            return s
        n = s.extent.value
        if n & (n - 1) == 0 or not isinstance(s.body, Store):
            return s
        pieces: list[Stmt] = []
        start = 0
        while start < n:
            width = 1 << ((n - start).bit_length() - 1)
            shifted = substitute_stmt(s.body, {s.var: s.var + start}) if start else s.body
            pieces.append(dataclasses.replace(s, extent=E.IntImm(width), body=shifted))
            start += width
        return StmtSimplifier().visit(seq(*pieces))


def vectorize(func: PrimFunc) -> PrimFunc:
    """`func` with vectorized loops cut into power-of-two pieces."""
    return PrimFunc(func.name, func.params, _Vectorize().visit(func.body))

"""Storage flatten: multi-dimensional buffer reads and writes become flat row-major ones."""

from __future__ import annotations

from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import BufferStore, Stmt, Store
from compiler.ir.transform import StmtMutator


def flat_index(buf: Buffer, indices: tuple[E.Expr, ...]) -> E.Expr:
    """The row-major offset of `indices` into `buf`."""
    flat: E.Expr | None = None
    for index, stride in zip(indices, buf.strides, strict=True):
        term = index if stride == 1 else index * stride
        flat = term if flat is None else flat + term
    return flat if flat is not None else E.IntImm(0)


class _Flatten(StmtMutator):
    def expr(self, e: E.Expr) -> E.Expr:
        if isinstance(e, E.BufferLoad):
            return E.Load(e.buffer, flat_index(e.buffer, tuple(self.expr(i) for i in e.indices)))
        kids = E.children(e)
        if not kids:
            return e
        new = [self.expr(k) for k in kids]
        if all(a is b for a, b in zip(new, kids, strict=True)):
            return e
        return E.rebuild(e, new)

    def visit_buffer_store(self, s: BufferStore) -> Stmt:
        index = flat_index(s.buffer, tuple(self.expr(i) for i in s.indices))
        return Store(s.buffer, index, self.expr(s.value))


def flatten(func: PrimFunc) -> PrimFunc:
    """`func` with every BufferLoad / BufferStore turned into a flat Load / Store."""
    return PrimFunc(func.name, func.params, _Flatten().visit(func.body))

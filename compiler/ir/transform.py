"""A statement mutator that passes subclass: rebuild only what changed."""

from __future__ import annotations

import dataclasses

from compiler.ir import expr as E
from compiler.ir.stmt import (
    Allocate,
    Barrier,
    BufferStore,
    For,
    IfThenElse,
    IntrinCall,
    Seq,
    Stmt,
    Store,
    seq,
)


class StmtMutator:
    """Walks statements; `expr` is applied to every expression, `visit_*` to every statement."""

    def expr(self, e: E.Expr) -> E.Expr:
        return e

    def visit(self, s: Stmt) -> Stmt:
        if isinstance(s, For):
            return self.visit_for(s)
        if isinstance(s, Seq):
            return self.visit_seq(s)
        if isinstance(s, Store):
            return self.visit_store(s)
        if isinstance(s, BufferStore):
            return self.visit_buffer_store(s)
        if isinstance(s, IfThenElse):
            return self.visit_if(s)
        if isinstance(s, Allocate):
            return self.visit_allocate(s)
        if isinstance(s, IntrinCall):
            return self.visit_intrin(s)
        if isinstance(s, Barrier):
            return s
        raise TypeError(f"{type(self).__name__} cannot visit {type(s).__name__}")

    def visit_for(self, s: For) -> Stmt:
        extent, body = self.expr(s.extent), self.visit(s.body)
        if extent is s.extent and body is s.body:
            return s
        return dataclasses.replace(s, extent=extent, body=body)

    def visit_seq(self, s: Seq) -> Stmt:
        stmts = [self.visit(c) for c in s.stmts]
        if all(a is b for a, b in zip(stmts, s.stmts, strict=True)):
            return s
        return seq(*stmts) if stmts else s

    def visit_store(self, s: Store) -> Stmt:
        index, value = self.expr(s.index), self.expr(s.value)
        if index is s.index and value is s.value:
            return s
        return Store(s.buffer, index, value)

    def visit_buffer_store(self, s: BufferStore) -> Stmt:
        indices = tuple(self.expr(i) for i in s.indices)
        value = self.expr(s.value)
        return BufferStore(s.buffer, indices, value)

    def visit_if(self, s: IfThenElse) -> Stmt:
        cond = self.expr(s.condition)
        then = self.visit(s.then_case)
        other = self.visit(s.else_case) if s.else_case is not None else None
        if cond is s.condition and then is s.then_case and other is s.else_case:
            return s
        return IfThenElse(cond, then, other)

    def visit_allocate(self, s: Allocate) -> Stmt:
        body = self.visit(s.body)
        return s if body is s.body else dataclasses.replace(s, body=body)

    def visit_intrin(self, s: IntrinCall) -> Stmt:
        ops = tuple((b, self.expr(off), st) for b, off, st in s.operands)
        return dataclasses.replace(s, operands=ops)


class Substituter(StmtMutator):
    """Replace variables by expressions everywhere in a statement."""

    def __init__(self, mapping: dict[E.Var, E.Expr]) -> None:
        self.mapping = mapping

    def expr(self, e: E.Expr) -> E.Expr:
        return E.substitute(e, self.mapping)


def substitute_stmt(s: Stmt, mapping: dict[E.Var, E.Expr]) -> Stmt:
    """`s` with every Var of `mapping` replaced."""
    return Substituter(mapping).visit(s) if mapping else s


def walk_stmts(s: Stmt) -> list[Stmt]:
    """Every statement of `s`, parents before children."""
    out: list[Stmt] = []
    stack = [s]
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, For | Allocate):
            stack.append(node.body)
        elif isinstance(node, Seq):
            stack.extend(reversed(node.stmts))
        elif isinstance(node, IfThenElse):
            if node.else_case is not None:
                stack.append(node.else_case)
            stack.append(node.then_case)
    return out

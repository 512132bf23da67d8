"""Make-API: the final PrimFunc, checked: every variable read is bound by a loop around it, and
every buffer used is a parameter or allocated around its uses."""

from __future__ import annotations

from compiler.errors import LowerError
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import (
    Allocate,
    For,
    IfThenElse,
    IntrinCall,
    Seq,
    Stmt,
    Store,
)


def make_api(name: str, params: tuple[Buffer, ...], body: Stmt) -> PrimFunc:
    """The PrimFunc `name(params)` running `body`.

    Raises:
        LowerError: a variable or buffer is used outside the loop or allocation that defines it.
    """
    func = PrimFunc(name, params, body)
    _check(body, set(), set(params), name)
    return func


def _check(s: Stmt, bound: set[E.Var], buffers: set[Buffer], name: str) -> None:
    def expr(e: E.Expr) -> None:
        stack = [e]
        while stack:
            node = stack.pop()
            if isinstance(node, E.Var) and node not in bound:
                raise LowerError(f"{name}: variable {node.name} is read outside its loop")
            if isinstance(node, E.Load | E.BufferLoad) and node.buffer not in buffers:
                raise LowerError(f"{name}: buffer {node.buffer.name} is read outside its scope")
            stack.extend(E.children(node))

    if isinstance(s, For):
        expr(s.extent)
        _check(s.body, bound | {s.var}, buffers, name)
    elif isinstance(s, Seq):
        for c in s.stmts:
            _check(c, bound, buffers, name)
    elif isinstance(s, Store):
        if s.buffer not in buffers:
            raise LowerError(f"{name}: buffer {s.buffer.name} is written outside its scope")
        expr(s.index)
        expr(s.value)
    elif isinstance(s, IfThenElse):
        expr(s.condition)
        _check(s.then_case, bound, buffers, name)
        if s.else_case is not None:
            _check(s.else_case, bound, buffers, name)
    elif isinstance(s, Allocate):
        _check(s.body, bound, buffers | {s.buffer}, name)
    elif isinstance(s, IntrinCall):
        for buf, offset, _ in s.operands:
            if buf not in buffers:
                raise LowerError(f"{name}: intrinsic {s.name} uses {buf.name} outside its scope")
            expr(offset)

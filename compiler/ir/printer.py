"""Readable text for IR nodes, for debugging and error messages (not parsed back)."""

from __future__ import annotations

from compiler.ir import expr as E
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import (
    Allocate,
    Barrier,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    IntrinCall,
    Seq,
    Stmt,
    Store,
)

_INFIX: dict[type, str] = {
    E.Add: "+",
    E.Sub: "-",
    E.Mul: "*",
    E.Div: "/",
    E.Mod: "%t",
    E.FloorDiv: "//",
    E.FloorMod: "%",
    E.LT: "<",
    E.LE: "<=",
    E.EQ: "==",
    E.NE: "!=",
    E.And: "and",
    E.Or: "or",
}
_INDENT = "  "


def to_str(node: E.Expr | Stmt | PrimFunc) -> str:
    """Text for an expression, a statement or a function."""
    if isinstance(node, E.Expr):
        return _expr(node)
    if isinstance(node, PrimFunc):
        params = ", ".join(f"{b.name}: {b.dtype}{list(b.shape)}" for b in node.params)
        return "\n".join([f"def {node.name}({params}):", *_stmt(node.body, 1)])
    return "\n".join(_stmt(node, 0))


def _expr(e: E.Expr) -> str:
    if isinstance(e, E.Var):
        return e.name
    if isinstance(e, E.IntImm):
        return str(e.value)
    if isinstance(e, E.FloatImm):
        return repr(e.value) if e.dtype == "float32" else f"{e.dtype}({e.value!r})"
    if isinstance(e, E.Load):
        return f"{e.buffer.name}[{_expr(e.index)}]"
    if isinstance(e, E.BufferLoad):
        return f"{e.buffer.name}[{', '.join(_expr(i) for i in e.indices)}]"
    if isinstance(e, E.Min | E.Max):
        return f"{type(e).__name__.lower()}({_expr(e.a)}, {_expr(e.b)})"
    if isinstance(e, E.BinaryOp):
        return f"{_operand(e.a)} {_INFIX[type(e)]} {_operand(e.b)}"
    if isinstance(e, E.Not):
        return f"not {_operand(e.a)}"
    if isinstance(e, E.Cast):
        return f"{e.dtype}({_expr(e.value)})"
    if isinstance(e, E.Select):
        return f"select({_expr(e.condition)}, {_expr(e.true_value)}, {_expr(e.false_value)})"
    if isinstance(e, E.Call):
        return f"{e.name}({', '.join(_expr(a) for a in e.args)})"
    return repr(e)  # nodes of other layers (te) print themselves


def _operand(e: E.Expr) -> str:
    text = _expr(e)
    return f"({text})" if type(e) in _INFIX else text


def _stmt(s: Stmt, depth: int) -> list[str]:
    pad = _INDENT * depth
    if isinstance(s, For):
        loop = "range" if s.kind is ForKind.SERIAL else s.kind.value
        if s.thread_tag:
            loop = f"bind[{s.thread_tag}]"
        notes = "".join(f"  # pragma {k}={v!r}" for k, v in s.pragmas)
        head = f"{pad}for {s.var.name} in {loop}({_expr(s.extent)}):{notes}"
        return [head, *_stmt(s.body, depth + 1)]
    if isinstance(s, Store):
        return [f"{pad}{s.buffer.name}[{_expr(s.index)}] = {_expr(s.value)}"]
    if isinstance(s, BufferStore):
        return [
            f"{pad}{s.buffer.name}[{', '.join(_expr(i) for i in s.indices)}] = {_expr(s.value)}"
        ]
    if isinstance(s, Seq):
        return [line for child in s.stmts for line in _stmt(child, depth)]
    if isinstance(s, IfThenElse):
        lines = [f"{pad}if {_expr(s.condition)}:", *_stmt(s.then_case, depth + 1)]
        if s.else_case is not None:
            lines += [f"{pad}else:", *_stmt(s.else_case, depth + 1)]
        return lines
    if isinstance(s, Allocate):
        b = s.buffer
        head = f"{pad}{b.name} = allocate({b.dtype}{list(b.shape)}, {b.scope})"
        if b.registers:  # register promotion: one variable per slot
            slots = " ".join(
                f"[{start}]" if lanes == 1 else f"[{start}:{start + lanes}]"
                for start, lanes in b.registers
            )
            head += f"  # registers {slots}"
        return [head, *_stmt(s.body, depth)]
    if isinstance(s, Barrier):
        return [f"{pad}barrier()"]
    if isinstance(s, IntrinCall):
        ops = ", ".join(f"{b.name}+{_expr(off)}" for b, off, _ in s.operands)
        return [f"{pad}{s.name}({ops})"]
    raise TypeError(f"no printer for {type(s).__name__}")


E.node_text = to_str  # type: ignore[assignment]  # the nodes' __str__ (see compiler.ir.expr.node_text)

"""A numpy interpreter of the loop IR: the oracle every lowering pass and code generator is tested against.

It runs loops in order whatever their kind, so a vectorized or parallel loop that is wrong only
when its iterations run together is wrong here too only if it reads what another iteration wrote.
Every load and store is bounds-checked, because numpy would silently wrap a negative index.
Integer arithmetic is unbounded (Python ints); float arithmetic rounds to the expression's dtype.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import For, IfThenElse, Seq, Stmt, Store

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    E.Add: operator.add,
    E.Sub: operator.sub,
    E.Mul: operator.mul,
    E.FloorDiv: operator.floordiv,
    E.FloorMod: operator.mod,
    E.Min: min,
    E.Max: max,
    E.LT: operator.lt,
    E.And: lambda a, b: bool(a) and bool(b),
}


def run(func: PrimFunc, *arrays: np.ndarray) -> None:
    """Run `func` on `arrays` (one per parameter, in order), writing its outputs in place.

    Raises:
        ValueError: an array's count, shape, dtype or layout does not match the parameters.
        IndexError: the function reads or writes outside a buffer.
    """
    if len(arrays) != len(func.params):
        raise ValueError(f"{func.name} takes {len(func.params)} arrays, got {len(arrays)}")
    flat: dict[Buffer, np.ndarray] = {}
    for buf, arr in zip(func.params, arrays, strict=True):
        if arr.shape != buf.shape or arr.dtype != np.dtype(buf.dtype):
            raise ValueError(
                f"{func.name}: {buf.name} wants {buf.dtype}{list(buf.shape)}, "
                f"got {arr.dtype}{list(arr.shape)}"
            )
        if not arr.flags.c_contiguous:
            raise ValueError(f"{func.name}: {buf.name} must be C-contiguous")
        flat[buf] = arr.reshape(-1)  # a view: stores land in the caller's array
    _Interpreter(flat).exec(func.body)


class _Interpreter:
    def __init__(self, flat: dict[Buffer, np.ndarray]) -> None:
        self.flat = flat
        self.env: dict[E.Var, Any] = {}

    def eval(self, e: E.Expr) -> Any:
        op = _BINARY.get(type(e))
        if op is not None:
            assert isinstance(e, E.BinaryOp)
            value = op(self.eval(e.a), self.eval(e.b))
            return _round(value, e.dtype)
        if isinstance(e, E.Var):
            if e not in self.env:
                raise NameError(f"variable {e.name} is read outside the loop that binds it")
            return self.env[e]
        if isinstance(e, E.IntImm):
            return e.value
        if isinstance(e, E.FloatImm):
            return np.dtype(e.dtype).type(e.value)
        if isinstance(e, E.Load):
            value = self.flat[e.buffer][self._index(e.buffer, e.index, "load")]
            return int(value) if e.dtype in E.INT_DTYPES else value
        raise TypeError(f"the interpreter cannot evaluate {type(e).__name__}")

    def exec(self, s: Stmt) -> None:
        if isinstance(s, For):
            if s.var in self.env:
                raise ValueError(f"loop variable {s.var.name} is bound twice")
            for i in range(int(self.eval(s.extent))):
                self.env[s.var] = i
                self.exec(s.body)
            self.env.pop(s.var, None)
        elif isinstance(s, Store):
            self.flat[s.buffer][self._index(s.buffer, s.index, "store")] = self.eval(s.value)
        elif isinstance(s, Seq):
            for child in s.stmts:
                self.exec(child)
        elif isinstance(s, IfThenElse):
            if self.eval(s.condition):
                self.exec(s.then_case)
            elif s.else_case is not None:
                self.exec(s.else_case)
        else:
            raise TypeError(f"the interpreter cannot run {type(s).__name__}")

    def _index(self, buf: Buffer, index: E.Expr, what: str) -> int:
        i = int(self.eval(index))
        if not 0 <= i < buf.size:
            raise IndexError(f"{what} {buf.name}[{i}] is outside [0, {buf.size})")
        return i


def _round(value: Any, dtype: str) -> Any:
    if dtype in E.FLOAT_DTYPES:
        return np.dtype(dtype).type(value)
    return value

"""A numpy interpreter of the loop IR: the oracle every lowering pass and code generator is tested against.

It runs loops in order whatever their kind, so a vectorized or parallel loop that is wrong only
when its iterations run together is wrong here too only if it reads what another iteration wrote.
Every load and store is bounds-checked, because numpy would silently wrap a negative index, and
a register-promoted buffer (`Buffer.registers`) runs as an array whose accesses must hit a slot.
Allocated buffers start as NaN (floats) or a poison value (ints), so a read before a write shows.
Integer arithmetic is unbounded (Python ints); float arithmetic rounds to the expression's dtype.

GPU threads run one after another: a loop bound to `threadIdx.*` runs its iterations in turn,
and one nested in another of the same tag (a shared tile's copy inside a thread's loop nest)
runs every thread's share again, so one outer thread fills the whole tile and every barrier
already holds. A "local" buffer is a thread's own: each combination of the innermost running
`threadIdx.*` loops' values has its copy of it, so a copy staged through registers (the double
buffering pass) keeps each thread's values apart as the GPU does.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
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
)

# Python's meaning of each binary op (C's truncating Div and Mod on integers); also what the VTA
# code generator evaluates host-side index expressions with.
BINARY_OPS: dict[type, Callable[[Any, Any], Any]] = {
    E.Add: operator.add,
    E.Sub: operator.sub,
    E.Mul: operator.mul,
    E.Div: lambda a, b: operator.truediv(a, b) if not isinstance(a, int) else _trunc_div(a, b),
    E.Mod: lambda a, b: a - _trunc_div(a, b) * b,
    E.FloorDiv: operator.floordiv,
    E.FloorMod: operator.mod,
    E.Min: min,
    E.Max: max,
    E.LT: operator.lt,
    E.LE: operator.le,
    E.EQ: operator.eq,
    E.NE: operator.ne,
    E.And: lambda a, b: bool(a) and bool(b),
    E.Or: lambda a, b: bool(a) or bool(b),
}
_MATH: dict[str, Callable[..., Any]] = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "fabs": np.abs,
    "pow": np.power,
    "erf": lambda x: type(x)(math.erf(float(x))),
    "floor": np.floor,
    "ceil": np.ceil,
    "rint": np.rint,  # halves to even, as C's rint in the default rounding mode
    "fmod": np.fmod,
    "copysign": np.copysign,
    "isnan": np.isnan,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
}
_POISON_INT = -(2**31) + 7


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
        self.threads: dict[str, int] = {}  # threadIdx tag -> the running thread's index
        self.thread_key: tuple[tuple[str, int], ...] = ()
        self.local: dict[Buffer, dict[tuple[tuple[str, int], ...], np.ndarray]] = {}

    def array(self, buf: Buffer) -> np.ndarray:
        """`buf`'s elements: a local buffer's for the running thread (made on first use)."""
        copies = self.local.get(buf)
        if copies is None:
            return self.flat[buf]
        arr = copies.get(self.thread_key)
        if arr is None:
            arr = copies[self.thread_key] = self.flat[buf].copy()
        return arr

    def eval(self, e: E.Expr) -> Any:
        op = BINARY_OPS.get(type(e))
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
            value = self.array(e.buffer)[self._index(e.buffer, e.index, "load")]
            return int(value) if e.dtype in E.INT_DTYPES else value
        if isinstance(e, E.BufferLoad):
            value = self.array(e.buffer)[self._nd_index(e.buffer, e.indices, "load")]
            return int(value) if e.dtype in E.INT_DTYPES else value
        if isinstance(e, E.Not):
            return not self.eval(e.a)
        if isinstance(e, E.Select):
            cond = self.eval(e.condition)
            a, b = self.eval(e.true_value), self.eval(e.false_value)
            return a if cond else b
        if isinstance(e, E.Cast):
            value = self.eval(e.value)
            if e.dtype in E.FLOAT_DTYPES:
                return np.dtype(e.dtype).type(value)
            if e.dtype == "bool":
                return bool(value)
            return int(
                np.array(np.trunc(value) if isinstance(value, float) else value).astype(e.dtype)
            )
        if isinstance(e, E.Call):
            args = [self.eval(a) for a in e.args]
            if e.name in E.BIT_FUNCTIONS:
                return _bit_call(e.name, [int(a) for a in args], e.dtype)
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                value = _MATH[e.name](*args)
            return np.dtype(e.dtype).type(value)
        raise TypeError(f"the interpreter cannot evaluate {type(e).__name__}")

    def exec(self, s: Stmt) -> None:
        if isinstance(s, For):
            if s.var in self.env:
                raise ValueError(f"loop variable {s.var.name} is bound twice")
            tag = s.thread_tag if s.thread_tag.startswith("threadIdx.") else ""
            outer = self.threads.get(tag)
            for i in range(int(self.eval(s.extent))):
                self.env[s.var] = i
                if tag:
                    self.threads[tag] = i
                    self.thread_key = tuple(sorted(self.threads.items()))
                self.exec(s.body)
            self.env.pop(s.var, None)
            if tag:
                if outer is None:
                    self.threads.pop(tag, None)
                else:
                    self.threads[tag] = outer
                self.thread_key = tuple(sorted(self.threads.items()))
        elif isinstance(s, Store):
            self.array(s.buffer)[self._index(s.buffer, s.index, "store")] = self.eval(s.value)
        elif isinstance(s, BufferStore):
            where = self._nd_index(s.buffer, s.indices, "store")
            self.array(s.buffer)[where] = self.eval(s.value)
        elif isinstance(s, Seq):
            for child in s.stmts:
                self.exec(child)
        elif isinstance(s, IfThenElse):
            if self.eval(s.condition):
                self.exec(s.then_case)
            elif s.else_case is not None:
                self.exec(s.else_case)
        elif isinstance(s, Allocate):
            if s.buffer in self.flat:
                raise ValueError(f"buffer {s.buffer.name} is allocated twice")
            dtype = np.dtype(s.buffer.dtype)
            fill = np.nan if dtype.kind == "f" else _POISON_INT
            # astype wraps the poison into narrow integer types (int8 buffers exist too).
            self.flat[s.buffer] = np.full(s.buffer.size, fill).astype(dtype)
            if s.buffer.scope == "local":
                self.local[s.buffer] = {}
            try:
                self.exec(s.body)
            finally:
                del self.flat[s.buffer]
                self.local.pop(s.buffer, None)
        elif isinstance(s, IntrinCall):
            views = []
            for (buf, offset, strides), shape in zip(s.operands, s.shapes, strict=True):
                start = int(self.eval(offset))
                last = start + sum((n - 1) * st for n, st in zip(shape, strides, strict=True))
                if start < 0 or last >= buf.size:
                    raise IndexError(f"{s.name}: region of {buf.name} leaves [0, {buf.size})")
                base = self.array(buf)
                item = base.itemsize
                views.append(
                    np.lib.stride_tricks.as_strided(
                        base[start:], shape=shape, strides=tuple(st * item for st in strides)
                    )
                )
            s.emulate(*views)
        elif isinstance(s, Barrier):
            pass  # threads run one after another here, so every barrier already holds
        else:
            raise TypeError(f"the interpreter cannot run {type(s).__name__}")

    def _index(self, buf: Buffer, index: E.Expr, what: str) -> int:
        i = int(self.eval(index))
        if not 0 <= i < buf.size:
            raise IndexError(f"{what} {buf.name}[{i}] is outside [0, {buf.size})")
        if buf.registers and buf.register_slot(i) is None:
            # register promotion gives only the elements of its slots a variable
            raise IndexError(f"{what} {buf.name}[{i}] is in none of its register slots")
        return i

    def _nd_index(self, buf: Buffer, indices: tuple[E.Expr, ...], what: str) -> int:
        flat = 0
        values = [int(self.eval(i)) for i in indices]
        for v, n, stride in zip(values, buf.shape, buf.strides, strict=True):
            if not 0 <= v < n:
                raise IndexError(f"{what} {buf.name}{values} is outside {list(buf.shape)}")
            flat += v * stride
        return flat


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _wrap(value: int, dtype: str) -> int:
    """`value` wrapped into integer `dtype` (two's complement)."""
    info = np.iinfo(dtype)
    value &= (1 << info.bits) - 1
    return value - (1 << info.bits) if value > info.max else value


def _bit_call(name: str, args: list[int], dtype: str) -> int:
    """A BIT_FUNCTIONS call on Python ints (their bits those of `dtype`), wrapped to `dtype`."""
    a = args[0]
    if name == "bitwise_not":
        return _wrap(~a, dtype)
    b = args[1]
    if name in ("shift_left", "shift_right"):
        if not 0 <= b < np.iinfo(dtype).bits:
            return -1 if name == "shift_right" and a < 0 else 0
        return _wrap(a << b, dtype) if name == "shift_left" else a >> b
    ops = {"bitwise_and": operator.and_, "bitwise_or": operator.or_, "bitwise_xor": operator.xor}
    return _wrap(ops[name](a, b), dtype)


def _round(value: Any, dtype: str) -> Any:
    if dtype in E.FLOAT_DTYPES:
        return np.dtype(dtype).type(value)
    return value

"""Statements of the loop IR."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from compiler.ir import expr as _expr
from compiler.ir.buffer import Buffer
from compiler.ir.expr import Expr, Var


class ForKind(enum.Enum):
    """How a loop's iterations may run; all kinds mean the same thing to the interpreter."""

    SERIAL = "serial"
    VECTORIZED = "vectorized"  # iterations are independent and become SIMD lanes
    UNROLLED = "unrolled"
    PARALLEL = "parallel"  # iterations are independent and may run on different threads
    THREAD_BINDING = "thread_binding"  # a GPU grid axis named by the loop's thread_tag


class Stmt:
    """Base of every statement."""

    __slots__ = ()

    def __str__(self) -> str:
        return _expr.node_text(self)


@dataclass(frozen=True, eq=False)
class For(Stmt):
    """`for var in [0, extent)`; `extent` may depend on enclosing loop variables.

    `thread_tag` names the GPU axis ("blockIdx.x", "threadIdx.y", ...) of a THREAD_BINDING loop;
    `pragmas` are (key, value) hints a backend may honour (e.g. ("unroll_explicit", 1)).
    """

    var: Var
    extent: Expr
    kind: ForKind
    body: Stmt
    thread_tag: str = ""
    pragmas: tuple[tuple[str, object], ...] = ()


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
class BufferStore(Stmt):
    """buffer[indices] = value, multi-dimensional (storage flatten turns it into a Store)."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr

    def __post_init__(self) -> None:
        if self.value.dtype != self.buffer.dtype:
            raise TypeError(
                f"store of {self.value.dtype} into {self.buffer.dtype} buffer {self.buffer.name}"
            )
        if len(self.indices) != len(self.buffer.shape):
            raise TypeError(f"store into {self.buffer.name} with {len(self.indices)} indices")


@dataclass(frozen=True, eq=False)
class Seq(Stmt):
    """Statements run in order."""

    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False)
class IfThenElse(Stmt):
    condition: Expr
    then_case: Stmt
    else_case: Stmt | None = None


@dataclass(frozen=True, eq=False)
class Allocate(Stmt):
    """`buffer` exists (uninitialised) while `body` runs; its scope says where it lives.

    `double_buffer` asks the double-buffering pass to give it two halves (stage.double_buffer()),
    `stage_registers` to carry the next fill through registers across the use (the pass's doc).
    """

    buffer: Buffer
    body: Stmt
    double_buffer: bool = False
    stage_registers: bool = False


@dataclass(frozen=True, eq=False)
class Barrier(Stmt):
    """Every thread of a GPU block waits here (`__syncthreads()`); a no-op on CPUs."""


@dataclass(frozen=True, eq=False)
class IntrinCall(Stmt):
    """A call of a declared tensor intrinsic (tensorize) on regions of buffers.

    `name` is the C function called as `name(ptr0, strides0..., ptr1, strides1..., ...)`;
    `operands` are (buffer, element offset, strides in elements) of each region in the
    intrinsic's operand order (output first) and `shapes` their shapes; `c_source` defines the
    function; `emulate` does the same on numpy views, for the interpreter.
    """

    name: str
    operands: tuple[tuple[Buffer, Expr, tuple[int, ...]], ...]
    shapes: tuple[tuple[int, ...], ...]
    c_source: str
    emulate: Callable[..., None] = field(compare=False)


def seq(*stmts: Stmt) -> Stmt:
    """A Seq of `stmts`, flattening nested Seqs; a single statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.stmts if isinstance(s, Seq) else (s,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))

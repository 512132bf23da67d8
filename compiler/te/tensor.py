"""Tensor expressions: tensors defined by placeholders or by index formulas, and sum reductions."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.ir import expr as E


class IterKind(enum.Enum):
    DATA = "data"  # indexes the output: iterations are independent
    REDUCE = "reduce"  # summed over: iterations accumulate into one element


@dataclass(frozen=True, eq=False)
class IterVar:
    """An iteration axis `var` over [0, extent); also what schedule primitives take."""

    var: E.Var
    extent: int
    kind: IterKind

    @property
    def name(self) -> str:
        return self.var.name

    def __repr__(self) -> str:
        return f"{self.kind.value} axis {self.name}[0, {self.extent})"

    # Arithmetic on an axis means arithmetic on its variable, so `A[i, k * 2]` reads naturally.
    def __add__(self, other: E.Expr | int) -> E.Expr:
        return self.var + other

    def __sub__(self, other: E.Expr | int) -> E.Expr:
        return self.var - other

    def __mul__(self, other: E.Expr | int) -> E.Expr:
        return self.var * other

    def __radd__(self, other: E.Expr | int) -> E.Expr:
        return E.convert(other) + self.var

    def __rsub__(self, other: E.Expr | int) -> E.Expr:
        return E.convert(other) - self.var

    def __rmul__(self, other: E.Expr | int) -> E.Expr:
        return E.convert(other) * self.var


@dataclass(frozen=True, eq=False)
class PlaceholderOp:
    """An input tensor, filled by the caller."""

    name: str

    @property
    def axis(self) -> tuple[IterVar, ...]:
        """No loops: a placeholder is not computed (present so `t.op.axis` types for any op)."""
        return ()

    @property
    def reduce_axis(self) -> tuple[IterVar, ...]:
        return ()


@dataclass(frozen=True, eq=False)
class ComputeOp:
    """out[axis] = body, where `body` may be one top-level Reduce over `reduce_axis`."""

    name: str
    axis: tuple[IterVar, ...]
    reduce_axis: tuple[IterVar, ...]
    body: E.Expr

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """Tensors the body reads, in order of first appearance."""
        seen: dict[Tensor, None] = {}
        for node in walk(self.body):
            if isinstance(node, TensorLoad):
                seen.setdefault(node.tensor, None)
        return tuple(seen)


@dataclass(frozen=True, eq=False)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    op: PlaceholderOp | ComputeOp

    def __getitem__(self, indices: object) -> TensorLoad:
        items = indices if isinstance(indices, tuple) else (indices,)
        if len(items) != len(self.shape):
            raise IndexError(
                f"{self.name} has {len(self.shape)} dimensions, indexed with {len(items)}"
            )
        return TensorLoad(self, tuple(_as_index(i) for i in items))

    def __repr__(self) -> str:
        return f"Tensor({self.name}: {self.dtype}{list(self.shape)})"


@dataclass(frozen=True, eq=False)
class TensorLoad(E.Expr):
    """tensor[indices], by multi-dimensional index (lowering flattens it to a Load)."""

    tensor: Tensor
    indices: tuple[E.Expr, ...]

    @property
    def dtype(self) -> str:
        return self.tensor.dtype

    def __repr__(self) -> str:
        return f"{self.tensor.name}[{', '.join(str(i) for i in self.indices)}]"


COMBINERS = ("sum", "max", "min", "prod")


@dataclass(frozen=True, eq=False)
class Reduce(E.Expr):
    """The `combiner` ("sum", "max", "min" or "prod") of `source` over every point of `axis`."""

    source: E.Expr
    axis: tuple[IterVar, ...]
    combiner: str = "sum"

    @property
    def dtype(self) -> str:
        return self.source.dtype

    def identity(self) -> E.Expr:
        """The value the accumulator starts from."""
        if self.combiner in ("sum", "prod"):
            return E.convert(int(self.combiner == "prod"), self.dtype)
        if self.dtype in E.FLOAT_DTYPES:
            return E.FloatImm(float("-inf") if self.combiner == "max" else float("inf"), self.dtype)
        info = np.iinfo(self.dtype)
        return E.IntImm(int(info.min if self.combiner == "max" else info.max), self.dtype)

    def combine(self, acc: E.Expr, value: E.Expr) -> E.Expr:
        """The accumulator after taking in `value`."""
        if self.combiner == "sum":
            return E.Add(acc, value)
        if self.combiner == "prod":
            return E.Mul(acc, value)
        return E.Max(acc, value) if self.combiner == "max" else E.Min(acc, value)

    def __repr__(self) -> str:
        axes = ", ".join(a.name for a in self.axis)
        return f"{self.combiner}({self.source}, axis=[{axes}])"


def walk(expr: E.Expr) -> Iterator[E.Expr]:
    """Every node of a tensor expression, parents before children."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, TensorLoad):
            stack.extend(node.indices)
        elif isinstance(node, Reduce):
            stack.append(node.source)
        else:
            stack.extend(E.children(node))


def placeholder(shape: Sequence[int], dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor of `shape` and `dtype`."""
    return Tensor(name, _check_shape(shape, name), dtype, PlaceholderOp(name))


def reduce_axis(dom: tuple[int, int], name: str = "k") -> IterVar:
    """A reduction axis over [dom[0], dom[1]); only ranges starting at 0 for now."""
    lo, hi = dom
    if lo != 0 or hi < 1:
        raise ValueError(f"reduce axis {name}: range must be (0, n) with n >= 1, got {dom}")
    return IterVar(E.Var(name), hi, IterKind.REDUCE)


def sum(expr: E.Expr, axis: IterVar | Sequence[IterVar]) -> Reduce:
    """Sum `expr` over one or more reduction axes."""
    return _reduce(expr, axis, "sum")


def max(expr: E.Expr, axis: IterVar | Sequence[IterVar]) -> Reduce:
    """The maximum of `expr` over one or more reduction axes (elementwise: `maximum`)."""
    return _reduce(expr, axis, "max")


def min(expr: E.Expr, axis: IterVar | Sequence[IterVar]) -> Reduce:
    """The minimum of `expr` over one or more reduction axes (elementwise: `minimum`)."""
    return _reduce(expr, axis, "min")


def prod(expr: E.Expr, axis: IterVar | Sequence[IterVar]) -> Reduce:
    """The product of `expr` over one or more reduction axes."""
    return _reduce(expr, axis, "prod")


def _reduce(expr: E.Expr, axis: IterVar | Sequence[IterVar], combiner: str) -> Reduce:
    axes = (axis,) if isinstance(axis, IterVar) else tuple(axis)
    if not axes or any(a.kind is not IterKind.REDUCE for a in axes):
        raise ValueError(f"{combiner} needs at least one axis, all made by reduce_axis")
    return Reduce(E.convert(expr, "float32"), axes, combiner)


def compute(
    shape: Sequence[int], fcompute: Callable[..., E.Expr | float], name: str = "compute"
) -> Tensor:
    """A tensor of `shape` whose element at (i0, i1, ...) is `fcompute(i0, i1, ...)`.

    The index variables take the names of `fcompute`'s parameters, so loops print as written.
    """
    dims = _check_shape(shape, name)
    params = list(inspect.signature(fcompute).parameters)
    names = params if len(params) == len(dims) else [f"i{d}" for d in range(len(dims))]
    axis = tuple(
        IterVar(E.Var(n), extent, IterKind.DATA) for n, extent in zip(names, dims, strict=True)
    )
    body = E.convert(fcompute(*(a.var for a in axis)), "float32")
    reduces = [n for n in walk(body) if isinstance(n, Reduce)]
    if reduces and not (len(reduces) == 1 and reduces[0] is body):
        raise ValueError(f"compute {name}: a reduction must be the whole body, not part of it")
    reduce_axes = body.axis if isinstance(body, Reduce) else ()
    return Tensor(name, dims, body.dtype, ComputeOp(name, axis, reduce_axes, body))


def _as_index(value: object) -> E.Expr:
    if isinstance(value, IterVar):
        return value.var
    if isinstance(value, E.Expr | int):
        index = E.convert(value)
        if index.dtype not in E.INT_DTYPES:
            raise TypeError(f"tensor index must be an integer, got {index.dtype}")
        return index
    raise TypeError(f"cannot index a tensor with {type(value).__name__}")


def _check_shape(shape: Sequence[int], name: str) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 1 for d in dims):
        raise ValueError(f"{name}: every dimension must be >= 1, got {dims}")
    return dims

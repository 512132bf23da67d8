"""Tensor-expression computes for the INJECTIVE and REDUCTION graph ops.

`TE_COMPUTES[op](inputs, attrs, out_types, name=...)` returns the node's outputs as te tensors:
`inputs` are te tensors in the node's input order (shapes and dtypes as the graph types them, a
rank-0 value a rank-0 tensor), `out_types` the node's output types from the registry's type rule
(shapes come from them, so they never disagree with the graph), `name` names the output (a
split's k-th output is `name.k`; intermediates are `name.<what>`). Every output is a new
compute tensor (identity and reshape copy), so a caller can make it a kernel argument.

This module holds the injective ops (elementwise, broadcasting, data movement, layout
transforms, gather, batch_norm); `te_reductions` the reductions, merged into `TE_COMPUTES`.
Semantics follow the numpy references in `ops_*.py`: numpy broadcasting; reshape as index
arithmetic on the flat offset of each run of axes whose sizes multiply alike; pads and concats
clamp every read into bounds (a select evaluates both sides in vector code). By design a bool
value is a C `int` in kernels (4 bytes, not numpy's 1), and integer `pow` goes through double.

Intermediate tensors (a softmax's exps, a row max) are separate compute tensors; the group
kernel inlines the injective ones and places the reductions (`compiler.graph.group_kernel`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from compiler import te
from compiler.graph.ir import TensorType
from compiler.graph.ops_layout import layout_block
from compiler.graph.ops_shape import slice_bounds
from compiler.graph.ops_util import norm_axis
from compiler.graph.te_conv_transpose import CONV_TRANSPOSE_COMPUTES
from compiler.graph.te_index import INDEX_COMPUTES
from compiler.graph.te_reductions import REDUCTION_COMPUTES
from compiler.graph.te_resample import RESAMPLE_COMPUTES
from compiler.graph.te_util import (
    Attrs,
    ComputeFn,
    Index,
    as_index,
    broadcast_load,
    compute_of,
    const,
    float_attr,
)
from compiler.ir import expr as E
from compiler.te.math import clamp, in_range
from compiler.te.tensor import Tensor

TE_COMPUTES: dict[str, ComputeFn] = dict(REDUCTION_COMPUTES)
TE_COMPUTES.update(CONV_TRANSPOSE_COMPUTES)
TE_COMPUTES.update(RESAMPLE_COMPUTES)
TE_COMPUTES.update(INDEX_COMPUTES)


def _register(*ops: str) -> Callable[[ComputeFn], ComputeFn]:
    def wrap(fn: ComputeFn) -> ComputeFn:
        for op in ops:
            TE_COMPUTES[op] = fn
        return fn

    return wrap


# -- elementwise ----------------------------------------------------------------------------------

UnaryBody = Callable[[E.Expr, Attrs], E.Expr]


def _unary(op: str, body: UnaryBody) -> None:
    def compute(
        inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
    ) -> list[Tensor]:
        x = inputs[0]
        return [compute_of(out_types[0], lambda i: body(x[i], attrs), name or op)]

    TE_COMPUTES[op] = compute


def _hard_swish(v: E.Expr, a: Attrs) -> E.Expr:
    gate = E.Div(v, const(6, v.dtype)) + const(0.5, v.dtype)
    return v * E.Min(E.Max(gate, const(0, v.dtype)), const(1, v.dtype))


def _gelu(v: E.Expr, a: Attrs) -> E.Expr:
    half = const(0.5, v.dtype) * v
    one = const(1, v.dtype)
    if a.get("approximate", "none") == "tanh":
        inner = v + const(0.044715, v.dtype) * (v * v * v)
        return half * (one + te.tanh(const(math.sqrt(2 / math.pi), v.dtype) * inner))
    return half * (one + te.erf(E.Div(v, const(math.sqrt(2.0), v.dtype))))


def _abs(v: E.Expr, a: Attrs) -> E.Expr:
    if v.dtype in E.FLOAT_DTYPES:
        return E.Call("fabs", (v,))
    return E.Select(E.LT(v, const(0, v.dtype)), const(0, v.dtype) - v, v)


def _clip(v: E.Expr, a: Attrs) -> E.Expr:
    if a.get("min") is not None:
        v = E.Max(v, const(a["min"], v.dtype))
    if a.get("max") is not None:
        v = E.Min(v, const(a["max"], v.dtype))
    return v


def _cast(v: E.Expr, a: Attrs) -> E.Expr:
    to = str(np.dtype(a["dtype"]))
    if to == "bool":  # numpy: any non-zero is True; a C conversion to int would truncate 0.5
        return E.NE(v, const(0, v.dtype)) if v.dtype != "bool" else v
    return v if to == v.dtype else E.Cast(to, v)


_TRIGONOMETRY = frozenset(
    {"sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"}
)


def _libm(name: str) -> UnaryBody:
    """The body calling math function `name` (a float one of MATH_FUNCTIONS) on its input."""
    return lambda v, a: E.Call(name, (v,))


_UNARY: dict[str, UnaryBody] = {
    "relu": lambda v, a: E.Max(v, const(0, v.dtype)),
    "sigmoid": lambda v, a: E.Div(const(1, v.dtype), const(1, v.dtype) + te.exp(-v)),
    "tanh": lambda v, a: te.tanh(v),
    "erf": lambda v, a: te.erf(v),
    "sqrt": lambda v, a: te.sqrt(v),
    "exp": lambda v, a: te.exp(v),
    "log": lambda v, a: te.log(v),
    "neg": lambda v, a: -v,
    "hard_swish": _hard_swish,
    "identity": lambda v, a: v,
    "abs": _abs,
    "reciprocal": lambda v, a: E.Div(const(1, v.dtype), v),
    "leaky_relu": lambda v, a: E.Select(
        E.LE(const(0, v.dtype), v), v, v * const(float_attr(a, "alpha", 0.01), v.dtype)
    ),
    "hard_sigmoid": lambda v, a: E.Min(
        E.Max(
            v * const(float_attr(a, "alpha", 0.2), v.dtype)
            + const(float_attr(a, "beta", 0.5), v.dtype),
            const(0, v.dtype),
        ),
        const(1, v.dtype),
    ),
    "gelu": _gelu,
    "clip": _clip,
    "cast": _cast,
    "floor": lambda v, a: te.floor(v),
    "ceil": lambda v, a: te.ceil(v),
    "round": lambda v, a: te.round_half_even(v),
    "isnan": lambda v, a: te.isnan(v),
    "isinf": lambda v, a: te.isinf(
        v, bool(a.get("detect_negative", 1)), bool(a.get("detect_positive", 1))
    ),
    "bitwise_not": lambda v, a: te.bitwise_not(v),
    **{fn: _libm(fn) for fn in _TRIGONOMETRY},
}
for _op, _body in _UNARY.items():
    _unary(_op, _body)


def _pow(a: E.Expr, b: E.Expr) -> E.Expr:
    if a.dtype in E.FLOAT_DTYPES:
        return E.Call("pow", (a, b if b.dtype == a.dtype else E.Cast(a.dtype, b)))
    wide = E.Call("pow", (E.Cast("float64", a), E.Cast("float64", b)))
    return E.Cast(a.dtype, wide)


BinaryBody = Callable[[E.Expr, E.Expr], E.Expr]
_BINARY: dict[str, BinaryBody] = {
    "add": E.Add,
    "sub": E.Sub,
    "mul": E.Mul,
    "div": E.Div,  # C's `/` truncates integers toward zero, as the reference does
    "pow": _pow,
    "maximum": E.Max,
    "minimum": E.Min,
    "equal": E.EQ,
    "less": E.LT,
    "greater": lambda a, b: E.LT(b, a),
    "bitwise_and": te.bitwise_and,
    "bitwise_or": te.bitwise_or,
    "bitwise_xor": te.bitwise_xor,
    "shift_left": te.shift_left,
    "shift_right": te.shift_right,
}


def _binary(op: str, body: BinaryBody) -> None:
    def compute(
        inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
    ) -> list[Tensor]:
        a, b = inputs
        return [
            compute_of(
                out_types[0], lambda i: body(broadcast_load(a, i), broadcast_load(b, i)), name or op
            )
        ]

    TE_COMPUTES[op] = compute


for _op, _bbody in _BINARY.items():
    _binary(_op, _bbody)


def _floor_mod(a: E.Expr, b: E.Expr) -> E.Expr:
    """numpy's mod: the remainder with the sign of `b` (and a zero of that sign); computed in
    float32 for float16, as numpy does, so the two round alike."""
    if a.dtype == "float16":
        return E.Cast("float16", _floor_mod(E.Cast("float32", a), E.Cast("float32", b)))
    if a.dtype in E.FLOAT_DTYPES:
        r = te.fmod(a, b)
        zero = const(0, a.dtype)
        flip = E.And(E.NE(r, zero), E.NE(E.LT(r, zero), E.LT(b, zero)))
        return E.Select(E.EQ(r, zero), E.Call("copysign", (zero, b)), E.Select(flip, r + b, r))
    b = _safe_divisor(b)
    if a.dtype.startswith("uint"):
        return E.Mod(a, b)
    if a.dtype in ("int8", "int16"):  # the C helpers take 32 and 64 bits
        wide = E.FloorMod(E.Cast("int32", a), E.Cast("int32", b))
        return E.Cast(a.dtype, wide)
    return E.FloorMod(a, b)


def _safe_divisor(b: E.Expr) -> E.Expr:
    """Integer divisor `b` with 0 and -1 replaced by 1: every remainder by them is 0 (numpy's
    answer for 0 too), and C traps on x % 0 and on INT_MIN % -1."""
    one = const(1, b.dtype)
    trap: E.Expr = E.EQ(b, const(0, b.dtype))
    if not b.dtype.startswith("uint"):
        trap = E.Or(trap, E.EQ(b, const(-1, b.dtype)))
    return E.Select(trap, one, b)


@_register("mod")
def _mod(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    a, b = inputs
    if int(attrs.get("fmod", 0)):  # the sign of the dividend: C's fmod, C's % for integers
        body: BinaryBody = (
            te.fmod if a.dtype in E.FLOAT_DTYPES else lambda x, y: E.Mod(x, _safe_divisor(y))
        )
    else:
        body = _floor_mod
    return [
        compute_of(
            out_types[0], lambda i: body(broadcast_load(a, i), broadcast_load(b, i)), name or "mod"
        )
    ]


@_register("where")
def _where(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    c, a, b = inputs
    return [
        compute_of(
            out_types[0],
            lambda i: E.Select(broadcast_load(c, i), broadcast_load(a, i), broadcast_load(b, i)),
            name or "where",
        )
    ]


@_register("batch_norm")
def _batch_norm(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x, scale, bias, mean, var = inputs
    eps = const(float_attr(attrs, "epsilon", 1e-5), x.dtype)

    def body(i: Index) -> E.Expr:
        c = (i[1],)
        inv = E.Div(scale[c], te.sqrt(var[c] + eps))
        return (x[i] - mean[c]) * inv + bias[c]

    return [compute_of(out_types[0], body, name or "batch_norm")]


# -- data movement --------------------------------------------------------------------------------


def reshape_index(index: Index, out_shape: Sequence[int], in_shape: Sequence[int]) -> Index:
    """The input index a reshape reads for output `index`.

    Size-1 axes are dropped, and the rest cut into the shortest runs of output and input axes
    whose sizes multiply to the same number; within a run, the flat offset of the output index
    is split into input axes. A run of one axis on each side maps straight across.
    """
    out_axes = [a for a, d in enumerate(out_shape) if d != 1]
    in_axes = [a for a, d in enumerate(in_shape) if d != 1]
    result: list[E.Expr] = [E.IntImm(0)] * len(in_shape)
    i = j = 0
    while i < len(in_axes) and j < len(out_axes):
        ins, outs = [in_axes[i]], [out_axes[j]]
        n_in, n_out = in_shape[in_axes[i]], out_shape[out_axes[j]]
        i, j = i + 1, j + 1
        while n_in != n_out:
            if n_in < n_out:
                ins.append(in_axes[i])
                n_in *= in_shape[in_axes[i]]
                i += 1
            else:
                outs.append(out_axes[j])
                n_out *= out_shape[out_axes[j]]
                j += 1
        flat = index[outs[0]]
        for a in outs[1:]:
            flat = flat * E.IntImm(out_shape[a]) + index[a]
        stride = n_in
        for k, a in enumerate(ins):
            stride //= in_shape[a]
            part = flat if stride == 1 else E.FloorDiv(flat, E.IntImm(stride))
            result[a] = part if k == 0 else E.FloorMod(part, E.IntImm(in_shape[a]))
    return tuple(result)


@_register("reshape")
def _reshape(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    out = out_types[0]
    return [compute_of(out, lambda i: x[reshape_index(i, out.shape, x.shape)], name or "reshape")]


@_register("transpose")
def _transpose(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    rank = len(x.shape)
    perm = [int(p) for p in attrs.get("perm") or reversed(range(rank))]

    def body(i: Index) -> E.Expr:
        src: list[E.Expr] = [E.IntImm(0)] * rank
        for k, p in enumerate(perm):
            src[p] = i[k]
        return x[tuple(src)]

    return [compute_of(out_types[0], body, name or "transpose")]


@_register("concat")
def _concat(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    axis = norm_axis("concat", int(attrs["axis"]), len(inputs[0].shape))
    offsets = np.cumsum([0] + [t.shape[axis] for t in inputs]).tolist()

    def body(i: Index) -> E.Expr:
        # A select evaluates both sides (vector code): every read is clamped into its input.
        def read(k: int) -> E.Expr:
            t = inputs[k]
            at = clamp(i[axis] - E.IntImm(offsets[k]), t.shape[axis])
            return t[(*i[:axis], at, *i[axis + 1 :])]

        expr = read(len(inputs) - 1)
        for k in range(len(inputs) - 2, -1, -1):
            expr = E.Select(E.LT(i[axis], E.IntImm(offsets[k + 1])), read(k), expr)
        return expr

    return [compute_of(out_types[0], body, name or "concat")]


@_register("split")
def _split(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    axis = norm_axis("split", int(attrs.get("axis", 0)), len(x.shape))
    outs = []
    start = 0
    for k, t in enumerate(out_types):

        def body(i: Index, start: int = start) -> E.Expr:
            return x[(*i[:axis], i[axis] + E.IntImm(start), *i[axis + 1 :])]

        outs.append(compute_of(t, body, f"{name or 'split'}.{k}"))
        start += t.shape[axis]
    return outs


@_register("slice")
def _slice(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    bounds = [
        b.indices(d) for b, d in zip(slice_bounds("slice", x.shape, attrs), x.shape, strict=True)
    ]

    def body(i: Index) -> E.Expr:
        src = []
        for v, (start, _, step) in zip(i, bounds, strict=True):
            scaled = v if step == 1 else v * E.IntImm(step)
            src.append(scaled + E.IntImm(start) if start else scaled)
        return x[tuple(src)]

    return [compute_of(out_types[0], body, name or "slice")]


def _pad_read(j: E.Expr, size: int, mode: str) -> E.Expr:
    """The input position read at (possibly outside) position `j` of an axis of `size`."""
    if mode == "edge":
        return clamp(j, size)
    if mode == "wrap":
        return E.FloorMod(j, E.IntImm(size))
    if mode == "reflect":  # pads are smaller than the axis: one reflection at each end
        j = E.Select(E.LT(j, E.IntImm(0)), E.IntImm(0) - j, j)
        return E.Select(E.LT(j, E.IntImm(size)), j, E.IntImm(2 * (size - 1)) - j)
    return clamp(j, size)  # constant: the select below keeps the value outside


@_register("pad")
def _pad(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    rank = len(x.shape)
    pads = [int(p) for p in attrs["pads"]]
    mode = str(attrs.get("mode", "constant"))
    fill = const(attrs.get("value", 0) or 0, x.dtype)

    def body(i: Index) -> E.Expr:
        src: list[E.Expr] = []
        inside: list[E.Expr] = []
        for a, size in enumerate(x.shape):
            begin, end = pads[a], pads[a + rank]
            if begin == 0 and end <= 0:  # nothing added on this axis (an end crop needs no map)
                src.append(i[a])
                continue
            j = i[a] - E.IntImm(begin) if begin else i[a]
            src.append(_pad_read(j, size, mode))
            inside.append(in_range(j, size))
        value = x[tuple(src)]
        if mode != "constant" or not inside:
            return value
        return E.Select(te.all_of(*inside), value, fill)

    return [compute_of(out_types[0], body, name or "pad")]


@_register("gather")
def _gather(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    data, indices = inputs
    axis = norm_axis("gather", int(attrs.get("axis", 0)), len(data.shape))
    q = len(indices.shape)
    dim = data.shape[axis]

    def body(i: Index) -> E.Expr:
        at = as_index(indices[i[axis : axis + q]])
        at = E.Select(E.LT(at, E.IntImm(0)), at + E.IntImm(dim), at)
        return data[(*i[:axis], at, *i[axis + q :])]

    return [compute_of(out_types[0], body, name or "gather")]


@_register("gather_channels_nchwc")
def _gather_channels_nchwc(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    data, blocks, lanes = inputs

    def body(i: Index) -> E.Expr:
        b, cb, y, x, lane = i
        return data[b, as_index(blocks[cb, lane]), y, x, as_index(lanes[cb, lane])]

    return [compute_of(out_types[0], body, name or "gather_channels")]


@_register("expand")
def _expand(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    return [compute_of(out_types[0], lambda i: broadcast_load(x, i), name or "expand")]


@_register("layout_transform")
def _layout_transform(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    src = layout_block(str(attrs["src_layout"]))
    dst = layout_block(str(attrs["dst_layout"]))

    def body(i: Index) -> E.Expr:
        n, h, w = i[0], i[2], i[3]
        c = i[1] * E.IntImm(dst) + i[4] if dst else i[1]
        if not src:
            return x[n, c, h, w]
        return x[n, E.FloorDiv(c, E.IntImm(src)), h, w, E.FloorMod(c, E.IntImm(src))]

    return [compute_of(out_types[0], body, name or "layout_transform")]

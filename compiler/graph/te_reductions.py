"""Tensor-expression computes of the REDUCTION graph ops (see `te_ops` for the contract).

`reduce_sum / reduce_mean / reduce_max / reduce_min / reduce_prod` over axes (max and min of
bool data as int32 0 / 1, then back to bool); `softmax` as row max, exp(x - max), row sum
and quotient; `layer_norm` as mean, mean of squared deviations, then the normalized affine
map; max / average pools on NCHW and NCHW[x]c data (the block a trailing axis), max padding
with -inf and average dividing by the window taps ONNX counts (`count_include_pad`; ceil_mode
windows are cut at the end padding); global average pools. Sums accumulate in the data dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from compiler import te
from compiler.graph.ir import GraphError, TensorType
from compiler.graph.ops_util import int_tuple, norm_axis
from compiler.graph.te_util import (
    Attrs,
    ComputeFn,
    Index,
    broadcast_load,
    compute_of,
    const,
    float_attr,
    reduce_axes,
)
from compiler.ir import expr as E
from compiler.te.math import clamp, in_range
from compiler.te.tensor import IterVar, Tensor, prod

REDUCTION_COMPUTES: dict[str, ComputeFn] = {}


_COMBINE = {"reduce_sum": te.sum, "reduce_max": te.max, "reduce_min": te.min, "reduce_prod": prod}


def _reduce(op: str) -> ComputeFn:
    def compute(
        inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
    ) -> list[Tensor]:
        x = inputs[0]
        rank = len(x.shape)
        axes = sorted({norm_axis(op, int(a), rank) for a in attrs.get("axes") or ()})
        axes = axes or list(range(rank))
        keep = bool(attrs.get("keepdims", True))
        ks = reduce_axes(op, axes, x.shape)

        def source(i: Index) -> E.Expr:
            src: list[E.Expr] = []
            pos = 0
            for a in range(rank):
                if a in axes:
                    src.append(ks[axes.index(a)].var)
                    pos += keep
                else:
                    src.append(i[pos])
                    pos += 1
            return x[tuple(src)]

        out = out_types[0]
        if x.dtype == "bool":  # any / all: the max / min of 0 / 1 ints, then back to bool
            ints = TensorType(out.shape, "int32")
            combine = _COMBINE[op]
            flags = compute_of(
                ints, lambda i: combine(E.Cast("int32", source(i)), ks), f"{name or op}.int"
            )
            return [compute_of(out, lambda i: E.NE(flags[i], const(0, "int32")), name or op)]
        if op in _COMBINE:
            combine = _COMBINE[op]
            return [compute_of(out, lambda i: combine(source(i), ks), name or op)]
        if x.dtype not in E.FLOAT_DTYPES:
            raise GraphError(f"{op}: {x.dtype} data has no te compute (float only)")
        inv = const(1.0 / math.prod(k.extent for k in ks), x.dtype)
        return [compute_of(out, lambda i: te.sum(source(i) * inv, ks), name or op)]

    return compute


for _op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"):
    REDUCTION_COMPUTES[_op] = _reduce(_op)


def _softmax(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    name = name or "softmax"
    axis = norm_axis("softmax", int(attrs.get("axis", -1)), len(x.shape))
    rows = TensorType(x.shape[:axis] + x.shape[axis + 1 :], x.dtype)

    def at(i: Index, k: E.Expr) -> Index:
        return (*i[:axis], k, *i[axis:])

    def row(i: Index) -> Index:
        return (*i[:axis], *i[axis + 1 :])

    n = x.shape[axis]
    lanes = next((f for f in LANE_PARTIALS if n % f == 0 and n > f), 0)
    if axis == len(x.shape) - 1 and lanes:
        mx = _lane_reduced(lambda r, k: x[(*r, k)], n, rows, lanes, "max", f"{name}.max")
        exps = compute_of(out_types[0], lambda i: te.exp(x[i] - mx[row(i)]), f"{name}.exp")
        total = _lane_reduced(lambda r, k: exps[(*r, k)], n, rows, lanes, "sum", f"{name}.sum")
    else:
        k1 = te.reduce_axis((0, n), name="softmax_k1")
        mx = compute_of(rows, lambda i: te.max(x[at(i, k1.var)], k1), f"{name}.max")
        exps = compute_of(out_types[0], lambda i: te.exp(x[i] - mx[row(i)]), f"{name}.exp")
        k2 = te.reduce_axis((0, n), name="softmax_k2")
        total = compute_of(rows, lambda i: te.sum(exps[at(i, k2.var)], k2), f"{name}.sum")
    return [compute_of(out_types[0], lambda i: E.Div(exps[i], total[row(i)]), name)]


# Lane counts for reductions over a contiguous last axis: partial results per lane first (a
# vectorizable reduction), then the lanes reduced.
LANE_PARTIALS = (16, 8)


def _lane_reduced(
    value: Callable[[Index, E.Expr], E.Expr],
    n: int,
    rows: TensorType,
    lanes: int,
    how: str,
    name: str,
) -> Tensor:
    """max or sum over k < n of `value(row, k)` (which reads a contiguous last axis at k), in
    two stages: per-lane partials over k = ko * lanes + lane, then over the lanes."""
    reduce = te.max if how == "max" else te.sum
    ko = te.reduce_axis((0, n // lanes), name=f"{how}_ko")
    partial_type = TensorType((*rows.shape, lanes), rows.dtype)

    def partial(i: Index) -> E.Expr:
        *r, lane = i
        return reduce(value(tuple(r), ko.var * lanes + lane), ko)

    parts = compute_of(partial_type, partial, f"{name}.lanes")
    kl = te.reduce_axis((0, lanes), name=f"{how}_lane")
    return compute_of(rows, lambda i: reduce(parts[(*i, kl.var)], kl), name)


def _layer_norm(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x, scale, bias = inputs
    name = name or "layer_norm"
    axis = norm_axis("layer_norm", int(attrs.get("axis", -1)), len(x.shape))
    eps = const(float_attr(attrs, "epsilon", 1e-5), x.dtype)
    rows = TensorType(x.shape[:axis], x.dtype)
    inv = const(1.0 / math.prod(x.shape[axis:]), x.dtype)

    def cells(i: Index, ks: list[IterVar]) -> Index:
        return (*i, *(k.var for k in ks))

    n = x.shape[-1]
    lanes = next((f for f in LANE_PARTIALS if n % f == 0 and n > f), 0)
    if axis == len(x.shape) - 1 and lanes:

        def square(r: Index, k: E.Expr) -> E.Expr:
            d = x[(*r, k)] - mean[r]
            return d * d * inv

        mean = _lane_reduced(lambda r, k: x[(*r, k)] * inv, n, rows, lanes, "sum", f"{name}.mean")
        var = _lane_reduced(square, n, rows, lanes, "sum", f"{name}.var")
    else:
        k1 = reduce_axes("ln_mean", range(axis, len(x.shape)), x.shape)
        mean = compute_of(rows, lambda i: te.sum(x[cells(i, k1)] * inv, k1), f"{name}.mean")
        k2 = reduce_axes("ln_var", range(axis, len(x.shape)), x.shape)

        def centred_square(i: Index) -> E.Expr:
            d = x[cells(i, k2)] - mean[i]
            return te.sum(d * d * inv, k2)

        var = compute_of(rows, centred_square, f"{name}.var")

    def body(i: Index) -> E.Expr:
        r = i[:axis]
        norm = E.Div(x[i] - mean[r], te.sqrt(var[r] + eps))
        return norm * broadcast_load(scale, i) + broadcast_load(bias, i)

    return [compute_of(out_types[0], body, name)]


# -- pools (NCHW, and NCHW[x]c with the block as a trailing axis) ---------------------------------


def _window_counts(out: int, k: int, s: int, d: int, lo: int, hi: int) -> np.ndarray:
    """Per output position, the window taps within [lo, hi) (coordinates of the padded axis)."""
    pos = np.arange(out)[:, None] * s + np.arange(k)[None, :] * d
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


def _count_expr(o: E.Expr, k: int, s: int, d: int, lo: int, hi: int) -> E.Expr:
    """The taps t in [0, k) with lo <= o*s + t*d < hi, counted by an int32 expression of o."""
    base = o * E.IntImm(s) if s != 1 else o
    first: E.Expr = E.FloorDiv(E.IntImm(lo + d - 1) - base, E.IntImm(d))  # ceil((lo - base) / d)
    last: E.Expr = E.FloorDiv(E.IntImm(hi - 1) - base, E.IntImm(d))
    first = E.Max(first, E.IntImm(0))
    last = E.Min(last, E.IntImm(k - 1))
    return E.Max(last - first + E.IntImm(1), E.IntImm(0))


def _pool(mode: str) -> ComputeFn:
    def compute(
        inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
    ) -> list[Tensor]:
        x = inputs[0]
        out = out_types[0]
        op = f"{mode}_pool2d"
        kernel = int_tuple(op, attrs, "kernel", 2, 1)
        strides = int_tuple(op, attrs, "strides", 2, 1)
        pads = int_tuple(op, attrs, "pads", 4, 0)
        dil = int_tuple(op, attrs, "dilations", 2, 1)
        size = x.shape[2:4]
        ks = [te.reduce_axis((0, kernel[a]), name=f"pool_k{a}") for a in range(2)]
        # Window cells outside the data, per axis; those axes need a guard.
        guard = [
            pads[a] > 0
            or (out.shape[2 + a] - 1) * strides[a] + (kernel[a] - 1) * dil[a] - pads[a] >= size[a]
            for a in range(2)
        ]
        include_pad = bool(attrs.get("count_include_pad", False))
        counts = []
        for a in range(2):
            lo, hi = (
                (0, size[a] + pads[a] + pads[a + 2])
                if include_pad
                else (pads[a], pads[a] + size[a])
            )
            n = _window_counts(out.shape[2 + a], kernel[a], strides[a], dil[a], lo, hi)
            counts.append((n, lo, hi))

        def cell(i: Index) -> tuple[E.Expr, list[E.Expr]]:
            src: list[E.Expr] = list(i)
            inside: list[E.Expr] = []
            for a in range(2):
                j = i[2 + a] * E.IntImm(strides[a]) + ks[a].var * E.IntImm(dil[a])
                j = j - E.IntImm(pads[a]) if pads[a] else j
                src[2 + a] = clamp(j, size[a]) if guard[a] else j
                if guard[a]:
                    inside.append(in_range(j, size[a]))
            return x[tuple(src)], inside

        if mode == "max":

            def max_body(i: Index) -> E.Expr:
                value, inside = cell(i)
                if inside:
                    value = E.Select(te.all_of(*inside), value, const(-np.inf, x.dtype))
                return te.max(value, ks)

            return [compute_of(out, max_body, name or op)]

        def avg_body(i: Index) -> E.Expr:
            value, inside = cell(i)
            if inside:
                value = E.Select(te.all_of(*inside), value, const(0, x.dtype))
            if all(int(c.min()) == int(c.max()) for c, _, _ in counts):
                cells = int(counts[0][0][0]) * int(counts[1][0][0])
                return te.sum(value * const(1.0 / cells, x.dtype), ks)
            n = [
                _count_expr(i[2 + a], kernel[a], strides[a], dil[a], lo, hi)
                for a, (_, lo, hi) in enumerate(counts)
            ]
            return te.sum(E.Div(value, E.Cast(x.dtype, n[0] * n[1])), ks)

        return [compute_of(out, avg_body, name or op)]

    return compute


def _global_avg_pool(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    h, w = x.shape[2:4]
    ks = [te.reduce_axis((0, h), name="gap_kh"), te.reduce_axis((0, w), name="gap_kw")]
    inv = const(1.0 / (h * w), x.dtype)

    def body(i: Index) -> E.Expr:
        return te.sum(x[(i[0], i[1], ks[0].var, ks[1].var, *i[4:])] * inv, ks)

    return [compute_of(out_types[0], body, name or "global_avg_pool2d")]


REDUCTION_COMPUTES["softmax"] = _softmax
REDUCTION_COMPUTES["layer_norm"] = _layer_norm
for _suffix in ("", "_nchwc"):
    REDUCTION_COMPUTES[f"max_pool2d{_suffix}"] = _pool("max")
    REDUCTION_COMPUTES[f"avg_pool2d{_suffix}"] = _pool("avg")
    REDUCTION_COMPUTES[f"global_avg_pool2d{_suffix}"] = _global_avg_pool

"""Tensor-expression computes of the index graph ops (`ops_index`; see `te_ops` for the contract).

The reductions have only sum / max / min / prod combiners, so the index-valued ones are built
from those:
- argmax / argmin / hardmax: the extreme value m along the axis (NaN left out), then the min
  over positions k of a key that is k for a NaN, k + n for an element equal to m and 2n
  otherwise (for the last position: the max of k + n for a NaN, k for m, -1 otherwise); the
  position is the key less n where it is n or more, so a NaN wins as in numpy's argmax. Two
  passes over the axis.
- topk: rank[e] = how many elements along the axis beat element e (a larger value, or an
  equal one at a lower position; NaN beats every number), a total order, so the ranks are a
  permutation; indices[p] = the sum over e of (rank[e] == p ? e : 0) and values[p] =
  x[indices[p]]. Cost per row of n: n * n comparisons for the ranks, n * k for the indices.
- cumsum: y[i] = sum over k of (k <= i ? x[k] : 0) (<, >=, > for exclusive / reverse):
  n * n additions per row, exact for integers, in order for floats.
The injective ones read one element each: trilu by the position of (i, j) against the
diagonal, one_hot by comparing the index (in a dtype adding depth cannot wrap) with its
position, gather_elements by its index, wrapped when negative and clamped into the axis so a
bad index cannot read out of bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from compiler import te
from compiler.graph.ir import TensorType
from compiler.graph.ops_index import one_hot_index_dtype
from compiler.graph.ops_util import norm_axis
from compiler.graph.te_util import Attrs, ComputeFn, Index, as_index, compute_of, const
from compiler.ir import expr as E
from compiler.te.math import clamp, isnan
from compiler.te.tensor import Tensor

INDEX_COMPUTES: dict[str, ComputeFn] = {}


def _register(*ops: str) -> Callable[[ComputeFn], ComputeFn]:
    def wrap(fn: ComputeFn) -> ComputeFn:
        for op in ops:
            INDEX_COMPUTES[op] = fn
        return fn

    return wrap


def _at(i: Index, axis: int, k: E.Expr, kept: bool) -> Index:
    """The input index of row `i` at position `k` of `axis` (`i` has the axis when `kept`)."""
    return (*i[:axis], k, *i[axis + kept :])


def _is_float(t: Tensor) -> bool:
    return t.dtype in E.FLOAT_DTYPES


def extreme_position(
    x: Tensor, axis: int, largest: bool, last: bool, kept: bool, name: str
) -> Tensor:
    """The int32 position along `axis` of the largest (or smallest) element of each row of `x`,
    the first (or `last`) of equal ones, a NaN before any number; rows keep the axis as size 1
    when `kept`."""
    n = x.shape[axis]
    rows = x.shape[:axis] + ((1,) if kept else ()) + x.shape[axis + 1 :]
    k1 = te.reduce_axis((0, n), name=f"{name}_k1")
    k2 = te.reduce_axis((0, n), name=f"{name}_k2")
    floats = _is_float(x)

    def value(i: Index, k: E.Expr) -> E.Expr:
        v = x[_at(i, axis, k, kept)]
        if not floats:
            return v
        return E.Select(isnan(v), const(-np.inf if largest else np.inf, x.dtype), v)

    combine = te.max if largest else te.min
    best = compute_of(
        TensorType(rows, x.dtype), lambda i: combine(value(i, k1.var), k1), f"{name}.best"
    )

    def key(i: Index) -> E.Expr:
        k = k2.var
        v = x[_at(i, axis, k, kept)]
        hit, miss = (k, E.IntImm(-1)) if last else (k + n, E.IntImm(2 * n))
        found = E.Select(E.EQ(v, best[i]), hit, miss)
        if floats:
            found = E.Select(isnan(v), k + n if last else k, found)
        return te.max(found, k2) if last else te.min(found, k2)

    keys = compute_of(TensorType(rows, "int32"), key, f"{name}.key")
    return compute_of(
        TensorType(rows, "int32"),
        lambda i: E.Select(E.LE(E.IntImm(n), keys[i]), keys[i] - n, keys[i]),
        f"{name}.pos",
    )


def _arg(largest: bool) -> ComputeFn:
    def compute(
        inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
    ) -> list[Tensor]:
        x = inputs[0]
        out = out_types[0]
        op = "argmax" if largest else "argmin"
        name = name or op
        axis = norm_axis(op, int(attrs.get("axis", 0)), len(x.shape))
        last = bool(attrs.get("select_last_index", 0))
        kept = len(out.shape) == len(x.shape)
        pos = extreme_position(x, axis, largest, last, kept, name)
        return [compute_of(out, lambda i: E.Cast(out.dtype, pos[i]), name)]

    return compute


INDEX_COMPUTES["argmax"] = _arg(largest=True)
INDEX_COMPUTES["argmin"] = _arg(largest=False)


@_register("hardmax")
def _hardmax(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    name = name or "hardmax"
    axis = norm_axis("hardmax", int(attrs.get("axis", -1)), len(x.shape))
    pos = extreme_position(x, axis, largest=True, last=False, kept=False, name=name)
    one, zero = const(1, x.dtype), const(0, x.dtype)

    def body(i: Index) -> E.Expr:
        return E.Select(E.EQ(i[axis], pos[(*i[:axis], *i[axis + 1 :])]), one, zero)

    return [compute_of(out_types[0], body, name)]


def _beats(a: E.Expr, b: E.Expr, largest: bool) -> E.Expr:
    """Whether value `a` comes strictly before `b` in TopK's order (NaN above every number)."""
    above = E.LT(b, a) if largest else E.LT(a, b)
    if a.dtype not in E.FLOAT_DTYPES:
        return above
    nan_first = E.And(isnan(a), E.Not(isnan(b))) if largest else E.And(isnan(b), E.Not(isnan(a)))
    return E.Or(above, nan_first)


def _ties(a: E.Expr, b: E.Expr) -> E.Expr:
    """Whether `a` and `b` hold the same place in TopK's order (two NaNs do)."""
    same = E.EQ(a, b)
    if a.dtype not in E.FLOAT_DTYPES:
        return same
    return E.Or(same, E.And(isnan(a), isnan(b)))


@_register("topk")
def _topk(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    values_t, indices_t = out_types
    name = name or "topk"
    axis = norm_axis("topk", int(attrs.get("axis", -1)), len(x.shape))
    largest = bool(attrs.get("largest", 1))
    n = x.shape[axis]
    j = te.reduce_axis((0, n), name=f"{name}_j")
    e = te.reduce_axis((0, n), name=f"{name}_e")

    def rank_of(i: Index) -> E.Expr:
        other, mine = x[_at(i, axis, j.var, True)], x[i]
        earlier = E.And(_ties(other, mine), E.LT(j.var, i[axis]))
        beaten = E.Or(_beats(other, mine, largest), earlier)
        return te.sum(E.Select(beaten, E.IntImm(1), E.IntImm(0)), j)

    rank = compute_of(TensorType(x.shape, "int32"), rank_of, f"{name}.rank")

    def index_of(i: Index) -> E.Expr:
        placed = E.EQ(rank[_at(i, axis, e.var, True)], i[axis])
        at = E.Cast(indices_t.dtype, e.var)
        return te.sum(E.Select(placed, at, const(0, indices_t.dtype)), e)

    indices = compute_of(indices_t, index_of, f"{name}.1")

    def value_of(i: Index) -> E.Expr:
        at = clamp(E.Cast(E.INDEX_DTYPE, indices[i]), n)
        return x[_at(i, axis, at, True)]

    return [compute_of(values_t, value_of, name), indices]


@_register("cumsum")
def _cumsum(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    name = name or "cumsum"
    axis = norm_axis("cumsum", int(attrs.get("axis", 0)), len(x.shape))
    exclusive = bool(attrs.get("exclusive", 0))
    reverse = bool(attrs.get("reverse", 0))
    k = te.reduce_axis((0, x.shape[axis]), name=f"{name}_k")

    def body(i: Index) -> E.Expr:
        first, second = (i[axis], k.var) if reverse else (k.var, i[axis])
        counted = E.LT(first, second) if exclusive else E.LE(first, second)
        term = E.Select(counted, x[_at(i, axis, k.var, True)], const(0, x.dtype))
        return te.sum(term, k)

    return [compute_of(out_types[0], body, name)]


@_register("trilu")
def _trilu(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    x = inputs[0]
    rows, cols = x.shape[-2:]
    # Past either corner k keeps every element or none: clamped there, it fits an int32.
    k = max(-rows, min(int(attrs.get("k", 0)), cols))
    upper = bool(attrs.get("upper", 1))

    def body(i: Index) -> E.Expr:
        row, col = i[-2], i[-1]
        # upper: col - row >= k, i.e. row + k <= col; lower: col - row <= k
        keep = E.LE(row + k, col) if upper else E.LE(col, row + k)
        return E.Select(keep, x[i], const(0, x.dtype))

    return [compute_of(out_types[0], body, name or "trilu")]


@_register("one_hot")
def _one_hot(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    indices, values = inputs
    out = out_types[0]
    depth = int(attrs["depth"])
    axis = norm_axis("one_hot", int(attrs.get("axis", -1)), len(out.shape))
    wide = one_hot_index_dtype(indices.dtype)

    def body(i: Index) -> E.Expr:
        index: E.Expr = E.Cast(wide, indices[(*i[:axis], *i[axis + 1 :])])
        if wide != "uint64":  # negative indices count from depth
            index = E.Select(E.LT(index, const(0, wide)), index + const(depth, wide), index)
        hit = E.EQ(index, E.Cast(wide, i[axis]))
        return E.Select(hit, values[E.IntImm(1)], values[E.IntImm(0)])

    return [compute_of(out, body, name or "one_hot")]


@_register("gather_elements")
def _gather_elements(
    inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
) -> list[Tensor]:
    data, indices = inputs
    axis = norm_axis("gather_elements", int(attrs.get("axis", 0)), len(data.shape))
    dim = data.shape[axis]

    def body(i: Index) -> E.Expr:
        at: E.Expr = indices[i]  # wrapped and clamped in its own dtype, then narrowed
        zero, size = const(0, at.dtype), const(dim, at.dtype)
        at = E.Select(E.LT(at, zero), at + size, at)
        at = E.Min(E.Max(at, zero), const(dim - 1, at.dtype))
        return data[_at(i, axis, as_index(at), True)]

    return [compute_of(out_types[0], body, name or "gather_elements")]

"""Tensor-expression compute of the transposed convolutions (see `te_ops` for the contract).

`conv_transpose1d / 2d / 3d` as a direct sum: output position o (per spatial axis) reads input
position (o + pad - k * dilation) / stride for every kernel tap k whose numerator is a whole,
in-range multiple of the stride, over the group's input channels:

    y[n, oc, o] = b[oc] + sum_{c, k} x[n, g * Cg + c, (o + pad - k*d) / s] * w[g * Cg + c, oc % Og, k]

with g = oc // Og. With dilation 1 along an axis, only the taps k = (o + pad) mod s + t * s
reach o, so t walks ceil(kernel / s) steps (the last selected away where it passes the
kernel): about prod(ceil(kernel / s) * s / kernel) of the useful multiply-adds at most. With a
dilation, every tap is visited and those whose numerator misses the stride are selected away:
N * O * prod(out) * Cg * prod(kernel) multiply-adds, prod(strides) times the useful work. The
loops are scalar (the source index is a division), far from a tuned conv2d; a convolution of
the zero-stuffed input by the conv2d templates would be the fast form. Sums accumulate in the
data dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

from compiler import te
from compiler.graph.ir import TensorType
from compiler.graph.ops_conv_transpose import ConvTransposeGeometry, conv_transpose_geometry
from compiler.graph.te_util import Attrs, ComputeFn, Index, compute_of, const
from compiler.ir import expr as E
from compiler.te.math import clamp, in_range
from compiler.te.tensor import Tensor

CONV_TRANSPOSE_COMPUTES: dict[str, ComputeFn] = {}


def tap_extent(geometry: ConvTransposeGeometry, axis: int, kernel: int) -> int:
    """The reduction extent over the taps of spatial `axis`: with dilation 1 and stride s, only
    the taps k = (o + pad) mod s + t * s reach output o, so t < ceil(kernel / s) is walked."""
    s, d = geometry.strides[axis], geometry.dilations[axis]
    return -(-kernel // s) if s > 1 and d == 1 else kernel


def _source(
    o: E.Expr, t: E.Expr, axis: int, geometry: ConvTransposeGeometry, size: int, kernel: int
) -> tuple[E.Expr, E.Expr, E.Expr | None]:
    """For output `o` and reduction step `t` along spatial `axis`: the input position it reads
    (clamped into the input), the kernel tap (clamped into the kernel), and the condition that
    the pair is a real one (None when every step hits)."""
    s, d, pad = geometry.strides[axis], geometry.dilations[axis], geometry.pads[axis]
    shifted = o + E.IntImm(pad) if pad else o
    if s > 1 and d == 1:  # the stride phase picks the taps: no misses but the ends
        k = E.FloorMod(shifted, E.IntImm(s)) + t * E.IntImm(s)
        q = E.FloorDiv(shifted, E.IntImm(s)) - t
        hit = E.And(E.LT(k, E.IntImm(kernel)), in_range(q, size))
        return clamp(q, size), E.Min(k, E.IntImm(kernel - 1)), hit
    j = shifted - t * E.IntImm(d) if d != 1 else shifted - t
    if s == 1:
        out = geometry.out(axis, size, kernel)
        if pad - d * (kernel - 1) >= 0 and out - 1 + pad <= size - 1:
            return j, t, None
        return clamp(j, size), t, in_range(j, size)
    q = E.FloorDiv(j, E.IntImm(s))
    hit = E.And(E.EQ(E.FloorMod(j, E.IntImm(s)), E.IntImm(0)), in_range(q, size))
    return clamp(q, size), t, hit


def _conv_transpose(rank: int) -> ComputeFn:
    op = f"conv_transpose{rank}d"

    def compute(
        inputs: Sequence[Tensor], attrs: Attrs, out_types: Sequence[TensorType], name: str = ""
    ) -> list[Tensor]:
        x, w = inputs[0], inputs[1]
        name = name or op
        geometry = conv_transpose_geometry(op, attrs, rank)
        cg, og = x.shape[1] // geometry.groups, w.shape[1]
        size, kernel = x.shape[2:], w.shape[2:]
        rc = te.reduce_axis((0, cg), name="convt_c")
        steps = [
            te.reduce_axis((0, tap_extent(geometry, a, kernel[a])), name=f"convt_k{a}")
            for a in range(rank)
        ]

        def body(i: Index) -> E.Expr:
            n, oc = i[0], i[1]
            c: E.Expr = rc.var
            oc_in_group = oc
            if geometry.groups > 1:
                c = E.FloorDiv(oc, E.IntImm(og)) * E.IntImm(cg) + rc.var
                oc_in_group = E.FloorMod(oc, E.IntImm(og))
            where: list[E.Expr] = []
            taps: list[E.Expr] = []
            hits: list[E.Expr] = []
            for a in range(rank):
                at, tap, hit = _source(i[2 + a], steps[a].var, a, geometry, size[a], kernel[a])
                where.append(at)
                taps.append(tap)
                if hit is not None:
                    hits.append(hit)
            value = x[(n, c, *where)] * w[(c, oc_in_group, *taps)]
            if hits:
                value = E.Select(te.all_of(*hits), value, const(0, x.dtype))
            return te.sum(value, [rc, *steps])

        if len(inputs) < 3:
            return [compute_of(out_types[0], body, name)]
        b = inputs[2]
        total = compute_of(out_types[0], body, f"{name}.sum")
        return [compute_of(out_types[0], lambda i: total[i] + b[(i[1],)], name)]

    return compute


for _rank in (1, 2, 3):
    CONV_TRANSPOSE_COMPUTES[f"conv_transpose{_rank}d"] = _conv_transpose(_rank)

"""conv2d 3x3 stride 1 by Winograd's minimal filtering, F(m x m, 3 x 3), in NCHW[x]c.

The output is cut into m x m tiles; each tile of input, (m+2) x (m+2), is transformed (B^T d B),
multiplied channel by channel with the transformed weights (G g G^T, folded at pack time), and the
(m+2)^2 products are transformed back (A^T M A). The multiply is (m+2)^2 independent GEMMs of
tiles x IC x OC, which carry all the arithmetic: 36 multiplies per 16 outputs of F(4x4) against
144 for direct convolution, 16 per 4 for F(2x2) against 36.

Workload: the direct template's (N, IC, H, W, OC, 3, 3, 1, pad, epilogue). Arguments, in order:
- `data` `[N][IC/icb][nH*m+2][nW*m+2][icb]`: the input padded by `pad` above and left, and by as
  much below and right as the last tile reads (at least `pad`), so no tile needs a bounds check;
- `weight` `[alpha][alpha][OC/ocb][IC][ocb]`: G g G^T per output-channel block, a packed GEMM
  panel per (eps, nu);
- `bias` `[OC/ocb][ocb]` when there is an epilogue;
- the output `[N][OC/ocb][OH][OW][ocb]`.

Stages: `wino_in` [alpha][alpha][P][IC] (P = N*nH*nW tiles), `wino_mm` [alpha][alpha][OC/ocb][P][ocb]
and the output with the epilogue. The transforms are sparse sums chosen by a Select chain on the
unrolled transform axes: once the unroll pass makes those axes constants the simplifier keeps the
one branch, so only non-zero coefficients are computed. F(2x2) writes each transform as one sum
per (eps, nu) or output position. F(4x4) writes each in two halves (`separable`): `wino_db`
(d B) per input tile and `wino_ma` (M A) per output tile, small local buffers computed at the
tile loops, each output of the other half summing one column or row of them: 264 terms per
input tile instead of 484, and about half the C. The GEMM is the dense template's register
tile: `reg_p` tiles x `oc_block` lanes of accumulators in a `cache_write` local tile.
On more than one thread the `parallel` knob runs each stage's outer data loops on OpenMP's
threads, all three in one parallel region ("outer": tiles of `wino_in`, (eps, nu) of
`wino_mm`, (batch, oc block) of the output; "fused": each with its next loop too). Every
reduction (over input channels) stays inside one thread's iteration.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from compiler import te
from compiler.ir import expr as E
from compiler.ops.base import (
    NO_PARALLEL,
    parallel_of,
    parallelize,
    register_file,
    register_tile_fits,
)
from compiler.ops.conv2d import RELU6_CAP, Conv2dNCHWcTemplate, conv_geometry
from compiler.ops.layout import pack_bias, pack_nchwc
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import ceil_div, channel_blocks
from compiler.schedule.schedule import Schedule, Stage, create_schedule
from compiler.te.tensor import ComputeOp, IterVar, Tensor

TILES = (4, 2)  # m of F(m x m, 3 x 3); the first is the default layout's
_REG_P = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14)
Matrix = tuple[tuple[Fraction, ...], ...]


@functools.cache
def winograd_matrices(m: int) -> tuple[Matrix, Matrix, Matrix]:
    """(A^T, G, B^T) of F(m x m, 3 x 3): A^T is m x alpha, G alpha x 3, B^T alpha x alpha.

    By Cook-Toom over the points 0, 1, -1, 2, -2, ... (as many as alpha - 1 needs) and infinity,
    exact in fractions: y = A^T [(G g) * (B^T d)] for a 1-D tile of m outputs.
    """
    if m not in TILES:
        raise ValueError(f"winograd: tile must be one of {TILES}, got {m}")
    r = 3
    alpha = m + r - 1
    points: list[Fraction] = [Fraction(0)]
    k = 1
    while len(points) < alpha - 1:
        points.append(Fraction(k))
        if len(points) < alpha - 1:
            points.append(Fraction(-k))
        k += 1
    n = alpha - 1  # finite points
    # A^T[i][j] = p_j^i for finite points, the last column (infinity) is [0..0, 1].
    at = tuple((*(p**i for p in points), Fraction(1 if i == m - 1 else 0)) for i in range(m))
    # G[j] = g's polynomial at p_j over prod_{k != j} (p_j - p_k); the infinity row is g's
    # leading coefficient.
    g_rows: list[tuple[Fraction, ...]] = []
    for j, p in enumerate(points):
        denom = Fraction(1)
        for q_index, q in enumerate(points):
            if q_index != j:
                denom *= p - q
        g_rows.append(tuple(p**i / denom for i in range(r)))
    g_rows.append((Fraction(0),) * (r - 1) + (Fraction(1),))
    # B^T: row j holds the coefficients of prod_{k != j} (x - p_k) over the finite points; the
    # infinity row those of prod_k (x - p_k).
    bt_rows: list[tuple[Fraction, ...]] = []
    for j in range(n):
        poly = [Fraction(1)]
        for q_index, q in enumerate(points):
            if q_index != j:
                poly = _poly_mul(poly, [-q, Fraction(1)])
        bt_rows.append(tuple(poly) + (Fraction(0),) * (alpha - len(poly)))
    full = [Fraction(1)]
    for q in points:
        full = _poly_mul(full, [-q, Fraction(1)])
    bt_rows.append(tuple(full) + (Fraction(0),) * (alpha - len(full)))
    return at, tuple(g_rows), tuple(bt_rows)


def _poly_mul(a: Sequence[Fraction], b: Sequence[Fraction]) -> list[Fraction]:
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def _as_array(m: Matrix) -> np.ndarray:
    return np.array([[float(v) for v in row] for row in m], dtype=np.float64)


def transform_weight(w: np.ndarray, m: int, oc_block: int) -> np.ndarray:
    """OIHW 3x3 weights -> G g G^T packed `[alpha][alpha][OC/ocb][IC][ocb]` (float32)."""
    oc, ic, kh, kw = w.shape
    if (kh, kw) != (3, 3):
        raise ValueError(f"winograd: weights must be 3x3, got {kh}x{kw}")
    if oc % oc_block:
        raise ValueError(f"winograd: block {oc_block} does not divide {oc} output channels")
    _, g, _ = winograd_matrices(m)
    gm = _as_array(g)
    u = np.einsum("ea,oiab,fb->efoi", gm, w.astype(np.float64), gm)  # [alpha][alpha][OC][IC]
    alpha = gm.shape[0]
    u = u.reshape(alpha, alpha, oc // oc_block, oc_block, ic).transpose(0, 1, 2, 4, 3)
    return np.ascontiguousarray(u, dtype=np.float32)


def _sparse_sum(terms: list[tuple[Fraction, E.Expr]]) -> E.Expr:
    """sum(c * x) over the non-zero coefficients, as a balanced tree (short dependency chains)."""
    parts: list[E.Expr] = []
    for coef, x in terms:
        if coef == 0:
            continue
        if coef == 1:
            parts.append(x)
        elif coef == -1:
            parts.append(E.FloatImm(0.0) - x if not parts else -x)
        else:
            parts.append(E.FloatImm(float(coef)) * x)
    if not parts:
        return E.FloatImm(0.0)
    while len(parts) > 1:
        paired = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
        parts = paired + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def _select_table(
    index: Sequence[E.Expr], leaf: Callable[..., E.Expr], sizes: Sequence[int]
) -> E.Expr:
    """The expression `leaf(i0, i1, ...)` for the constant indices equal to `index`, as a
    Select chain the simplifier folds to one leaf once the indices are constants."""

    def build(prefix: tuple[int, ...]) -> E.Expr:
        depth = len(prefix)
        if depth == len(sizes):
            return leaf(*prefix)
        options = [build((*prefix, i)) for i in range(sizes[depth])]
        chain = options[-1]
        for i in range(sizes[depth] - 2, -1, -1):
            chain = E.Select(E.EQ(index[depth], E.IntImm(i)), options[i], chain)
        return chain

    return build(())


@functools.cache
def separable(m: int) -> bool:
    """Whether F(m x m)'s transforms are cheaper in two halves (d B, then B^T (d B)): the
    direct form sums nnz^2 terms per tile (nnz: the non-zeros of B^T), the halves 2 alpha nnz.
    F(4x4): 264 against 484; F(2x2): 64 either way, so it keeps one stage each side."""
    _, _, bt = winograd_matrices(m)
    nonzeros = sum(1 for row in bt for x in row if x)
    return 2 * len(bt) * nonzeros < nonzeros**2


def _producer(t: Tensor, name: str) -> Tensor:
    """The input `name` of computed tensor `t`."""
    assert isinstance(t.op, ComputeOp)
    found = next(x for x in t.op.inputs if x.name == name)
    assert isinstance(found.op, ComputeOp)
    return found


def _transform_at(stage: Stage, parent: Stage, loop: IterVar, lanes: int) -> None:
    """Compute the first half of a transform, `[alpha][alpha or m][..tile..][channels]`, per
    tile and channel block (`lanes`) of `parent` at `loop`: its two transform axes unrolled,
    the block's lanes vectorized, in a local buffer (registers where it fits)."""
    stage.set_scope("local")
    stage.compute_at(parent, loop)
    first, second, *tile, last = stage.axis
    outer, inner = stage.split(last, lanes)
    stage.reorder(*tile, outer, first, second, inner)
    stage.unroll(first)
    stage.unroll(second)
    stage.vectorize(inner)


class Conv2dWinogradTemplate(Conv2dNCHWcTemplate):
    """3x3 stride-1 convolution by Winograd F(2x2) or F(4x4), in NCHW[x]c."""

    name = "conv2d_winograd_nchwc"
    layout_knobs = ("tile", "ic_block", "oc_block")

    def geometry(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        geometry = conv_geometry(self.name, shape)
        if geometry[5:8] != (3, 3, 1):
            raise ValueError(
                f"{self.name}: needs a 3x3 kernel of stride 1, got "
                f"{geometry[5]}x{geometry[6]} stride {geometry[7]}"
            )
        return geometry

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        n, ic, _, _, oc, _, _, _, _, _, oh, ow = self.geometry(shape)
        most_tiles = max(n * ceil_div(oh, 2) * ceil_div(ow, 2), 1)
        return ConfigSpace(
            [
                Knob("tile", TILES),
                Knob("ic_block", channel_blocks(ic)),
                Knob("oc_block", channel_blocks(oc)),
                Knob("reg_p", tuple(r for r in _REG_P if r <= most_tiles) or (1,)),
                Knob("unroll_k", (1, 2, 4)),
            ]
        )

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        n, _, _, _, oc, *_, oh, ow = self.geometry(shape)
        m = int(config["tile"])
        regs = register_file(target)
        vectors = ceil_div(int(config["oc_block"]), regs.lanes)
        tiles = n * ceil_div(oh, m) * ceil_div(ow, m)
        most = min(tiles, 12) * min(ceil_div(oc, regs.lanes), 4)
        return register_tile_fits(int(config["reg_p"]) * vectors, most, regs.max_accumulators)

    def tiling(self, shape: tuple[int, ...], config: Config | None) -> tuple[int, int, int]:
        """(m, nH, nW) of `config` (None: F(4x4))."""
        *_, oh, ow = self.geometry(shape)
        m = int(config["tile"]) if config is not None else TILES[0]
        return m, ceil_div(oh, m), ceil_div(ow, m)

    def padded_hw(self, shape: tuple[int, ...], config: Config | None) -> tuple[int, int]:
        """Rows and columns of the padded input `data`: every tile's (m+2) x (m+2) window."""
        m, nh, nw = self.tiling(shape, config)
        return nh * m + 2, nw * m + 2

    def extra_padding(self, shape: tuple[int, ...], config: Config | None) -> tuple[int, int]:
        _, _, h, w, _, _, _, _, pad, *_ = self.geometry(shape)
        hp, wp = self.padded_hw(shape, config)
        return hp - h - 2 * pad, wp - w - 2 * pad

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        n, ic, _, _, oc, _, _, _, _, epilogue, oh, ow = self.geometry(shape)
        icb, ocb = self.blocks(shape, config)
        m, nh, nw = self.tiling(shape, config)
        alpha = m + 2
        hp, wp = self.padded_hw(shape, config)
        at, _, bt = winograd_matrices(m)
        split = separable(m)
        tiles = n * nh * nw
        data = te.placeholder((n, ic // icb, hp, wp, icb), name="data")
        weight = te.placeholder((alpha, alpha, oc // ocb, ic, ocb), name="weight")

        def tile_read(p: E.Expr, c: E.Expr) -> Callable[[E.Expr | int, int], E.Expr]:
            """d[a][j] of tile `p`, channel `c`."""
            b, th, tw = p // (nh * nw), p // nw % nh, p % nw
            return lambda a, j: data[b, c // icb, th * m + a, tw * m + j, c % icb]

        if split:
            # d B, then B^T (d B): each output sums one row or column of the other half.
            db = te.compute(
                (alpha, alpha, tiles, ic),
                lambda a, u, p, c: _select_table(
                    (u,),
                    lambda col: _sparse_sum(
                        [(bt[col][j], tile_read(p, c)(a, j)) for j in range(alpha)]
                    ),
                    (alpha,),
                ),
                name="wino_db",
            )

            def tile_input(eps: E.Var, nu: E.Var, p: E.Var, c: E.Var) -> E.Expr:
                def leaf(row: int) -> E.Expr:
                    return _sparse_sum([(bt[row][a], db[a, nu, p, c]) for a in range(alpha)])

                return _select_table((eps,), leaf, (alpha,))

        else:

            def tile_input(eps: E.Var, nu: E.Var, p: E.Var, c: E.Var) -> E.Expr:
                read = tile_read(p, c)

                def leaf(e: int, u: int) -> E.Expr:
                    return _sparse_sum(
                        [
                            (bt[e][a] * bt[u][bb], read(a, bb))
                            for a in range(alpha)
                            for bb in range(alpha)
                        ]
                    )

                return _select_table((eps, nu), leaf, (alpha, alpha))

        v = te.compute((alpha, alpha, tiles, ic), tile_input, name="wino_in")
        k = te.reduce_axis((0, ic), name="k")
        mm = te.compute(
            (alpha, alpha, oc // ocb, tiles, ocb),
            lambda eps, nu, co, p, ci: te.sum(
                v[eps, nu, p, k.var] * weight[eps, nu, co, k.var, ci], axis=k
            ),
            name="wino_mm",
        )
        bias = te.placeholder((oc // ocb, ocb), name="bias") if epilogue else None
        cap = RELU6_CAP if epilogue == 3 else None
        if split:
            # M A, then A^T (M A), as the input side.
            ma = te.compute(
                (alpha, m, oc // ocb, tiles, ocb),
                lambda e, c, co, p, ci: _select_table(
                    (c,),
                    lambda col: _sparse_sum(
                        [(at[col][u], mm[e, u, co, p, ci]) for u in range(alpha)]
                    ),
                    (m,),
                ),
                name="wino_ma",
            )

        def out_body(b: E.Var, co: E.Var, y: E.Var, x: E.Var, ci: E.Var) -> E.Expr:
            p = (b * nh + y // m) * nw + x // m
            if split:
                value = _select_table(
                    (y % m,),
                    lambda row: _sparse_sum(
                        [(at[row][e], ma[e, x % m, co, p, ci]) for e in range(alpha)]
                    ),
                    (m,),
                )
            else:
                value = _select_table(
                    (y % m, x % m),
                    lambda r, c: _sparse_sum(
                        [
                            (at[r][e] * at[c][u], mm[e, u, co, p, ci])
                            for e in range(alpha)
                            for u in range(alpha)
                        ]
                    ),
                    (m, m),
                )
            if bias is not None:
                value = value + bias[co, ci]
            if epilogue >= 2:
                value = E.Max(value, E.FloatImm(0.0))
            return E.Min(value, E.FloatImm(cap)) if cap is not None else value

        out = te.compute((n, oc // ocb, oh, ow, ocb), out_body, name="out")
        return [data, weight, out] if bias is None else [data, weight, bias, out]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """wino_in: p, ic blocks | eps, nu (unrolled), ic lanes (vector); wino_mm: the dense
        register tile per (eps, nu, oc block); out: n, oc block, tile rows and columns | m x m
        (unrolled), oc lanes (vector). Separable (F(4x4)): wino_db computed per tile and ic
        block, wino_ma per output tile."""
        m = int(config["tile"])
        split = separable(m)
        icb, ocb = self.blocks(shape, config)
        out = args[-1]
        sch = create_schedule(out)
        ma = _producer(out, "wino_ma") if split else out
        mm = _producer(ma, "wino_mm")
        v = _producer(mm, "wino_in")

        st = sch[out]
        b, co, y, x, ci = st.axis
        yo, yi = st.split(y, m)
        xo, xi = st.split(x, m)
        st.reorder(b, co, yo, xo, yi, xi, ci)
        st.unroll(yi)
        st.unroll(xi)
        st.vectorize(ci)

        sv = sch[v]
        eps, nu, p, c = sv.axis
        co_v, ci_v = sv.split(c, icb)
        sv.reorder(p, co_v, eps, nu, ci_v)
        sv.unroll(eps)
        sv.unroll(nu)
        sv.vectorize(ci_v)
        parallel = parallel_of(config)
        if parallel != NO_PARALLEL:
            # "outer": tiles of the input transform, (eps, nu) of the products, (batch, oc
            # block) of the output transform; "fused": each with its next loop too.
            more = parallel == "fused"
            co_v = parallelize(sv, [p, co_v], 1 + more)[-1]
            parallelize(st, [b, co, yo], 2 + more)
        if split:
            # The first halves, d B and M A, per input tile and channel block, per output tile.
            _transform_at(sch[_producer(v, "wino_db")], sv, co_v, icb)
            _transform_at(sch[ma], st, xo, ocb)

        acc = sch.cache_write(mm, "local")
        sm = sch[mm]
        eps, nu, co, p, ci = sm.axis
        po, pi = sm.split(p, int(config["reg_p"]))
        sm.reorder(eps, nu, co, po, pi, ci)
        sm.unroll(pi)
        sm.vectorize(ci)
        if parallel != NO_PARALLEL:
            loops = parallelize(sm, [eps, nu, co, po], 2 + (parallel == "fused"))
            po = loops[-1]
        sa = sch[acc]
        sa.compute_at(sm, po)
        (r,) = sa.reduce_axis
        unroll_k = int(config["unroll_k"])
        if unroll_k > 1:
            ro, ri = sa.split(r, unroll_k)
            sa.reorder(ro, ri, *sa.axis)
            sa.unroll(ri)
        else:
            sa.reorder(r, *sa.axis)
        for axis in sa.axis[:-1]:
            sa.unroll(axis)
        sa.vectorize(sa.axis[-1])
        return sch

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        *_, pad, epilogue, _, _ = self.geometry(shape)
        icb, ocb = self.blocks(shape, config)
        m, _, _ = self.tiling(shape, config)
        x = np.asarray(inputs[0], np.float32)
        below, right = self.extra_padding(shape, config)
        widths = [(0, 0), (0, 0), (pad, pad + below), (pad, pad + right)]
        packed = [
            pack_nchwc(np.pad(x, widths), icb),
            transform_weight(np.asarray(inputs[1], np.float32), m, ocb),
        ]
        if epilogue:
            packed.append(pack_bias(np.asarray(inputs[2], np.float32), ocb))
        return packed

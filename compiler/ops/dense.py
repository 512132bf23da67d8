"""Dense with packed weights: C[m, n] = sum_k A[m, k] * B[k, n], B packed to [ceil(N/nr)][K][nr]
(with k blocks of kc, [K/kc][ceil(N/nr)][kc][nr]).

Workload (M, N, K), float32. The schedule is a register tile of `mr` rows of A times one packed
panel of `nr` columns (nr/16 vectors): the accumulators are a `cache_write` "local" tile placed
(compute_at) inside the row-tile loop, which gcc keeps in mr x nr/16 vector registers; per k the
micro-kernel broadcasts one value of A per row and reads nr/16 contiguous vectors of B. Row
tiles are grouped in blocks of about `m_tiles` (BLIS' MC; `block_tiles` picks a count that
divides the full tiles) so a block of A stays in L2 while every panel of B passes over it.
When nr divides N the output is declared [M][N/nr][nr], the same bytes as [M][N], so packed
columns index it without division; otherwise it is [M][N] and the panel index is n // nr.
With `pack_a` each block of A is first copied into [row tile][k][mr] (BLIS' packed A), so the
micro-kernel's broadcasts walk one stream; at K = 2048 the unpacked rows are 8 KB apart and
share L1 sets (sgemm 2048 on Zen 3: 0.97x numpy packed against 0.93x, interleaved).
With k blocks, B is packed k block first: a row tile streams every panel of one k block, and
in [N/nr][K][nr] those kc x nr pieces sat K * nr * 4 bytes apart, a new stream for the
hardware prefetcher each; k block first they are one run (sgemm 2048 on Zen 3, interleaved:
1.03x numpy against 0.99x, and 0.99x against 0.89x in a noisier run).
On more than one thread the `parallel` knob (see `base.threaded_space`) spreads the output's
tiles over OpenMP's threads: "outer" the outermost loop over output tiles (blocks of rows with
m_tiles, else panels or row tiles as `order` has them), "fused" that loop fused with the next
one (more, smaller chunks). With k blocks those loops sit inside the k-block loop, a reduction
every thread's tiles share: each k block is one parallel region over disjoint output tiles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from compiler import te
from compiler.ir import expr as E
from compiler.ops.base import (
    NO_PARALLEL,
    OpTemplate,
    parallel_of,
    register_file,
    register_tile_fits,
)
from compiler.ops.layout import pack_dense_weight
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import VECTOR_LANES, ceil_div, check_workload
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.tensor import ComputeOp, IterVar, Reduce, Tensor

_FIELDS = ("M", "N", "K")
_NR = (16, 32, 48, 64)  # panel widths: 1 to 4 zmm registers
_MR = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14)  # rows of the register tile
_M_TILES = (0, 2, 4, 8, 16, 32, 64)
_KC = (64, 128, 256, 512)
# Which loop walks the other: "panel" streams every row tile of A past one panel of B
# (B panel stationary in L1/L2), "row" streams every panel of B past one row tile of A.
_ORDERS = ("panel", "row")
# The `parallel` knob's choices on more than one thread (see the module doc).
_PARALLEL = (NO_PARALLEL, "outer", "fused")


def block_tiles(m: int, mr: int, m_tiles: int) -> int:
    """Row tiles per block for the `m_tiles` knob: the divisor of the count of full row tiles
    nearest to it (the smaller of two as near), or `m_tiles` when one block holds them all.

    Blocks that divide the full tiles leave M's partial tile (M % mr rows) alone in a block
    of its own. A block count that does not divide them (21 full tiles of 12 rows at M = 256,
    in blocks of 8) made the loop partition emit the whole micro-kernel twice, for the full
    blocks and again for the last block's full tiles: a quarter of the candidate's C, compiled
    for nothing.
    """
    full = m // mr
    if not m_tiles or full <= m_tiles:
        return m_tiles
    divisors = [d for d in range(1, full + 1) if full % d == 0]
    return min(divisors, key=lambda d: (abs(d - m_tiles), d))


def _nr_choices(n: int) -> tuple[int, ...]:
    # Wider than N rounded up to a vector only pads with zero columns.
    useful = tuple(nr for nr in _NR if nr <= ceil_div(n, VECTOR_LANES) * VECTOR_LANES)
    return useful or (_NR[0],)


class DenseTemplate(OpTemplate):
    """Dense (matrix product) with B pre-packed into column panels."""

    name = "dense"
    fields = _FIELDS
    layout_knobs = ("nr", "kc")

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        m, n, k = check_workload(self.name, shape, _FIELDS)
        return ConfigSpace(
            [
                Knob("nr", _nr_choices(n)),
                Knob("mr", tuple(r for r in _MR if r <= m) or (1,)),
                # Row tiles per block of A that stays in L2 while every panel of B passes over
                # it; 0 means all of M (then each panel of B is read once, A once per panel).
                Knob("m_tiles", _M_TILES),
                # BLIS' KC: a [kc][nr] panel of B stays in L1 across a block's row tiles.
                Knob("kc", (k, *(c for c in _KC if c < k and k % c == 0))),
                Knob("unroll_k", (1, 2, 4, 8)),
                Knob("order", _ORDERS),
                # Copy each block of A into [row tile][k][mr] (BLIS' packed A): the micro-kernel
                # then reads one contiguous stream instead of mr rows K floats apart, which
                # share L1 sets when K * 4 bytes is a multiple of 4 KB.
                Knob("pack_a", (False, True)),
            ]
        )

    def parallel_choices(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        return _PARALLEL

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        m, n, _ = check_workload(self.name, shape, _FIELDS)
        if parallel_of(config) == "fused" and config["pack_a"] and config["m_tiles"]:
            return False  # A's block would be packed again for every panel of the fused loop
        regs = register_file(target)
        vectors = ceil_div(int(config["nr"]), regs.lanes)
        most = min(m, 12) * min(ceil_div(n, regs.lanes), 4)
        return register_tile_fits(int(config["mr"]) * vectors, most, regs.max_accumulators)

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        m, n, k = check_workload(self.name, shape, _FIELDS)
        return [(m, k), (k, n)]

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        a, b = inputs
        return np.matmul(a, b, dtype=np.float32)

    def flop(self, shape: tuple[int, ...]) -> float:
        m, n, k = check_workload(self.name, shape, _FIELDS)
        return 2.0 * m * n * k

    def _nr(self, config: Config | None) -> int:
        return int(config["nr"]) if config is not None else _NR[0]

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        m, n, k = check_workload(self.name, shape, _FIELDS)
        nr = self._nr(config)
        kc = int(config["kc"]) if config is not None else k
        a = te.placeholder((m, k), "float32", name="A")
        whole = n % nr == 0
        out_shape = (m, n // nr, nr) if whole else (m, n)
        a_at = self._a_reader(a, config)

        def panel(cols: tuple[E.Var, ...]) -> tuple[E.Expr, E.Expr]:
            """(panel, column in the panel) of output column `cols`."""
            return (cols[0], cols[1]) if whole else (cols[0] // nr, cols[0] % nr)

        if kc >= k:
            bp = te.placeholder((ceil_div(n, nr), k, nr), "float32", name="B_packed")
            r = te.reduce_axis((0, k), name="k")

            def full(i: E.Var, *cols: E.Var) -> E.Expr:
                jo, ji = panel(cols)
                return te.sum(a_at(i, r.var) * bp[jo, r.var, ji], axis=r)

            return [a, bp, te.compute(out_shape, full, name="C")]
        # BLIS: partial products per k block (kept in registers), summed into C block by block.
        # B is packed k block first, so the panels one k block streams are contiguous.
        bp = te.placeholder((k // kc, ceil_div(n, nr), kc, nr), "float32", name="B_packed")
        rk = te.reduce_axis((0, kc), name="k")

        def partial(ko: E.Var, i: E.Var, *cols: E.Var) -> E.Expr:
            jo, ji = panel(cols)
            return te.sum(a_at(i, ko * kc + rk.var) * bp[ko, jo, rk.var, ji], axis=rk)

        part = te.compute((k // kc, *out_shape), partial, name="C_part")
        rko = te.reduce_axis((0, k // kc), name="ko")
        c = te.compute(
            out_shape, lambda i, *cols: te.sum(part[(rko, i, *cols)], axis=rko), name="C"
        )
        return [a, bp, c]

    @staticmethod
    def _a_reader(a: Tensor, config: Config | None) -> Callable[[E.Expr, E.Expr], E.Expr]:
        """How the product reads A[i, k]: directly, or (pack_a) from `A_packed[i // mr][k][i %
        mr]`, a copy of A whose rows past M repeat the last row (never stored)."""
        if config is None or not config.get("pack_a"):
            return lambda i, kk: a[i, kk]
        m, k = a.shape
        mr = int(config["mr"])
        packed = te.compute(
            (ceil_div(m, mr), k, mr),
            lambda io, kk, ii: a[E.Min(io * mr + ii, E.IntImm(m - 1)), kk],
            name="A_packed",
        )
        return lambda i, kk: packed[i // mr, kk, i % mr]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """Loops [ko] [mb] jo, mt | k | mi, ji over a register-resident [mr][nr] tile
        (order "row": [ko] [mb] mt, jo | k | mi, ji).

        Without k blocks the tile is C's `cache_write` "local" copy; with them it is the k
        block's partial product, a local stage computed at the row-tile loop, and C's own
        reduction over k blocks (outermost) adds each tile into memory once per block.
        """
        nr, mr = int(config["nr"]), int(config["mr"])
        c = args[-1]
        sch = create_schedule(c)
        assert isinstance(c.op, ComputeOp)
        blocked = isinstance(c.op.body, Reduce) and c.op.body.axis[0].name == "ko"
        if blocked:
            part = next(t for t in c.op.inputs if isinstance(t.op, ComputeOp))
        else:
            part = sch.cache_write(c, "local")
        st = sch[c]
        if len(st.axis) == 3:
            i, jo, ji = st.axis
        else:
            i, j = st.axis
            jo, ji = st.split(j, nr)
        io, ii = st.split(i, mr)
        tiles = block_tiles(shape[0], mr, int(config["m_tiles"]))
        outer: list[IterVar] = list(st.reduce_axis)
        if tiles:
            ib, it = st.split(io, tiles)
            outer.append(ib)
        else:
            it = io
        tiles_loops = [it, jo] if config["order"] == "row" else [jo, it]
        st.reorder(*outer, *tiles_loops, ii, ji)
        tile_at = tiles_loops[-1]
        st.unroll(ii)
        st.vectorize(ji)
        # The data loops outside the register tile, outermost first: [ib] and the tile loops.
        spatial = [*outer[len(st.reduce_axis) :], *tiles_loops]
        parallel = parallel_of(config)
        if parallel == "fused":
            fused = st.fuse(spatial[0], spatial[1])
            if spatial[1] is tile_at:
                tile_at = fused
            if tiles:
                outer[-1] = fused
            spatial = [fused, *spatial[2:]]
        if parallel != NO_PARALLEL:
            st.parallel(spatial[0])
        if config.get("pack_a"):
            # One block of A (its row tiles, one k block) is packed where the block starts;
            # with neither blocks of rows nor of k, all of A before the product.
            pack = next(p for p in sch.stages if p.op.name == "A_packed")
            if outer:
                pack.compute_at(st, outer[-1])
        at = sch[part]
        at.compute_at(st, tile_at)
        if blocked:
            at.set_scope("local")
        (r,) = at.reduce_axis
        unroll_k = int(config["unroll_k"])
        if unroll_k > 1:
            ro, ri = at.split(r, unroll_k)
            at.reorder(ro, ri, *at.axis)
            at.unroll(ri)
        else:
            at.reorder(r, *at.axis)
        for axis in at.axis[:-1]:
            at.unroll(axis)
        at.vectorize(at.axis[-1])
        return sch

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        a, b = inputs
        kc = int(config["kc"]) if config is not None else None
        return [np.ascontiguousarray(a, np.float32), pack_dense_weight(b, self._nr(config), kc)]

    def unpack_output(
        self, shape: tuple[int, ...], config: Config | None, output: np.ndarray
    ) -> np.ndarray:
        m, n, _ = check_workload(self.name, shape, _FIELDS)
        return output.reshape(m, n)

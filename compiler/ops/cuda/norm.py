"""Softmax and layer norm on a GPU: one row per block, or one row per warp.

The computes are the CPU templates' (`compiler.ops.normalization`: a [rows][cols] float32
matrix, statistics over the last axis). The row statistics (softmax's max and sum of exps,
layer norm's mean and variance) are cross-thread reductions (`compiler.lower.allreduce`): the
threads of a row each fold a strided part of it, then combine their partials in a shared-memory
tree. Each statistic is computed at the output's block loop into shared memory, so the block
reads them as it writes its rows; the elementwise stages between (softmax's exps, layer norm's
1/sqrt(var + eps)) are inlined, recomputed where they are read, which costs a few arithmetic
instructions per element in a kernel bound by memory, instead of a row of storage.

Knobs:
- `rows`: "block" gives each row a block of `threads` threads (long rows: many threads share
  one row); "warp" gives each row one warp of 32 threads and a block `threads` / 32 rows
  (threadIdx.y), so short rows do not leave most of a block idle. Which wins depends on the row
  length and the GPU's occupancy; only a measurement can say.
- `threads`: threads a block.
- `unroll`: unroll each thread's loop over its strided elements (more loads in flight).
- `cache_row`: first copy the block's rows of the input into shared memory (one coalesced
  global read of each element instead of one per pass: softmax reads a row three times, layer
  norm three), where they fit in 48 KB; elsewhere the knob does nothing and `worth_measuring`
  says so.
Every config is correct for any size; rows shorter than `threads` use fewer threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compiler.ops.normalization import FIELDS, LayerNormTemplate, SoftmaxTemplate, _producers
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.util import check_workload
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.tensor import Reduce, Tensor

WARP = 32
SHARED_BYTES = 48 * 1024  # static shared memory a block may declare
ROW_MODES = ("block", "warp")


def row_space(name: str, shape: tuple[int, ...]) -> ConfigSpace:
    """The knobs of `schedule_rows_cuda` for a (rows, cols) workload."""
    check_workload(name, shape, FIELDS)
    return ConfigSpace(
        [
            Knob("rows", ROW_MODES),
            Knob("threads", (32, 64, 128, 256, 512, 1024)),
            Knob("unroll", (False, True)),
            Knob("cache_row", (False, True)),
        ]
    )


def rows_per_block(shape: tuple[int, ...], config: Mapping[str, Any]) -> int:
    """Rows one block of `config` computes (1 a block; threads / 32 a warp each)."""
    if config["rows"] != "warp":
        return 1
    return min(shape[0], max(1, int(config["threads"]) // WARP))


def row_cache_fits(shape: tuple[int, ...], config: Mapping[str, Any]) -> bool:
    """Whether the block's rows of the input fit in static shared memory beside the partials
    of its two row statistics (`allreduce`'s R + 1 slots a row, and the statistic itself)."""
    cols = shape[1]
    block_rows = rows_per_block(shape, config)
    width = WARP if config["rows"] == "warp" else min(int(config["threads"]), cols)
    statistics = 2 * block_rows * (width + 2)
    return (block_rows * cols + statistics) * 4 <= SHARED_BYTES


def schedule_rows_cuda(out: Tensor, x: Tensor, config: Config) -> Schedule:
    """Every reduction behind `out` a cross-thread one at the output's block loop, in shared
    memory; every other producer inlined; `out` itself one row per block or per warp; the
    block's rows of the input `x` staged in shared memory first if `cache_row` and they fit."""
    sch = create_schedule(out)
    st = sch[out]
    r, c = st.axis
    threads = int(config["threads"])
    per_warp = config["rows"] == "warp"
    width = WARP if per_warp else threads
    if per_warp:
        block, row = st.split(r, max(1, threads // WARP))
        st.bind(block, "blockIdx.x")
        st.bind(row, "threadIdx.y")
    else:
        block = r
        st.bind(r, "blockIdx.x")
    co, ci = st.split(c, width)
    st.bind(ci, "threadIdx.x")
    st.reorder(ci, co)
    if config["unroll"]:
        st.unroll(co)
    for t in _producers(out):
        stage = sch[t]
        if not isinstance(stage.op.body, Reduce):
            stage.compute_inline()
            continue
        stage.set_scope("shared")
        stage.compute_at(st, block)
        if per_warp:
            stage.bind(stage.axis[0], "threadIdx.y")
        ko, ki = stage.split(stage.reduce_axis[0], width)
        stage.bind(ki, "threadIdx.x")
        if config["unroll"]:
            stage.unroll(ko)
    if config.get("cache_row") and row_cache_fits(x.shape, config):
        readers = [g.tensor for g in sch.stages if g.attach != "inline" and x in g.op.inputs]
        cached = sch[sch.cache_read(x, "shared", readers)]
        cached.compute_at(st, block)
        cr, cc = cached.axis
        if per_warp:
            cached.bind(cr, "threadIdx.y")
        co, ci = cached.split(cc, width)
        cached.bind(ci, "threadIdx.x")
        if config["unroll"]:
            cached.unroll(co)
    return sch


class _CudaRows:
    """What the GPU softmax and layer norm share: knobs, and configs not worth measuring."""

    name: str

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        return row_space(self.name, shape)

    def parallel_choices(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        return ()

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        """False for `cache_row` where the rows do not fit: the same kernel as without it."""
        return not config["cache_row"] or row_cache_fits(shape, config)


class CudaSoftmaxTemplate(_CudaRows, SoftmaxTemplate):
    """Softmax over rows, block- or warp-per-row (see the module doc)."""

    name = "cuda_softmax"

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        return schedule_rows_cuda(args[-1], args[0], config)


class CudaLayerNormTemplate(_CudaRows, LayerNormTemplate):
    """Layer norm over rows, block- or warp-per-row (see the module doc)."""

    name = "cuda_layer_norm"

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        return schedule_rows_cuda(args[-1], args[0], config)

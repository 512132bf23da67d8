"""`vta_dense`: an int8 dense layer (GEMM) with its epilogue, for the VTA-like accelerator.

The compute, in the tensor-expression language, is the reference definition:

    acc[i, j] = sum_r int32(x[i, r]) * int32(w[j, r])                     x: int8[M, K], w: int8[N, K]
    y[i, j]   = int8(min(max(acc[i, j] + bias[j], 0) >> SHIFT, 127))      bias: int32[N]

int8 inputs and weights, int32 accumulation, bias + ReLU + shift-and-clip requantisation back to
int8. The workload is (M, N, K). On the host it builds like any template (the naive schedule:
the check reference a vta_sim device compares a program's outputs with); for the target "vta"
a config is a `compiler.codegen.vta.GemmTiling` (tile sizes along M / N / K in GEMM blocks and
the virtual threads) and `program` generates its instruction stream. `worth_measuring` rejects
tilings whose slots overflow an on-chip buffer: such a program could not run at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from compiler import te
from compiler.artifact import ArgSpec, Artifact, Entry
from compiler.codegen.vta import VTHREAD_CHOICES, GemmTiling, gemm_program, tiling_problem
from compiler.ir import expr as E
from compiler.ops.base import OpTemplate
from compiler.ops.reference import naive_schedule
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.schedule.schedule import Schedule
from compiler.te.tensor import Tensor
from protos.vta import VTA_TARGET, VtaSpec
from protos.vta_program import Program, encode_programs

# The requantisation: ReLU, then keep bits [SHIFT, SHIFT + 7) of the int32 sum, saturating.
SHIFT = 4
_SHIFT_EXPR = E.IntImm(SHIFT, "int32")
ACCEL_FORMAT = "accel_program"
_TILE_M = (16, 32, 49, 64, 98, 128, 196, 256)
_TILE_N = (1, 2, 4, 8, 16)
_TILE_K = (2, 4, 8, 16, 32)


class VtaOpTemplate(OpTemplate):
    """What the accelerator's templates share: the spec they build for, and inputs passed as
    they are (the program's DRAM layouts block them, not the caller)."""

    def __init__(self, spec: VtaSpec | None = None) -> None:
        self.spec = spec or VtaSpec()

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """The inputs unchanged (the program's DRAM layouts block them, not the caller)."""
        return [np.ascontiguousarray(a) for a in inputs]


class VtaDenseTemplate(VtaOpTemplate):
    """int8 y = requant(relu(x @ w.T + bias)) on the accelerator; workload (M, N, K)."""

    name = "vta_dense"
    fields = ("m", "n", "k")

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        m, n, k = _mnk(shape)
        x = te.placeholder((m, k), "int8", name="x")
        w = te.placeholder((n, k), "int8", name="w")
        bias = te.placeholder((n,), "int32", name="bias")
        r = te.reduce_axis((0, k), name="r")
        acc = te.compute(
            (m, n),
            lambda i, j: te.sum(te.cast("int32", x[i, r]) * te.cast("int32", w[j, r]), axis=r),
            name="acc",
        )
        y = te.compute((m, n), lambda i, j: requant(acc[i, j], bias[j]), name="y")
        return [x, w, bias, y]

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """The host's schedule of the compute (naive: it is the reference); the accelerator's
        is `tiling(config)`, which `program` lowers into instructions."""
        return naive_schedule(args)

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        m, n, k = _mnk(shape)
        return [(m, k), (n, k), (n,)]

    def random_inputs(self, shape: tuple[int, ...], rng: np.random.Generator) -> list[np.ndarray]:
        """int8 x and w over their whole range, int32 bias of a few products' size."""
        m, n, k = _mnk(shape)
        return [
            rng.integers(-128, 128, (m, k), dtype=np.int8),
            rng.integers(-128, 128, (n, k), dtype=np.int8),
            rng.integers(-(1 << 16), 1 << 16, (n,), dtype=np.int32),
        ]

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        x, w, bias = inputs
        return requantize(x.astype(np.int64) @ w.astype(np.int64).T + bias.astype(np.int64))

    def flop(self, shape: tuple[int, ...]) -> float:
        m, n, k = _mnk(shape)
        return 2.0 * m * n * k

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        """Tiles along M (rows), N and K (blocks), clipped to the workload, and vthreads."""
        m, n, k = _mnk(shape)
        nb, kb = -(-n // self.spec.block_out), -(-k // self.spec.block_in)
        return ConfigSpace(
            [
                Knob("tile_m", _clipped(_TILE_M, m)),
                Knob("tile_n", _clipped(_TILE_N, nb)),
                Knob("tile_k", _clipped(_TILE_K, kb)),
                Knob("vthreads", VTHREAD_CHOICES),
            ]
        )

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        """False for a tiling that overflows a buffer or an instruction field."""
        return tiling_problem(*_mnk(shape), tiling(config), self.spec) is None

    def program(self, shape: tuple[int, ...], config: Mapping[str, Any]) -> Program:
        """The accelerator program of `config`.

        Raises:
            ValueError: the tiling cannot run (`worth_measuring` is False for it).
        """
        return gemm_program(*_mnk(shape), tiling(config), SHIFT, self.spec)


def requant(acc: E.Expr, bias: E.Expr) -> E.Expr:
    """The epilogue on one int32 sum: int8(min(max(acc + bias, 0) >> SHIFT, 127))."""
    return te.cast("int8", te.minimum(te.shift_right(te.maximum(acc + bias, 0), _SHIFT_EXPR), 127))


def requantize(acc: np.ndarray) -> np.ndarray:
    """`requant` by numpy on sums that already include the bias (wrapped to int32 first)."""
    return np.minimum(np.maximum(acc.astype(np.int32), 0) >> SHIFT, 127).astype(np.int8)


def tiling(config: Mapping[str, Any]) -> GemmTiling:
    """The GEMM tiling a `vta_dense` config names."""
    return GemmTiling(
        int(config["tile_m"]), int(config["tile_n"]), int(config["tile_k"]),
        int(config["vthreads"]),
    )  # fmt: skip


def accel_artifact(
    programs: Mapping[str, Program], args: Sequence[Tensor], flop: float
) -> Artifact:
    """An ACCEL_PROGRAM artifact holding `programs` (entry symbol -> program), every entry over
    the argument tensors `args` (placeholders are inputs, the last tensor the output)."""
    data = encode_programs(programs)
    specs = tuple(
        ArgSpec(t.name, t.shape, t.dtype, "output" if i == len(args) - 1 else "input")
        for i, t in enumerate(args)
    )
    entries = tuple(Entry(symbol, "", specs, flop) for symbol in programs)
    return Artifact(data, hashlib.sha256(data).hexdigest(), ACCEL_FORMAT, VTA_TARGET, entries)


class AccelTemplate(Protocol):
    """A template whose configs compile to accelerator programs (vta_dense, vta_conv2d)."""

    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]: ...

    def flop(self, shape: tuple[int, ...]) -> float: ...

    def program(self, shape: tuple[int, ...], config: Mapping[str, Any]) -> Program: ...


def build_vta(
    template: AccelTemplate,
    shape: tuple[int, ...],
    configs: Mapping[str, Mapping[str, Any]],
) -> Artifact:
    """One ACCEL_PROGRAM artifact with a program per config (entry symbol -> config).

    Raises:
        ValueError: a config's tiling cannot run.
    """
    programs = {symbol: template.program(shape, c) for symbol, c in configs.items()}
    return accel_artifact(programs, template.tensors(shape, None), template.flop(shape))


def _mnk(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"vta_dense takes a workload (M, N, K) of positive sizes, got {shape}")
    m, n, k = shape
    return m, n, k


def _clipped(choices: tuple[int, ...], size: int) -> tuple[int, ...]:
    """`choices` up to `size`, plus `size` itself when it is smaller than the largest."""
    out = [c for c in choices if c < size]
    return (*out, size) if size <= choices[-1] else tuple(choices)

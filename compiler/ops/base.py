"""The interface every op template provides to the tuner and to tests.

`Template` is what the tuner needs. `OpTemplate` adds what a harness needs to check a built
kernel against numpy whatever layout a config picks: logical inputs in the op's natural layout
(NCHW, OIHW, [K][N]) go through `pack_inputs` into the kernel's argument layout, and
`unpack_output` turns the kernel's output back, to compare with `reference(*logical_inputs)`.
`reference_kernel` gives a config's argument layout scheduled naively, for checking a tuned
kernel on the device (see `reference`).

Threads: a template with `parallel_choices` has one more knob, `parallel` (PARALLEL_KNOB), in
the space of a task for more than one thread (`threaded_space`): which of its outer loops run on
OpenMP's threads ("none": today's single-threaded schedule). The one-thread space has no such
knob, so it is the same space (sizes and indices) as before the knob existed, its records keep
their meaning, and a one-thread device never spends trials on it. A config without the knob is
"none". A parallel loop is always a data loop outside every reduction split across threads
(the schedule refuses to parallelize a reduce axis), so threads never add into one output.
The thread count itself is the run's (OpenMP's OMP_NUM_THREADS / omp_set_num_threads), not
the kernel's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from compiler.ops.reference import naive_schedule
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.schedule.schedule import Schedule, Stage
from compiler.te.tensor import IterVar, PlaceholderOp, Tensor
from compiler.toolchain import get_target


class Template(Protocol):
    """A compute definition with a numpy reference and a tunable schedule.

    `shape` is the op's workload tuple (for matmul, (M, N, K)). `instantiate` must give a
    correct schedule for every config of `config_space(shape)`; configs change speed only.
    """

    name: str

    def compute(self, shape: tuple[int, ...]) -> tuple[Tensor, ...]:
        """The op's tensors, inputs first, output last."""
        ...

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """The output for `inputs`, by numpy."""
        ...

    def flop(self, shape: tuple[int, ...]) -> float: ...

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace: ...

    def instantiate(self, shape: tuple[int, ...], config: Config) -> tuple[Schedule, list[Any]]:
        """The scheduled computation and its argument tensors, in call order."""
        ...


class OpTemplate:
    """Base of the op library's templates: the Template protocol plus layout conversion.

    Subclasses set `name` and `fields` (the workload's field names) and implement `tensors`,
    `schedule`, `reference`, `flop`, `config_space` and `logical_shapes`; templates whose
    argument layout depends on the config override `pack_inputs` and `unpack_output`, and name
    the knobs that decide that layout in `layout_knobs`.
    """

    name: str = ""
    fields: tuple[str, ...] = ()
    # The knobs that decide the argument layout (shapes and meaning of the arguments): `tensors`
    # MUST give the same arguments for two configs that agree on these, whatever else they set.
    layout_knobs: tuple[str, ...] = ()

    # -- what subclasses provide ------------------------------------------------------------
    def tensors(self, shape: tuple[int, ...], config: Config | None) -> list[Tensor]:
        """Argument tensors for `config` (None: the default layout), inputs first, output last."""
        raise NotImplementedError

    def schedule(self, shape: tuple[int, ...], config: Config, args: list[Tensor]) -> Schedule:
        """The schedule of `args`' computation for `config`."""
        raise NotImplementedError

    def logical_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Shapes of the inputs of `reference`, in the op's natural layout."""
        raise NotImplementedError

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def flop(self, shape: tuple[int, ...]) -> float:
        raise NotImplementedError

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        raise NotImplementedError

    # -- derived ----------------------------------------------------------------------------
    def reference_for(self, shape: tuple[int, ...], *inputs: np.ndarray) -> np.ndarray:
        """The natural-layout output for logical `inputs` of workload `shape`."""
        return self.reference(*inputs)

    def compute(self, shape: tuple[int, ...]) -> tuple[Tensor, ...]:
        """The op's tensors in its default layout, inputs first, output last."""
        return tuple(self.tensors(shape, None))

    def instantiate(self, shape: tuple[int, ...], config: Config) -> tuple[Schedule, list[Any]]:
        """The scheduled computation and its argument tensors, in call order."""
        args = self.tensors(shape, config)
        return self.schedule(shape, config, args), list(args)

    def layout_config(self, config: Mapping[str, Any]) -> Config:
        """`config` reduced to its layout knobs (index -1: it names the layout, not a point of
        the space); `tensors` of it gives `config`'s arguments with the plainest compute."""
        return Config({k: config[k] for k in self.layout_knobs if k in config}, -1)

    def reference_kernel(
        self, shape: tuple[int, ...], config: Mapping[str, Any]
    ) -> tuple[Schedule, list[Tensor]]:
        """`config`'s argument tensors (the shapes, dtypes and order of `instantiate`'s) under
        the naive schedule; the same for every config with `config`'s layout knobs."""
        args = self.tensors(shape, self.layout_config(config))
        return naive_schedule(args), args

    def parallel_choices(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The `parallel` knob's choices for more than one thread, "none" first (default: none,
        so the template has no such knob); the first other one is the untuned default."""
        return ()

    def worth_measuring(self, shape: tuple[int, ...], config: Config, target: str = "host") -> bool:
        """Whether `config` is plausible on `target` (e.g. its register tile fits the registers).

        Every config is correct; this only lets a search skip those sure to be slow.
        """
        return True

    def internal_pad(self, shape: tuple[int, ...]) -> int:
        """Zero rows and columns the kernel adds around its input itself, on every side (default:
        none; a convolution's input arrives pre-padded by the workload's pad)."""
        return 0

    def extra_padding(self, shape: tuple[int, ...], config: Config | None) -> tuple[int, int]:
        """Rows and columns of zeros a convolution reads below and right of its workload's
        padded input: a template computing whole output tiles reads past the image's edge
        (default: none)."""
        return 0, 0

    def random_inputs(self, shape: tuple[int, ...], rng: np.random.Generator) -> list[np.ndarray]:
        """Logical inputs: float32 in [-1, 1)."""
        return [
            rng.uniform(-1.0, 1.0, size=s).astype(np.float32) for s in self.logical_shapes(shape)
        ]

    def pack_inputs(
        self, shape: tuple[int, ...], config: Config | None, inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """Logical inputs in the kernel's argument layout for `config` (default: unchanged)."""
        return [np.ascontiguousarray(x, dtype=np.float32) for x in inputs]

    def unpack_output(
        self, shape: tuple[int, ...], config: Config | None, output: np.ndarray
    ) -> np.ndarray:
        """The kernel's output in the op's natural layout (default: unchanged)."""
        return output


PARALLEL_KNOB = "parallel"
NO_PARALLEL = "none"


def parallel_of(config: Mapping[str, Any] | None) -> str:
    """The `parallel` knob's value of `config` ("none" for a config without it)."""
    if config is None:
        return NO_PARALLEL
    return str(config.get(PARALLEL_KNOB, NO_PARALLEL))


def parallelize(st: Stage, loops: Sequence[IterVar], count: int) -> list[IterVar]:
    """Fuse the first `count` of `loops` (a stage's adjacent data loops, outermost first) into
    one loop and run it on OpenMP's threads; `loops` with the fused one in their place."""
    first = st.fuse(*loops[:count]) if count > 1 else loops[0]
    st.parallel(first)
    return [first, *loops[count:]]


def threaded_space(template: Template, shape: tuple[int, ...], threads: int = 1) -> ConfigSpace:
    """The template's config space for kernels run on `threads` threads: `config_space(shape)`,
    plus the `parallel` knob (last) when `threads` > 1 and the template has one.

    Raises:
        ValueError: `threads` is below 1, or the workload is bad (as `config_space`).
    """
    if threads < 1:
        raise ValueError(f"a kernel runs on at least one thread, not {threads}")
    space = template.config_space(shape)
    choices = getattr(template, "parallel_choices", None)
    options = choices(shape) if threads > 1 and choices is not None else ()
    if len(options) < 2:
        return space
    return ConfigSpace([*space.knobs, Knob(PARALLEL_KNOB, tuple(options))])


# zmm registers a register tile's accumulators may take: 32 minus the operands of the FMAs.
MAX_ACCUMULATORS = 28
# Registers a micro-kernel keeps for the operands of its FMAs (broadcasts, weight vectors).
OPERAND_REGISTERS = 4


@dataclass(frozen=True)
class RegisterFile:
    """The SIMD registers a target's register tiles are sized for."""

    lanes: int  # float32 lanes of one vector register
    registers: int

    @property
    def max_accumulators(self) -> int:
        return self.registers - OPERAND_REGISTERS


@functools.cache
def register_file(target: str = "host") -> RegisterFile:
    """The vector register file of `target` ("host" or a toolchain target name).

    AVX-512: 32 registers of 16 lanes; AVX2: 16 of 8; NEON: 32 of 4. Templates count a tile's
    accumulators in these registers, so a tile that fits an AVX-512 core can be rejected as
    spilling on an AVX2 one.
    """
    tgt = get_target(target)
    return RegisterFile(lanes=max(1, tgt.vector_bytes // 4), registers=tgt.vector_registers)


def register_tile_fits(
    accumulators: int, most_possible: int, limit: int = MAX_ACCUMULATORS
) -> bool:
    """A tile of `accumulators` vectors neither spills nor leaves the FMA pipes idle.

    Two FMA units with 4-cycle latency need at least 8 independent accumulators, unless the
    workload is too small to have that many (`most_possible`); `limit` leaves registers for
    the operands (a micro-kernel with more live weight vectors needs a lower one).
    """
    return min(8, most_possible) <= accumulators <= limit


def output_arrays(args: Sequence[Tensor]) -> list[np.ndarray]:
    """Zeroed arrays for the computed (non-placeholder) tensors of `args`, in order."""
    return [np.zeros(t.shape, dtype=t.dtype) for t in args if not isinstance(t.op, PlaceholderOp)]

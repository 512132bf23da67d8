"""Run a built model natively in this process, and its onnxruntime peer, to compare latencies.

Used by `kiln demo` and `benchmarks/models.py`.

`NativeModel` loads a `ModelArtifact`'s shared object with ctypes, owns its params, a 64-byte
aligned workspace and output buffers, and calls the C entry `kiln_model_run` (see
`compiler/graph/build_model.py` for its ABI) with argument arrays packed once, so a timed call
costs one ctypes call over the model's own work (`benchmarks/models.py` times its kernels one
by one through their timing entries).
`OrtPeer` is onnxruntime on one intra-op and one inter-op thread, sequential, all graph
optimizations. `loop_seconds` times any callable the same way for both, and
`versus_onnxruntime` is the one path from builds to figures that the demo and the benchmark
share (one core, session made there, outputs checked, interleaved rounds).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import onnx

from compiler.graph.build_model import PARAM_ADDRESS, ModelArtifact, ModelPlan
from compiler.graph.model_kernels import Step

ALIGNMENT = 64  # bytes: what `kiln_model_run` requires of the workspace


def aligned_zeros(nbytes: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """A zeroed uint8 array of `nbytes` (at least 1) starting on an `alignment` boundary."""
    raw = np.zeros(max(nbytes, 1) + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + max(nbytes, 1)]


def _c_dtype(dtype: str) -> np.dtype:
    """Bool values cross the C ABI as int32."""
    return np.dtype(np.int32 if dtype == "bool" else dtype)


def _pointers(arrays: list[np.ndarray]) -> ctypes.Array[ctypes.c_void_p]:
    return (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])


class NativeModel:
    """A loaded model with fixed feeds: `run()` returns the outputs, `call()` just runs."""

    def __init__(self, model: ModelArtifact, feeds: Mapping[str, np.ndarray]) -> None:
        self.model = model
        # dlopen keeps the mapping: the file may go once the library is loaded.
        with tempfile.NamedTemporaryFile(suffix=".so") as so:
            so.write(model.artifact.data)
            so.flush()
            self.lib = ctypes.CDLL(so.name)
        self._fn = self.lib[model.entry]
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)] * 2 + [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        self._fn.restype = ctypes.c_int32
        self.inputs = []
        for spec in model.inputs:
            value = np.ascontiguousarray(feeds[spec.name]).astype(_c_dtype(spec.dtype))
            if value.shape != spec.shape:
                raise ValueError(f"input {spec.name}: shape {value.shape}, expected {spec.shape}")
            self.inputs.append(value)
        self.outputs = [np.zeros(s.shape, _c_dtype(s.dtype)) for s in model.outputs]
        self._param_copies: list[np.ndarray] = []  # only for a library without the blob's table
        self.param_addresses = self._embedded_params()
        self.workspace = aligned_zeros(model.workspace_bytes)
        self._args = (
            _pointers(self.inputs),
            _pointers(self.outputs),
            ctypes.c_void_p(self.workspace.ctypes.data),
            (ctypes.c_void_p * max(len(self.param_addresses), 1))(*self.param_addresses),
        )

    def _embedded_params(self) -> list[int]:
        """The params' addresses in the blob embedded in the shared object (`kiln_model_param`),
        where the packed entry an agent runs reads them; copies in numpy arrays only for a
        library built before it had them.

        Where the weights lie changes the model's speed: on the Xeon of stop 40 (Linux 6.18,
        ext4 large folios) the embedded blob was mapped with 2 MB pages while numpy put each
        param below 4 MB in 4 KB pages of its own, and the same ResNet-18 build ran 1.07x
        (warm) to 1.11x (cold) faster on the embedded params, interleaved in one process: why the
        agent's figure of a build read up to 14% under the in-process one."""
        try:
            address = self.lib[PARAM_ADDRESS]
        except AttributeError:
            self._param_copies = [np.ascontiguousarray(p) for p in self.model.params]
            return [p.ctypes.data for p in self._param_copies]
        address.argtypes = [ctypes.c_int32]
        address.restype = ctypes.c_void_p
        found = [address(i) for i in range(len(self.model.params))]
        if any(not a for a in found) or address(len(found)):
            raise ValueError(
                f"{self.model.entry}: the library embeds other params than the artifact lists"
            )
        return [int(a) for a in found]

    def call(self) -> None:
        rc = self._fn(*self._args)
        if rc != 0:
            raise RuntimeError(f"{self.model.entry} returned {rc}")

    def step_args(self, plan: ModelPlan, step: Step) -> ctypes.Array[ctypes.c_void_p]:
        """The argument array of one kernel of `plan` (the plan this model was built from):
        the address of each value the step reads and writes, a model input or output, a
        param, or its place in the planned workspace. For timing kernels one by one."""
        g = plan.graph
        addresses = []
        for v in (*step.reads, *step.writes):
            if v in g.inputs:
                addresses.append(self.inputs[g.inputs.index(v)].ctypes.data)
            elif v in g.outputs:
                addresses.append(self.outputs[g.outputs.index(v)].ctypes.data)
            elif v in plan.values.constants:
                addresses.append(self.param_addresses[plan.params.index(v)])
            else:
                addresses.append(self.workspace.ctypes.data + plan.memory.offset(v))
        return (ctypes.c_void_p * max(len(addresses), 1))(*addresses)

    def run(self) -> list[np.ndarray]:
        """One run; copies of the outputs (bool outputs as bool)."""
        self.call()
        return [
            (o != 0) if s.dtype == "bool" else o.copy()
            for o, s in zip(self.outputs, self.model.outputs, strict=True)
        ]


class OrtPeer:
    """onnxruntime on the CPU provider: `threads` intra-op threads (default 1), 1 inter-op
    thread, sequential, ORT_ENABLE_ALL."""

    def __init__(
        self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], threads: int = 1
    ) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        self.feeds = dict(feeds)

    def call(self) -> None:
        self.session.run(None, self.feeds)

    def run(self) -> list[np.ndarray]:
        return [np.asarray(o) for o in self.session.run(None, self.feeds)]


def seeded_feeds(model: onnx.ModelProto, seed: int, int_high: int = 2) -> dict[str, np.ndarray]:
    """Seeded inputs of a model: integers in [0, int_high) for int64 inputs, N(0, 1) for floats."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            out[value.name] = rng.integers(0, int_high, shape, dtype=np.int64)
        else:
            out[value.name] = rng.standard_normal(shape, dtype=np.float32)
    return out


def output_mismatch(ours: list[np.ndarray], ref: list[np.ndarray], rtol: float) -> str | None:
    """Why `ours` differ from `ref` (their number, a shape, a NaN or infinity where the reference
    has none, or max abs error over rtol x max |ref|), or None."""
    if len(ours) != len(ref):
        return f"{len(ours)} outputs, the reference has {len(ref)}"
    for i, (got, want) in enumerate(zip(ours, ref, strict=True)):
        if got.shape != want.shape:
            return f"output {i} shape {got.shape} != {want.shape}"
        if not want.size:
            continue
        diff = np.abs(got.astype(np.float64) - want)
        err = float(diff.max())
        scale = float(np.abs(want).max())
        if not np.isfinite(err) or err > rtol * max(scale, 1e-30):
            return f"output {i} max error {err:.3g} over {rtol:g} x {scale:.3g}"
    return None


def loop_seconds(call: Callable[[], object], min_round_s: float) -> float:
    """Mean seconds per call over a loop lasting at least `min_round_s`, after one warm-up call."""
    call()
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            call()
        elapsed = time.perf_counter() - start
        if elapsed >= min_round_s:
            return elapsed / number
        number = max(number + 1, int(number * 1.2 * min_round_s / max(elapsed, 1e-6)))


def interleaved_rounds(
    calls: Sequence[tuple[str, Callable[[], object]]],
    rounds: int,
    min_round_s: float,
    timers: Sequence[tuple[str, Callable[[], float]]] = (),
) -> dict[str, list[float]]:
    """Seconds per call of each labelled call, one `loop_seconds` per round: `rounds` rounds
    timing every call, the order reversed every other round so none always follows the same
    neighbour (what every peer comparison here does). `timers` take their turn in the same
    rounds but time themselves: each returns seconds per call measured elsewhere (a device's
    own loop), so a figure from another process meets the same spells of a noisy host."""
    entries: list[tuple[str, Callable[[], float]]] = [
        (label, functools.partial(loop_seconds, call, min_round_s)) for label, call in calls
    ]
    entries += timers
    labels = [label for label, _ in entries]
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be unique, got {labels}")
    times: dict[str, list[float]] = {label: [] for label, _ in entries}
    for round_ in range(rounds):
        for label, timer in entries if round_ % 2 == 0 else entries[::-1]:
            times[label].append(timer())
    return times


class OutputMismatch(Exception):
    """A build's outputs differ from onnxruntime's: `label` names the build, the message why."""

    def __init__(self, label: str, why: str) -> None:
        super().__init__(f"the {label} build's outputs differ from onnxruntime's: {why}")
        self.label = label
        self.why = why


@dataclass
class VersusOrt:
    """What `versus_onnxruntime` measured: seconds per call of each build and of onnxruntime,
    one per round, on `core`; onnxruntime's outputs (`reference`) and the loaded builds
    (`natives`, for a profile)."""

    ours: dict[str, list[float]]
    ort: list[float]
    core: int
    reference: list[np.ndarray] = field(default_factory=list)
    natives: dict[str, NativeModel] = field(default_factory=dict)
    timed: dict[str, list[float]] = field(default_factory=dict)

    def timed_s(self, label: str) -> float | None:
        """The median of a timer's finite rounds (None: it measured nothing)."""
        finite = [t for t in self.timed.get(label, []) if math.isfinite(t) and t > 0]
        return statistics.median(finite) if finite else None

    def median_s(self, label: str) -> float:
        return statistics.median(self.ours[label])

    @property
    def ort_s(self) -> float:
        return statistics.median(self.ort)

    def ratio(self, label: str) -> float:
        """onnxruntime's time over the build's (> 1: the build is faster)."""
        return self.ort_s / self.median_s(label)


@contextmanager
def one_core(core: int | None = None) -> Iterator[int]:
    """This thread (and any thread it starts) on one core, by default the last it may use, for
    the block; its former cores after."""
    allowed = os.sched_getaffinity(0)
    chosen = max(allowed) if core is None else core
    os.sched_setaffinity(0, {chosen})
    try:
        yield chosen
    finally:
        os.sched_setaffinity(0, allowed)


def versus_onnxruntime(
    proto: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    builds: Mapping[str, ModelArtifact],
    rounds: int,
    min_round_s: float,
    rtol: float,
    core: int | None = None,
    timers: Sequence[tuple[str, Callable[[], float]]] = (),
) -> VersusOrt:
    """Time `builds` against onnxruntime the one way `kiln demo` and `benchmarks/models.py` both
    do, so the same build gives the same ratio in both; `timers` (the demo's device timing of
    its tuned build) take their turn in the same rounds (`interleaved_rounds`).

    Everything happens on one core (`one_core`): onnxruntime's session is created there, each
    build loaded there, every output checked against onnxruntime's (OutputMismatch), then
    `rounds` rounds, each timing every build and onnxruntime with `loop_seconds` (the order
    reversed every other round, so none always follows the same neighbour).

    Raises:
        OutputMismatch: a build's outputs differ from onnxruntime's by more than `rtol`.
    """
    with one_core(core) as pinned:
        peer = OrtPeer(proto, feeds)
        reference = peer.run()
        natives = {label: NativeModel(model, feeds) for label, model in builds.items()}
        for label, native in natives.items():
            why = output_mismatch(native.run(), reference, rtol)
            if why is not None:
                raise OutputMismatch(label, why)
        calls: list[tuple[str, Callable[[], object]]] = [
            *((label, native.call) for label, native in natives.items()),
            ("onnxruntime", peer.call),
        ]
        times = interleaved_rounds(calls, rounds, min_round_s, timers)
    ort = times.pop("onnxruntime")
    timed = {label: times.pop(label) for label, _ in timers}
    return VersusOrt(times, ort, pinned, reference, natives, timed)

"""Peers measured beside our kernels in the same run: numpy's BLAS for matmul.

`interleaved_matmul_seconds` times a built matmul-like kernel (dense with packed B, or plain
matmul) and numpy's matmul side by side: in one child process whose BLAS has one thread (set
before numpy loads), pinned to one core, the kernel's shared object loaded with ctypes, its
output checked against numpy's on the same inputs, then rounds of ours, numpy, ours, numpy, ...
with the order reversed every other round, so machine noise falls on both alike instead of
becoming the ratio.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compiler.artifact import Artifact

_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


# -- ours and numpy interleaved in one process ------------------------------------------------
# The child's exit status when our kernel is refused (its arguments or its answer are wrong).
_REFUSED = 3
_CHILD = "import sys; from tuner.peer import _interleaved_child; sys.exit(_interleaved_child())"


class KernelMismatch(RuntimeError):
    """Our kernel was refused before timing: its arguments do not match the config's packing of
    the inputs, it returned an error code, or its output differs from numpy's matmul."""


@dataclass(frozen=True)
class Interleaved:
    """What `interleaved_matmul_seconds` measured: seconds per call of our kernel and of numpy's
    matmul, one of each per round, on `core`; `max_error` is our output's largest difference
    from numpy's over numpy's largest magnitude."""

    ours_s: tuple[float, ...]
    numpy_s: tuple[float, ...]
    core: int
    max_error: float

    @property
    def rounds(self) -> int:
        return len(self.ours_s)

    @property
    def ours_median_s(self) -> float:
        return statistics.median(self.ours_s)

    @property
    def numpy_median_s(self) -> float:
        return statistics.median(self.numpy_s)

    @property
    def ratio(self) -> float:
        """numpy's median time over ours (> 1: ours is faster); = our GFLOP/s over numpy's."""
        return self.numpy_median_s / self.ours_median_s


def interleaved_matmul_seconds(
    artifact: Artifact,
    op: str,
    shape: Sequence[int],
    knobs: Mapping[str, Any],
    rounds: int = 7,
    min_round_s: float = 0.1,
    core: int | None = None,
    rtol: float = 1e-4,
    seed: int = 0,
    timeout_s: float | None = None,
) -> Interleaved:
    """Time `artifact`'s first entry (the kernel of template `op` at `shape` with config `knobs`)
    and numpy's float32 matmul interleaved, in one child process on one thread and one core.

    The child (BLAS thread variables set to 1 before numpy loads) pins itself to `core` (default:
    the last core this process may use), draws the template's logical inputs A (M, K) and B (K, N)
    from `seed`, packs them with the template's own `pack_inputs` for `knobs` (dense packs B into
    panels), checks them against the entry's argument specs, loads the shared object with ctypes
    and checks the unpacked output against `np.matmul(A, B)` (max abs error within `rtol` of
    numpy's largest magnitude). Then `rounds` rounds, each timing ours and numpy's with the same
    loop (`tuner.network.timing.loop_seconds`, at least `min_round_s` each, one Python call per
    kernel call on both sides), ours first in even rounds and numpy first in odd ones; the
    output is checked again after the last round.

    Raises:
        KernelMismatch: the kernel was refused (wrong arguments, error code or answer).
        RuntimeError: the child failed otherwise, or ran past `timeout_s` (default: a minute
            plus four times the rounds' own time) and was killed.
        ValueError: rounds below 1 or min_round_s not positive.
    """
    if rounds < 1 or not min_round_s > 0:
        raise ValueError(f"rounds must be >= 1 and min_round_s > 0, got {rounds}, {min_round_s}")
    if core is None:
        core = max(os.sched_getaffinity(0))
    if timeout_s is None:
        timeout_s = 60.0 + 4.0 * 2 * rounds * min_round_s
    entry = artifact.entries[0]
    with tempfile.TemporaryDirectory(prefix="kiln-peer-") as tmp:
        path = Path(tmp) / "kernel.so"
        path.write_bytes(artifact.data)
        spec = {
            "path": str(path),
            "symbol": entry.symbol,
            "args": [
                {"name": a.name, "shape": list(a.shape), "dtype": a.dtype, "role": a.role}
                for a in entry.args
            ],
            "op": op,
            "shape": [int(d) for d in shape],
            "knobs": dict(knobs),
            "rounds": rounds,
            "min_round_s": min_round_s,
            "core": core,
            "rtol": rtol,
            "seed": seed,
        }
        env = dict(os.environ, **{v: "1" for v in _THREAD_VARS})
        try:
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, json.dumps(spec)],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"timing {entry.symbol} against numpy did not finish within {timeout_s:.0f} s "
                "(the child was killed)"
            ) from None
    if out.returncode == _REFUSED:
        raise KernelMismatch(json.loads(out.stdout.strip().splitlines()[-1])["refused"])
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-5:])
        raise RuntimeError(
            f"timing {entry.symbol} against numpy failed (child exit {out.returncode}): {tail}"
        )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return Interleaved(
        tuple(float(s) for s in found["ours_s"]),
        tuple(float(s) for s in found["numpy_s"]),
        int(found["core"]),
        float(found["max_error"]),
    )


def _interleaved_child() -> int:
    """The child of `interleaved_matmul_seconds`: its spec in argv[1], its result on stdout."""
    spec = json.loads(sys.argv[1])
    core = int(spec["core"])
    os.sched_setaffinity(0, {core})  # before numpy loads and starts its (one) BLAS thread

    import ctypes

    import numpy as np

    from compiler import ops
    from compiler.ops.base import OpTemplate
    from compiler.ops.space import Config
    from tuner.network.timing import interleaved_rounds, output_mismatch

    def refuse(why: str) -> int:
        print(json.dumps({"refused": why}))
        return _REFUSED

    shape = tuple(int(d) for d in spec["shape"])
    template = ops.get_template(spec["op"])
    if not isinstance(template, OpTemplate):
        raise TypeError(f"{spec['op']} is not an op-library template (no input packing)")
    config = Config(spec["knobs"], -1)
    logical = template.random_inputs(shape, np.random.default_rng(int(spec["seed"])))
    if len(logical) != 2 or any(x.ndim != 2 for x in logical):
        raise ValueError(f"{spec['op']} is not a matmul: its inputs are not two matrices")
    a, b = logical
    expected = np.matmul(a, b)
    packed = template.pack_inputs(shape, config, logical)
    specs = spec["args"]
    input_specs = [s for s in specs if s["role"] == "input"]
    if len(packed) != len(input_specs):
        return refuse(
            f"the kernel takes {len(input_specs)} inputs, the packing gives {len(packed)}"
        )
    for i, (array, s) in enumerate(zip(packed, input_specs, strict=True)):
        if tuple(array.shape) != tuple(s["shape"]) or array.dtype != np.dtype(s["dtype"]):
            return refuse(
                f"input {i} ({s['name']}): the kernel takes {tuple(s['shape'])} {s['dtype']}, "
                f"the config's packing gives {tuple(array.shape)} {array.dtype}"
            )
    given = iter(packed)
    arrays = [
        np.ascontiguousarray(next(given))
        if s["role"] == "input"
        else np.zeros(s["shape"], s["dtype"])
        for s in specs
    ]
    outputs = [x for x, s in zip(arrays, specs, strict=True) if s["role"] == "output"]
    if len(outputs) != 1:
        return refuse(f"the kernel has {len(outputs)} outputs, a matmul one")
    lib = ctypes.CDLL(spec["path"])  # kept alive with the function bound from it
    run = lib[spec["symbol"]]  # the packed entry ABI: int32_t f(void **args)
    run.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    run.restype = ctypes.c_int32
    pointers = (ctypes.c_void_p * max(len(arrays), 1))(*[x.ctypes.data for x in arrays])
    rtol = float(spec["rtol"])

    def check(when: str) -> str | None:
        rc = run(pointers)
        if rc != 0:
            return f"{when}: the kernel returned error code {rc}"
        try:
            got = template.unpack_output(shape, config, outputs[0])
        except ValueError as exc:
            return f"{when}: its output does not unpack to {expected.shape}: {exc}"
        why = output_mismatch([np.asarray(got)], [expected], rtol)
        return None if why is None else f"{when}: the kernel's output differs from numpy's: {why}"

    why = check("before timing")
    if why is not None:
        return refuse(why)
    c = np.empty_like(expected)
    calls = [("ours", lambda: run(pointers)), ("numpy", lambda: np.matmul(a, b, out=c))]
    times = interleaved_rounds(calls, int(spec["rounds"]), float(spec["min_round_s"]))
    why = check("after timing")
    if why is not None:
        return refuse(why)
    got = np.asarray(template.unpack_output(shape, config, outputs[0]), np.float64)
    scale = max(float(np.abs(expected).max()), 1e-30)
    print(
        json.dumps(
            {
                "ours_s": times["ours"],
                "numpy_s": times["numpy"],
                "core": core,
                "max_error": float(np.abs(got - expected).max()) / scale,
            }
        )
    )
    return 0

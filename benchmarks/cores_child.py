"""The timed halves of `benchmarks/cores.py` that need a fresh process per thread count.

OpenBLAS reads OPENBLAS_NUM_THREADS and libgomp OMP_NUM_THREADS / OMP_PROC_BIND / OMP_PLACES /
GOMP_SPINCOUNT once, when they load; so each sgemm thread count, and the model section, runs in
its own process (`python benchmarks/cores_child.py sgemm|models ...`), which sets them before
numpy loads and prints one JSON line last. `cores.py` starts these and reads that line.

- sgemm N THREADS: the `dense` template against numpy's matmul (OpenBLAS on THREADS threads).
  Candidates: the tuned one-thread config of `kernels_best.json` for this machine's target
  class (`benchmarks/kernels.py`'s records), with, on more than one thread, each `parallel`
  choice and a few row-block sizes; and, given RECORDS, the best config tuned on THREADS
  threads there (`kiln tune-op dense --shape N,N,N --cores 0-1 --records R`; records of
  another thread count never apply). A quick round (the candidates interleaved, three rounds,
  each judged by its median) picks the fastest, which then alternates with numpy for the rounds
  (the time of a round: its median call).
- models THREADS NAMES: each model built for one thread and for THREADS (tuned configs of
  --records where they exist for that count, else the defaults, which on THREADS run their
  outermost output loops in parallel), checked against onnxruntime, then ours and
  onnxruntime (intra_op_num_threads the same) at both counts alternate for the rounds.
  onnxruntime's sessions are created before our first kernel loads libgomp, which binds the
  main thread to its first place: threads created after would inherit that one core.
"""

from __future__ import annotations

import os
import sys


def _set_threads(threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)
    os.environ.setdefault("OMP_PROC_BIND", "true")
    os.environ.setdefault("OMP_PLACES", "cores")
    # as a device agent's child polls (device_agent/executor.py's OPENMP_SPIN_COUNT says why)
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")


if __name__ == "__main__" and len(sys.argv) > 2:
    _set_threads(int(sys.argv[3] if sys.argv[1] == "sgemm" else sys.argv[2]))

import ctypes  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compiler import ops, toolchain  # noqa: E402
from compiler.build import Kernel, build_source_many  # noqa: E402
from compiler.ops.base import output_arrays, threaded_space  # noqa: E402
from compiler.ops.space import Config  # noqa: E402

BEST_FILE = Path(__file__).resolve().parent / "kernels_best.json"
# Row blocks (m_tiles) tried beside the tuned one on several threads: a block of A is one
# chunk of the parallel loop, so fewer rows per block give the threads more chunks.
M_TILES_TRIED = (16, 0)
PICK_ROUNDS = 3  # interleaved rounds of the quick round that picks among several candidates


def median_call_s(call: Callable[[], object], min_s: float) -> float:
    """The median of single timed calls over at least `min_s` (after one warm-up call)."""
    call()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_s or len(times) < 3:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleave(
    calls: Sequence[tuple[str, Callable[[], object]]], rounds: int, min_s: float
) -> dict[str, list[float]]:
    """Each call's median per round, the order reversed every other round."""
    out: dict[str, list[float]] = {label: [] for label, _ in calls}
    for r in range(rounds):
        for label, call in calls if r % 2 == 0 else calls[::-1]:
            out[label].append(median_call_s(call, min_s))
    return out


def _tuned_knobs(n: int) -> dict[str, Any] | None:
    key = f"{toolchain.get_target('host').name}|dense|{n},{n},{n}"
    best = json.loads(BEST_FILE.read_text()).get(key) if BEST_FILE.exists() else None
    return dict(best["knobs"]) if best else None


def sgemm_candidates(
    n: int, threads: int, records: str | None = None
) -> tuple[list[Config], list[str]]:
    """The configs to try, and where each came from."""
    t = ops.op_templates()["dense"]
    shape = (n, n, n)
    space = threaded_space(t, shape, threads)
    knobs = _tuned_knobs(n)
    source = "kernels_best.json (tuned on 1 thread)"
    if knobs is None:
        source = "the first plausible config (no tuned one for this target)"
        plausible = (c for c in map(space.get, range(len(space))) if t.worth_measuring(shape, c))
        knobs = dict(next(plausible))
    out: list[Config] = []
    sources: list[str] = []
    if threads == 1:
        out.append(space.get(space.index_of({k.name: knobs[k.name] for k in space.knobs})))
        sources.append(source)
    else:
        for m_tiles in dict.fromkeys((knobs["m_tiles"], *M_TILES_TRIED)):
            for parallel in ("outer", "fused"):
                config = space.get(
                    space.index_of({**knobs, "m_tiles": m_tiles, "parallel": parallel})
                )
                if t.worth_measuring(shape, config):
                    out.append(config)
                    sources.append(source + " + parallel / m_tiles")
    recorded = _recorded_knobs(n, threads, records, len(space)) if records else None
    if recorded is not None:
        config = space.get(space.index_of(recorded))
        if config not in out:
            out.append(config)
            sources.append(f"the records' best on {threads} thread(s)")
    return out, sources


def _recorded_knobs(n: int, threads: int, records: str, space_size: int) -> dict[str, Any] | None:
    """The knobs of the best dense n^3 config in `records` tuned on `threads` threads for this
    machine's target class in today's config space (of `space_size`), or None."""
    from tuner.records import open_store
    from tuner.records import record as rec

    target = rec.records_target(toolchain.get_target("host").name, threads)
    workload = rec.Workload("dense", (n, n, n))
    store = open_store(records)
    try:
        best = rec.apply_best(store.load(workload, target), workload, target, space_size)
    finally:
        store.close()
    return None if best is None else dict(best.knobs)


def sgemm(
    n: int, threads: int, rounds: int, min_s: float, records: str | None = None
) -> dict[str, Any]:
    t = ops.op_templates()["dense"]
    shape = (n, n, n)
    configs, sources = sgemm_candidates(n, threads, records)
    kernels = []
    for i, config in enumerate(configs):
        sch, args = t.instantiate(shape, config)
        kernels.append(Kernel(sch, args, f"sgemm{i}"))
    lib = ctypes.CDLL(str(toolchain.compile_shared(build_source_many(kernels)).path))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    ref = a @ b
    calls = []
    keep: list[Any] = []
    for i, (config, kernel) in enumerate(zip(configs, kernels, strict=True)):
        arrays = [*t.pack_inputs(shape, config, [a, b]), *output_arrays(kernel.args)]
        fn = lib[f"sgemm{i}"]
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = ctypes.c_int32
        pointers = (ctypes.c_void_p * len(arrays))(*(x.ctypes.data for x in arrays))
        if fn(pointers) != 0:
            raise RuntimeError(f"sgemm {config} failed")
        got = t.unpack_output(shape, config, arrays[-1])
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        if err > 1e-4:
            raise AssertionError(f"sgemm {n} {dict(config)}: relative error {err:.2g}")
        keep.append((arrays, pointers))
        calls.append((fn, pointers))
    pick = 0
    if len(calls) > 1:
        # the candidates interleaved for PICK_ROUNDS rounds, each judged by its median: one
        # round each let a moment's slowdown on this shared machine decide the pick
        quick = interleave(
            [(str(i), functools.partial(f, p)) for i, (f, p) in enumerate(calls)],
            PICK_ROUNDS,
            min_s / 2,
        )
        pick = min(range(len(calls)), key=lambda i: statistics.median(quick[str(i)]))
    fn, pointers = calls[pick]
    pair = [("ours", lambda: fn(pointers)), ("numpy", lambda: np.matmul(a, b))]
    times = interleave(pair, rounds, min_s)
    ratio = statistics.median(x / y for x, y in zip(times["numpy"], times["ours"], strict=True))
    return {
        "n": n,
        "threads": threads,
        "config": dict(configs[pick]),
        "source": sources[pick] + (" (picked by a quick round)" if len(calls) > 1 else ""),
        "ours_s": statistics.median(times["ours"]),
        "numpy_s": statistics.median(times["numpy"]),
        "ratio": ratio,
    }


def models(
    threads: int, names: Sequence[str], records: str | None, rounds: int, min_s: float
) -> dict[str, Any]:
    from compiler import zoo
    from compiler.frontend.onnx import from_onnx
    from compiler.graph.build_model import build_model
    from examples.blur import with_threads
    from tuner.network.timing import NativeModel, OrtPeer, output_mismatch, seeded_feeds
    from tuner.network.tune import configs_from_records
    from tuner.records import open_store

    counts = tuple(dict.fromkeys((1, threads)))
    store = open_store(records) if records else None
    out: dict[str, Any] = {}
    protos = {name: zoo.build(name) for name in names}
    inputs = {name: seeded_feeds(proto, 0, zoo.BERT_VOCAB) for name, proto in protos.items()}
    # every session before our first kernel loads libgomp (see the module doc)
    sessions = {
        name: {n: OrtPeer(proto, inputs[name], threads=n) for n in counts}
        for name, proto in protos.items()
    }
    for name in names:
        proto, feeds, peers = protos[name], inputs[name], sessions[name]
        reference = peers[1].run()
        graph = from_onnx(proto)
        natives, tuned = {}, {}
        for n in counts:
            configs = configs_from_records(graph, store, "host", n) if store is not None else {}
            tuned[n] = len(configs)
            natives[n] = NativeModel(build_model(graph, configs, "host", n), feeds)
            why = output_mismatch(natives[n].run(), reference, 1e-3)
            if why is not None:
                raise AssertionError(f"{name} on {n} threads: {why}")
        # Each build on its own thread count (a one-thread build has no parallel loop; this
        # keeps the process's OpenMP setting from deciding what a build is timed on).
        calls = [
            *((f"ours{n}", with_threads(natives[n].call, n)) for n in counts),
            *((f"ort{n}", peers[n].call) for n in counts),
        ]
        times = interleave(calls, rounds, min_s)

        def ratio(num: str, den: str, times: dict[str, list[float]] = times) -> float:
            return statistics.median(x / y for x, y in zip(times[num], times[den], strict=True))

        out[name] = {
            "median_s": {label: statistics.median(v) for label, v in times.items()},
            "ratio": {n: ratio(f"ort{n}", f"ours{n}") for n in counts},
            "scaling": ratio("ours1", f"ours{threads}"),
            "ort_scaling": ratio("ort1", f"ort{threads}"),
            "tuned_tasks": tuned,
        }
    if store is not None:
        store.close()
    return out


def main(argv: Sequence[str]) -> None:
    """sgemm N THREADS ROUNDS MIN_S [RECORDS] | models THREADS NAMES ROUNDS MIN_S [RECORDS]"""
    if argv[0] == "sgemm":
        records = argv[5] if len(argv) > 5 else None
        result = sgemm(int(argv[1]), int(argv[2]), int(argv[3]), float(argv[4]), records)
    else:
        records = argv[5] if len(argv) > 5 else None
        result = models(int(argv[1]), argv[2].split(","), records, int(argv[3]), float(argv[4]))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])

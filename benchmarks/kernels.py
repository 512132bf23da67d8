"""Generated kernels vs their peers, single-threaded, interleaved in one process.

sgemm (template `dense`, B pre-packed) vs numpy's OpenBLAS at 256..2048 cube; the ResNet-18
convolutions (3x3 at 64/128/256/512 channels, the 1x1 stride-2 downsamples, the 7x7/2 stem;
templates `conv2d_nchwc`, `conv2d_1x1_nchwc`, `conv2d_stem_nchwc`, all with the bias fused) vs
onnxruntime's one-node Conv with its bias. For each case a bounded random search picks the config
(the configs in `kernels_best.json` start the next search, as a tuner starts from its records;
`--reuse` skips the search where one is there; `--write-best` records this run's finds there,
which a run never does unasked: the file is tracked), the kernel's output is checked against
the peer's, then ours and the peer alternate for `--rounds` rounds, both timed the same way: a
Python loop of calls (`loop_seconds`; ours through ctypes, about a microsecond a call;
onnxruntime with its inputs and output bound once, so a call is `run_with_iobinding`, not
`session.run`'s ~30 us of feed conversion). Ratio = peer time / our time (> 1: ours is faster).
Our inputs are in the kernel's layout (NCHW[x]c, pre-padded, packed weights): that packing
happens once per model, not per call.

    python benchmarks/kernels.py [--reuse] [--trials 16] [--rounds 5] [--only sgemm,conv,stem]
        [--write-best]

Ends with: kernels: sgemm_min_ratio=<r> conv_geomean_ratio=<r> stem_ratio=<r>
"""

from __future__ import annotations

import os

# One thread for every peer, set before numpy or onnxruntime load their thread pools.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.kernel_search import (  # noqa: E402
    NativeKernel,
    build_candidate,
    process_pool,
    search,
    template,
)
from compiler.ops import op_templates  # noqa: E402
from compiler.toolchain import host_target_name  # noqa: E402
from tuner.network.timing import interleaved_rounds  # noqa: E402

BEST_FILE = Path(__file__).resolve().parent / "kernels_best.json"


@dataclass(frozen=True)
class Case:
    group: str  # sgemm | conv | stem
    label: str
    template: str
    shape: tuple[int, ...]


WINOGRAD = "conv2d_winograd_nchwc"


def cases() -> list[Case]:
    out = [Case("sgemm", f"sgemm {n}^3", "dense", (n, n, n)) for n in (256, 512, 1024, 2048)]
    winograd = WINOGRAD in op_templates()
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        shape = (1, c, hw, hw, c, 3, 3, 1, 1, 1)
        out.append(Case("conv", f"3x3 {c}ch {hw}", "conv2d_nchwc", shape))
        if winograd:  # the same convolution by Winograd's algorithm: the faster one counts
            out.append(Case("conv", f"3x3 {c}ch {hw} winograd", WINOGRAD, shape))
    for c, hw in ((64, 56), (128, 28), (256, 14)):
        shape = (1, c, hw, hw, 2 * c, 1, 1, 2, 0, 1)
        out.append(Case("conv", f"1x1/2 {c}->{2 * c} {hw}", "conv2d_1x1_nchwc", shape))
    out.append(
        Case(
            "stem", "7x7/2 stem 3->64 224", "conv2d_stem_nchwc", (1, 3, 224, 224, 64, 7, 7, 2, 3, 1)
        )
    )
    return out


# -- peers -----------------------------------------------------------------------------------
def numpy_peer(logical: list[np.ndarray]) -> Callable[[], np.ndarray]:
    a, b = logical
    c = np.empty((a.shape[0], b.shape[1]), np.float32)

    def run() -> np.ndarray:
        np.matmul(a, b, out=c)
        return c

    return run


def onnxruntime_peer(shape: tuple[int, ...], logical: list[np.ndarray]) -> Callable[[], np.ndarray]:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    x, w, bias = logical
    n, _, h, wd, oc, kh, kw, stride, pad, _ = shape
    out_shape = [n, oc, (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1]
    node = helper.make_node(
        "Conv",
        ["x", "w", "b"],
        ["y"],
        kernel_shape=[kh, kw],
        strides=[stride, stride],
        pads=[pad] * 4,
    )
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")],
    )
    # onnxruntime 1.31 refuses the IR version onnx 1.23 writes by default (REFERENCE.md).
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    # Inputs and the output bound once (I/O binding): a call is the run itself, without
    # session.run's per-call feed conversion and output allocation (about 30 us a call here).
    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    y = np.empty(out_shape, np.float32)
    binding.bind_output("y", "cpu", 0, np.float32, out_shape, y.ctypes.data)

    def run() -> np.ndarray:
        session.run_with_iobinding(binding)
        return y

    return run


# -- best-config cache -----------------------------------------------------------------------
def _key(case: Case) -> str:
    return f"{host_target_name()}|{case.template}|{','.join(map(str, case.shape))}"


def load_best() -> dict[str, dict[str, object]]:
    if not BEST_FILE.exists():
        return {}
    return dict(json.loads(BEST_FILE.read_text()))


def cached_index(case: Case, best: dict[str, dict[str, object]]) -> int | None:
    """The cached config's index, if it is still a config of the template's space."""
    entry = best.get(_key(case))
    return None if entry is None else _index_of(case, entry["knobs"])


def warm_indices(case: Case, best: dict[str, dict[str, object]]) -> list[int]:
    """Where a search starts: the case's cached config, then the cached configs of the same
    template at other shapes that are configs of this one's space too."""
    mine = cached_index(case, best)
    prefix = f"{host_target_name()}|{case.template}|"
    others = [_index_of(case, e["knobs"]) for k, e in best.items() if k.startswith(prefix)]
    found = [i for i in (mine, *others) if i is not None]
    return list(dict.fromkeys(found))


def _index_of(case: Case, knobs: object) -> int | None:
    if not isinstance(knobs, dict):
        return None
    try:
        return template(case.template).config_space(case.shape).index_of(knobs)
    except ValueError:
        return None


# -- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reuse", action="store_true", help="skip search where kernels_best.json has a config"
    )
    parser.add_argument("--trials", type=int, default=16, help="configs tried per case")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument(
        "--min-repeat-ms", type=float, default=50.0, help="length of one timed repeat"
    )
    parser.add_argument("--workers", type=int, default=2, help="build processes")
    parser.add_argument("--only", default="sgemm,conv,stem", help="comma-separated groups")
    parser.add_argument(
        "--write-best",
        action="store_true",
        help="record the configs this run found in kernels_best.json (tracked; off by default)",
    )
    args = parser.parse_args(argv)
    groups = set(args.only.split(","))
    best = load_best()
    rng = np.random.default_rng(0)
    rows: list[tuple[Case, float, float, float, str]] = []
    started = time.perf_counter()
    with process_pool(args.workers) as pool:
        for case in (c for c in cases() if c.group in groups):
            t = template(case.template)
            logical = t.random_inputs(case.shape, rng)
            if case.group == "sgemm":
                peer = numpy_peer(logical)
            else:
                peer = onnxruntime_peer(case.shape, logical)
            expected = peer().copy()
            space = t.config_space(case.shape)
            index = cached_index(case, best) if args.reuse else None
            if index is None:
                warm = warm_indices(case, best)
                found = search(
                    case.template, case.shape, args.trials, logical, expected, pool, warm=warm
                )
                if found.index < 0:
                    print(f"{case.label}: no config built and passed the check", flush=True)
                    continue
                index = found.index
                best[_key(case)] = {"knobs": dict(space.get(index)), "seconds": found.seconds}
                if args.write_best:
                    BEST_FILE.write_text(json.dumps(best, indent=1, sort_keys=True) + "\n")
            config = space.get(index)
            _, path, error = build_candidate(case.template, case.shape, index)
            if error:
                print(f"{case.label}: {error}", flush=True)
                continue
            kernel = NativeKernel(case.template, case.shape, config, path, logical)
            got = kernel.output()
            err = float(np.abs(got - expected).max())
            if err > 1e-3 * max(1.0, float(np.abs(expected).max())):
                print(f"{case.label}: WRONG ANSWER (max error {err:.3g})", flush=True)
                continue
            # Both sides the same way: a Python loop of calls (ours through ctypes, the peer's
            # own Python API), at least --min-repeat-ms a round, the order swapped every round.
            times = interleaved_rounds(
                [("ours", kernel.call), ("peer", peer)], args.rounds, args.min_repeat_ms / 1e3
            )
            ours, theirs = statistics.median(times["ours"]), statistics.median(times["peer"])
            knobs = " ".join(f"{k}={v}" for k, v in config.items())
            rows.append(
                (
                    case,
                    t.flop(case.shape) / ours / 1e9,
                    t.flop(case.shape) / theirs / 1e9,
                    theirs / ours,
                    knobs,
                )
            )
            print(
                f"  {case.label:<24} ours {rows[-1][1]:7.1f} GF/s  peer {rows[-1][2]:7.1f} GF/s  ratio {rows[-1][3]:.2f}  [{knobs}]",
                flush=True,
            )
    print()
    print(f"{'case':<24} {'ours GFLOP/s':>12} {'peer GFLOP/s':>12} {'ratio':>6}  config")
    for case, ours_gf, peer_gf, ratio, knobs in rows:
        print(f"{case.label:<24} {ours_gf:12.1f} {peer_gf:12.1f} {ratio:6.2f}  {knobs}")
    print(
        f"(peers: numpy/OpenBLAS and onnxruntime, 1 thread; ratio = peer time / our time; {time.perf_counter() - started:.0f} s)"
    )

    def ratios(group: str) -> list[float]:
        """The group's ratios, one per shape: the best template's where several ran it."""
        best: dict[tuple[int, ...], float] = {}
        for case, _, _, ratio, _ in rows:
            if case.group == group:
                best[case.shape] = max(ratio, best.get(case.shape, 0.0))
        return list(best.values())

    sgemm, conv, stem = ratios("sgemm"), ratios("conv"), ratios("stem")
    sgemm_min = f"{min(sgemm):.2f}" if sgemm else "nan"
    conv_geo = f"{math.exp(statistics.fmean(math.log(r) for r in conv)):.2f}" if conv else "nan"
    stem_r = f"{stem[0]:.2f}" if stem else "nan"
    print(f"kernels: sgemm_min_ratio={sgemm_min} conv_geomean_ratio={conv_geo} stem_ratio={stem_r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

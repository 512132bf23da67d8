"""ONNX conformance: onnx's own node tests for every op Kiln imports, run through KilnBackend.

    .venv/bin/python benchmarks/conformance.py [--ops Relu,Conv] [--jobs 2] [--failures]

onnx generates its node test cases from its package (`onnx.backend.test.case.node`: a one-node model
and input/output arrays each). A case counts for op X when its model is one node of X; every case of
an op `compiler.frontend.onnx.supported_ops()` lists is run: imported, built untuned for this host,
run on an agent of a local pool, compared as onnx's runner does (its rtol/atol). Each case ends as
  pass     outputs match
  refused  Kiln declined it with an error (import or build): an attribute, an input that is not a
           constant, a shape or dtype it does not take
  wrong    it ran and an output differs (the one outcome that must never happen)
  error    the run failed on the device
Builds go to --jobs processes; runs to one local pool. Prints a table per op (ops with every case
passing first) and ends with one line:
    conformance: ops=<n> ops_all_pass=<n> cases=<n> passed=<n> pass_pct=<x> refused=<n> wrong=<n> error=<n>
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402


@dataclass
class Outcome:
    name: str
    op: str
    kind: str  # pass | refused | wrong | error
    detail: str = ""


def node_cases(ops: set[str] | None = None) -> list[Any]:
    """onnx's node test cases of one node whose op Kiln imports (all, or those in `ops`)."""
    from compiler.frontend.onnx import supported_ops
    from kiln.onnx_backend import node_test_cases

    claimed = set(supported_ops()) if ops is None else ops & set(supported_ops())
    return node_test_cases(claimed)


def _build(case: Any) -> tuple[str, Any, str]:
    """(name, prepared rep or None, why not) — in a build process."""
    from kiln.onnx_backend import KilnBackend

    try:
        return case.name, KilnBackend.prepare(case.model), ""
    except Exception as error:  # every refusal is an outcome, whatever its type
        return case.name, None, f"{type(error).__name__}: {str(error)[:300]}"


def compare(case: Any, outputs: tuple[np.ndarray, ...], expected: list[Any]) -> str:
    """'' when `outputs` match as onnx's runner checks them, else what differs."""
    import onnx.numpy_helper

    expected = [
        onnx.numpy_helper.to_array(e) if isinstance(e, onnx.TensorProto) else e for e in expected
    ]
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
        want = np.asarray(want)
        if got.shape != want.shape:
            return f"output {i}: shape {got.shape}, expected {want.shape}"
        if want.dtype.kind in "fc":
            if not np.allclose(got, want, rtol=case.rtol, atol=case.atol, equal_nan=True):
                err = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))
                return f"output {i}: max abs error {err:.3g} (rtol {case.rtol}, atol {case.atol})"
        elif not np.array_equal(got, want):
            return f"output {i}: values differ"
    return ""


def run_cases(cases: list[Any], jobs: int) -> list[Outcome]:
    """Build every case in `jobs` processes, run each built one on the shared local pool."""
    from kiln.onnx_backend import close_shared_pool

    by_name = {c.name: c for c in cases}
    outcomes = []
    try:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for name, rep, why in pool.map(_build, cases, chunksize=4):
                case = by_name[name]
                op = case.model.graph.node[0].op_type
                if rep is None:
                    outcomes.append(Outcome(name, op, "refused", why))
                    continue
                kind, detail = "pass", ""
                for inputs, expected in case.data_sets:
                    try:
                        outputs = rep.run(list(inputs))
                    except Exception as error:
                        # A build at run time that Kiln declines is a refusal; a failed run is not.
                        failed_run = type(error).__name__ == "ModelRunError"
                        kind = "error" if failed_run else "refused"
                        detail = f"{type(error).__name__}: {str(error)[:300]}"
                        break
                    detail = compare(case, outputs, list(expected))
                    if detail:
                        kind = "wrong"
                        break
                outcomes.append(Outcome(name, op, kind, detail))
    finally:
        close_shared_pool()
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ops", default="", help="comma list of ops (default: every one Kiln imports)"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--failures", action="store_true", help="list every case that did not pass")
    args = parser.parse_args()
    start = time.perf_counter()
    cases = node_cases({o for o in args.ops.split(",") if o} or None)
    outcomes = run_cases(cases, args.jobs)
    elapsed = time.perf_counter() - start

    per_op: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        per_op[o.op][o.kind] += 1
    rows = sorted(per_op.items(), key=lambda kv: (kv[1]["pass"] != sum(kv[1].values()), kv[0]))
    print(f"| {'op':<24} | cases | pass | refused | wrong | error |")
    print(f"|{'-' * 26}|-------|------|---------|-------|-------|")
    for op, c in rows:
        print(
            f"| {op:<24} | {sum(c.values()):>5} | {c['pass']:>4} | {c['refused']:>7} | "
            f"{c['wrong']:>5} | {c['error']:>5} |"
        )
    if args.failures:
        print()
        for o in outcomes:
            if o.kind != "pass":
                print(f"{o.kind:<8} {o.name}: {o.detail}")
    totals = collections.Counter(o.kind for o in outcomes)
    all_pass = sum(1 for c in per_op.values() if c["pass"] == sum(c.values()))
    pct = 100.0 * totals["pass"] / max(1, len(outcomes))
    print(f"\n{len(outcomes)} cases of {len(per_op)} ops in {elapsed:.0f} s")
    print(
        f"conformance: ops={len(per_op)} ops_all_pass={all_pass} cases={len(outcomes)} "
        f"passed={totals['pass']} pass_pct={pct:.1f} refused={totals['refused']} "
        f"wrong={totals['wrong']} error={totals['error']}"
    )


if __name__ == "__main__":
    main()

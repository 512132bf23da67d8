"""Builds split into translation units (toolchain.UnitBuild, build.compile_kernels) and what
makes lowering cheap: the collector paused, linear canonical sums, one simplification per
unrolled nest."""

from __future__ import annotations

import ctypes
import gc
import importlib
import subprocess
from pathlib import Path

import numpy as np
import pytest

from compiler import te, toolchain
from compiler.arith import canonical
from compiler.build import Kernel, compile_kernels
from compiler.codegen.timing import HARNESS_SOURCE
from compiler.errors import BuildError
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import For, ForKind, Seq, Stmt, Store
from compiler.schedule.schedule import create_schedule

pytestmark = pytest.mark.usefixtures("build_cache")

# the packages export functions of the same names as these modules
simplify_module = importlib.import_module("compiler.arith.simplify")
unroll_module = importlib.import_module("compiler.lower.unroll")


class Runs:
    """The compiler commands run through toolchain's seam, but for the timing harness's (once per
    cache)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.commands: list[list[str]] = []
        self._real = toolchain._run
        monkeypatch.setattr(toolchain, "_run", self)

    def __call__(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        if Path(cmd[-1]).read_bytes() != HARNESS_SOURCE.encode():
            self.commands.append(cmd)
        return self._real(cmd)

    def units(self) -> int:
        return sum("-c" in c for c in self.commands)


def scale_kernel(symbol: str, factor: float, n: int = 64) -> Kernel:
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i] * factor, name="b")
    return Kernel(create_schedule(b), [a, b], symbol)


TAIL = [
    "int32_t both(void **args) {\n"
    "  void *first[2] = {args[0], args[1]};\n"
    "  void *second[2] = {args[1], args[2]};\n"
    "  int32_t rc = twice(first);\n"
    "  return rc ? rc : thrice(second);\n"
    "}\n"
]


def call(lib: ctypes.CDLL, symbol: str, *arrays: np.ndarray) -> int:
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int32
    return int(fn((ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))))


def load(data: bytes, tmp_path: Path) -> ctypes.CDLL:
    path = tmp_path / f"lib{len(list(tmp_path.glob('*.so')))}.so"
    path.write_bytes(data)
    return ctypes.CDLL(str(path))


@pytest.mark.parametrize("unit_chars", [None, 1])
def test_kernels_and_a_tail_calling_them_build_as_one_unit_or_several(
    unit_chars: int | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = Runs(monkeypatch)
    kernels = [scale_kernel("twice", 2.0), scale_kernel("thrice", 3.0)]
    shared = compile_kernels(kernels, TAIL, "host", unit_chars=unit_chars)
    # small kernels stay one unit; a unit_chars of 1 makes each kernel a unit, the tail a third
    assert runs.units() == (0 if unit_chars is None else 3)
    assert len(runs.commands) == (1 if unit_chars is None else 4)
    lib = load(shared.data, tmp_path)
    x = np.arange(64, dtype=np.float32)
    mid, out = np.zeros_like(x), np.zeros_like(x)
    assert call(lib, "both", x, mid, out) == 0
    np.testing.assert_array_equal(out, x * 6)
    assert lib.twice__time and lib.thrice__time


def test_an_unchanged_unit_is_not_compiled_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = Runs(monkeypatch)
    first = compile_kernels(
        [scale_kernel("twice", 2.0), scale_kernel("thrice", 3.0)], TAIL, unit_chars=1
    )
    assert not first.cache_hit and runs.units() == 3
    runs.commands.clear()
    again = compile_kernels(
        [scale_kernel("twice", 2.0), scale_kernel("thrice", 3.0)], TAIL, unit_chars=1
    )
    assert again.cache_hit and runs.commands == []
    changed = compile_kernels(
        [scale_kernel("twice", 2.0), scale_kernel("thrice", 4.0)], TAIL, unit_chars=1
    )
    # only the changed kernel's unit compiles, then the link; twice's unit and the tail are kept
    assert not changed.cache_hit and runs.units() == 1 and len(runs.commands) == 2
    lib = load(changed.data, tmp_path)
    x = np.arange(64, dtype=np.float32)
    mid, out = np.zeros_like(x), np.zeros_like(x)
    assert call(lib, "both", x, mid, out) == 0
    np.testing.assert_array_equal(out, x * 8)


def test_a_unit_that_does_not_compile_fails_the_link_with_the_compilers_error() -> None:
    units = toolchain.UnitBuild("host", jobs=2)
    units.add("int ok(void) { return 1; }\n")
    units.add("int broken(void) { return undeclared_name; }\n")
    with pytest.raises(BuildError) as info:
        units.link()
    assert "undeclared_name" in str(info.value.args) + str(getattr(info.value, "stderr", ""))


def test_lowering_runs_with_the_collector_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    import compiler.build

    seen: list[bool] = []
    real_lower = compiler.build.lower

    def spy(*args: object, **kwargs: object) -> PrimFunc:
        seen.append(gc.isenabled())
        return real_lower(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compiler.build, "lower", spy)
    assert gc.isenabled()
    compile_kernels([scale_kernel("twice", 2.0)], [])
    assert seen == [False] and gc.isenabled()


def test_a_long_sum_simplifies_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Canonicalizing every prefix of a chain of n additions took O(n^2) to_sum calls."""
    calls = 0
    real = canonical.to_sum

    def counting(expr: E.Expr) -> canonical.LinearSum:
        nonlocal calls
        calls += 1
        return real(expr)

    monkeypatch.setattr(canonical, "to_sum", counting)
    monkeypatch.setattr(simplify_module, "to_sum", counting)
    n = 300
    xs = [E.Var(f"x{i}") for i in range(n)]
    total: E.Expr = E.IntImm(0)
    for i, x in enumerate(xs):
        total = E.Add(total, E.Mul(x, E.IntImm(i % 7 + 1)))
    total = E.Sub(total, E.Mul(xs[0], E.IntImm(1)))  # x0's term cancels
    result = simplify_module.simplify(total)
    assert calls < 4 * n
    assert result.dtype == "int32"
    terms = canonical.to_sum(result).nonzero()
    assert len(terms) == n - 1 and all(a is not xs[0] for _, a in terms)


def test_a_nest_of_unrolled_loops_is_simplified_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made = 0
    real = unroll_module.StmtSimplifier

    class Counting(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args: object) -> None:
            nonlocal made
            made += 1
            super().__init__(*args)

    monkeypatch.setattr(unroll_module, "StmtSimplifier", Counting)
    out = Buffer("out", (64,), "float32")
    i, j, k = E.Var("i"), E.Var("j"), E.Var("k")
    body: Stmt = Store(out, i * 16 + j * 4 + k, E.FloatImm(1.0))
    for var in (k, j, i):
        body = For(var, E.IntImm(4), ForKind.UNROLLED, body)
    lowered = unroll_module.unroll(PrimFunc("f", (out,), body))
    assert made == 1  # was 1 + 4 + 16: each copy of an inner nest simplified again
    assert isinstance(lowered.body, Seq)
    indices = [s.index for s in lowered.body.stmts if isinstance(s, Store)]
    assert [x.value for x in indices if isinstance(x, E.IntImm)] == list(range(64))


def test_a_lowering_error_after_units_started_leaves_no_compile_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    import compiler.build

    real_lower = compiler.build.lower

    def lower_then_fail(sch: object, args: object, symbol: str) -> PrimFunc:
        if symbol == "thrice":
            raise ValueError("lowering thrice failed")
        return real_lower(sch, args, symbol)  # type: ignore[arg-type]

    monkeypatch.setattr(compiler.build, "lower", lower_then_fail)
    kernels = [scale_kernel("twice", 2.0), scale_kernel("thrice", 3.0)]
    with pytest.raises(ValueError, match="thrice"):
        compile_kernels(kernels, TAIL, unit_chars=1)  # twice's unit was already compiling
    assert not [t for t in threading.enumerate() if t.name.startswith("kiln-cc")]

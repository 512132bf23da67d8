"""Build matmul with the host gcc, load the shared object with ctypes and call both entries."""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from compiler import ops, toolchain
from compiler.artifact import Artifact
from compiler.build import build
from compiler.codegen.c import PRELUDE
from compiler.codegen.timing import render_timing
from compiler.errors import BuildError

pytestmark = pytest.mark.usefixtures("build_cache")

MATMUL = ops.get_template("matmul")


class TimingConfig(ctypes.Structure):
    """The agent's mirror of kiln_timing_config (compiler/codegen/timing.py)."""

    _fields_ = [
        ("warmup", ctypes.c_int32),
        ("number", ctypes.c_int32),
        ("repeat", ctypes.c_int32),
        ("min_repeat_ms", ctypes.c_double),
        ("cooldown_ms", ctypes.c_double),
        ("flush_buf", ctypes.c_void_p),
        ("flush_bytes", ctypes.c_int64),
    ]


class Module:
    """A loaded artifact with typed access to one entry's kernel and timing functions."""

    def __init__(self, path: Path, symbol: str) -> None:
        lib = ctypes.CDLL(str(path))
        self.kernel = getattr(lib, symbol)
        self.kernel.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.kernel.restype = ctypes.c_int32
        self.time = getattr(lib, symbol + "__time")
        self.time.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(TimingConfig),
            ctypes.POINTER(ctypes.c_double),
            ctypes.POINTER(ctypes.c_int32),
        ]
        self.time.restype = ctypes.c_int32

    @staticmethod
    def pack(*arrays: np.ndarray) -> ctypes.Array[ctypes.c_void_p]:
        return (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))

    def timed(
        self, args: ctypes.Array[ctypes.c_void_p], cfg: TimingConfig
    ) -> tuple[int, list[float], int]:
        samples = (ctypes.c_double * (cfg.repeat + 1))(*([-1.0] * (cfg.repeat + 1)))
        used = ctypes.c_int32(-1)
        rc = self.time(args, ctypes.byref(cfg), samples, ctypes.byref(used))
        assert samples[cfg.repeat] == -1.0, "wrote past samples_s[repeat - 1]"
        return rc, list(samples[: cfg.repeat]), used.value


def tiles(
    m: int, n: int, k: int, vectorize: bool = False, unroll: bool = False
) -> dict[str, object]:
    """Matmul knob values."""
    return {"tile_m": m, "tile_n": n, "tile_k": k, "vectorize": vectorize, "unroll": unroll}


def build_matmul(
    shape: tuple[int, int, int], knobs: Mapping[str, object], symbol: str = "mm"
) -> Artifact:
    space = MATMUL.config_space(shape)
    sch, args = MATMUL.instantiate(shape, space.get(space.index_of(knobs)))
    return build(sch, args, symbol, flop=MATMUL.flop(shape))


def load(art: Artifact, tmp_path: Path, symbol: str = "mm") -> Module:
    path = tmp_path / f"{art.sha256}.so"
    path.write_bytes(art.data)
    return Module(path, symbol)


def operands(shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m, n, k = shape
    rng = np.random.default_rng(1)
    return (
        rng.standard_normal((m, k), dtype=np.float32),
        rng.standard_normal((k, n), dtype=np.float32),
        np.full((m, n), np.nan, np.float32),
    )


@pytest.mark.parametrize(
    ("shape", "knobs"),
    [
        ((7, 13, 5), tiles(4, 4, 2, vectorize=True, unroll=True)),
        ((7, 13, 5), tiles(1, 1, 1)),
        ((33, 70, 19), tiles(8, 16, 4, vectorize=True, unroll=True)),  # tails on every axis
        ((32, 64, 16), tiles(4, 64, 16, vectorize=True)),
    ],
)
def test_kernel_matches_numpy(
    shape: tuple[int, int, int], knobs: Mapping[str, object], tmp_path: Path
) -> None:
    art = build_matmul(shape, knobs)
    a, b, c = operands(shape)
    module = load(art, tmp_path)
    assert module.kernel(Module.pack(a, b, c)) == 0
    np.testing.assert_allclose(c, MATMUL.reference(a, b), rtol=1e-4, atol=1e-5)


def test_artifact_metadata() -> None:
    art = build_matmul((7, 13, 5), tiles(1, 1, 1), "kiln_matmul_7x13x5_c0")
    assert art.format == "shared_object"
    assert art.target == toolchain.host_target_name()
    (entry,) = art.entries
    assert (entry.symbol, entry.timing_symbol) == (
        "kiln_matmul_7x13x5_c0",
        "kiln_matmul_7x13x5_c0__time",
    )
    assert entry.flop == 2 * 7 * 13 * 5
    assert [(s.name, s.shape, s.dtype, s.role) for s in entry.args] == [
        ("A", (7, 5), "float32", "input"),
        ("B", (5, 13), "float32", "input"),
        ("C", (7, 13), "float32", "output"),
    ]


def test_timing_entry(tmp_path: Path) -> None:
    shape = (16, 16, 16)
    module = load(build_matmul(shape, tiles(4, 16, 4, vectorize=True, unroll=True)), tmp_path)
    a, b, c = operands(shape)
    args = Module.pack(a, b, c)
    flush = np.zeros(4096, np.uint8)
    cfg = TimingConfig(warmup=1, number=3, repeat=4, min_repeat_ms=0.0, cooldown_ms=0.0,
                       flush_buf=flush.ctypes.data, flush_bytes=flush.nbytes)  # fmt: skip
    rc, samples, used = module.timed(args, cfg)
    assert rc == 0
    assert used == 3
    assert all(s > 0 for s in samples)
    np.testing.assert_array_equal(flush, 4)  # swept once before each of the 4 repeats
    np.testing.assert_allclose(c, MATMUL.reference(a, b), rtol=1e-4, atol=1e-5)


def test_min_repeat_ms_grows_number(tmp_path: Path) -> None:
    module = load(build_matmul((1, 1, 1), tiles(1, 1, 1)), tmp_path)
    a, b, c = operands((1, 1, 1))
    args = Module.pack(a, b, c)
    fixed = module.timed(args, TimingConfig(number=2, repeat=2))
    assert fixed[0] == 0 and fixed[2] == 2
    # A 1x1x1 matmul takes nanoseconds: 20 ms of it needs many thousands of calls (20, not 2,
    # so that a preemption during the first short repeat is unlikely to make it look long enough).
    cfg = TimingConfig(number=2, repeat=2, min_repeat_ms=20.0, cooldown_ms=0.01)
    grown = module.timed(args, cfg)
    assert grown[0] == 0
    assert grown[2] > 100
    assert all(s > 0 for s in grown[1])


def test_timing_entry_reports_kernel_failure_and_bad_arguments(tmp_path: Path) -> None:
    source = (
        PRELUDE + "int32_t bad(void **args) { (void)args; return 7; }\n" + render_timing(["bad"])
    )
    shared = toolchain.compile_shared(source)
    module = Module(shared.path, "bad")
    assert module.timed(Module.pack(), TimingConfig(number=1, repeat=1))[0] == 7
    assert module.time(Module.pack(), None, None, None) == -1


def test_build_cache_returns_the_same_bytes_without_compiling(
    build_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    knobs = tiles(2, 4, 2, vectorize=True)
    first = build_matmul((6, 8, 4), knobs)
    assert len(list(build_cache.glob("*.so"))) == 1

    def no_compiler(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        raise AssertionError(f"compiler ran on a cache hit: {cmd}")

    monkeypatch.setattr(toolchain, "_run", no_compiler)
    second = build_matmul((6, 8, 4), knobs)
    assert (second.data, second.sha256) == (first.data, first.sha256)
    assert not list(build_cache.glob(".build-*"))  # no temporary left behind


def test_source_or_flag_change_misses_the_cache(build_cache: Path) -> None:
    source = PRELUDE + "int32_t f(void **args) { (void)args; return 0; }\n"
    assert not toolchain.compile_shared(source).cache_hit
    assert toolchain.compile_shared(source).cache_hit
    assert not toolchain.compile_shared(source + "\n").cache_hit
    host = toolchain.host_target()
    o2 = dataclasses.replace(host, flags=(*host.flags, "-O2"))
    assert not toolchain.compile_shared(source, o2).cache_hit


def test_broken_source_raises_build_error_with_gcc_message() -> None:
    with pytest.raises(BuildError, match="gcc failed") as info:
        toolchain.compile_shared("int32_t f(void **args) { return undeclared_name; }\n")
    assert "undeclared_name" in info.value.stderr
    assert "error" in str(info.value)


def _relu_kernel(n: int, lanes: int, parallel: bool) -> tuple[object, list]:
    from compiler import te
    from compiler.schedule import create_schedule

    x = te.placeholder((n,), name="X")
    y = te.compute(
        (n,), lambda i: te.maximum(x[i], 0.0) + te.if_then_else(x[i] < -1.0, 1.0, 0.0), name="Y"
    )
    s = create_schedule(y)
    yo, yi = s[y].split(y.op.axis[0], lanes)
    s[y].vectorize(yi)
    if parallel:
        s[y].parallel(yo)
    return s, [x, y]


def _call(art: Artifact, symbol: str, tmp_path: Path, *arrays: np.ndarray) -> None:
    path = tmp_path / f"{art.sha256}-{symbol}.so"  # never rewrite a mapped library
    path.write_bytes(art.data)
    module = Module(path, symbol)
    assert module.kernel(Module.pack(*arrays)) == 0


def test_batched_kernels_share_one_shared_object(tmp_path: Path, build_cache: Path) -> None:
    from compiler.build import Kernel, build_many

    s1, args1 = _relu_kernel(50, 16, parallel=True)
    space = MATMUL.config_space((9, 10, 3))
    s2, args2 = MATMUL.instantiate((9, 10, 3), space.get(space.index_of(tiles(4, 8, 3, True))))
    art = build_many([Kernel(s1, args1, "relu"), Kernel(s2, args2, "mm", 540.0)])  # type: ignore[arg-type]
    assert [e.symbol for e in art.entries] == ["relu", "mm"]
    assert len(list(build_cache.glob("*.so"))) == 1
    x = np.random.default_rng(0).standard_normal(50, dtype=np.float32) * 3
    y = np.zeros(50, np.float32)
    _call(art, "relu", tmp_path, x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0) + (x < -1))
    a, b, c = operands((9, 10, 3))
    _call(art, "mm", tmp_path, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_openmp_kernel_is_one_region_and_correct_on_two_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compiler.build import build_source

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    s, args = _relu_kernel(1000, 16, parallel=True)
    src = build_source(s, args, "relu")  # type: ignore[arg-type]
    assert src.count("#pragma omp parallel") == 1 and "#pragma omp for" in src
    art = build(s, args, "relu")  # type: ignore[arg-type]
    x = np.random.default_rng(1).standard_normal(1000, dtype=np.float32) * 3
    y = np.zeros(1000, np.float32)
    _call(art, "relu", tmp_path, x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0) + (x < -1))


@pytest.mark.parametrize(("target", "compiler"), [("x86_64-avx2", "gcc"), ("host", "clang")])
def test_other_targets_and_clang(target: str, compiler: str, tmp_path: Path) -> None:
    import platform

    from compiler.build import Kernel, build_many

    if platform.machine() != "x86_64":
        pytest.skip("x86_64 targets")
    tgt = toolchain.get_target(target, compiler=compiler)
    s, args = _relu_kernel(77, 16, parallel=True)
    art = build_many([Kernel(s, args, "relu")], tgt)  # type: ignore[arg-type]
    x = np.random.default_rng(2).standard_normal(77, dtype=np.float32) * 3
    y = np.zeros(77, np.float32)
    _call(art, "relu", tmp_path, x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0) + (x < -1))


def test_internal_compiler_error_is_retried_once_with_safer_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real ICE cannot be provoked on demand, so the first compile is replaced by one that
    # reports it; the retry runs the real compiler.
    real = toolchain._run
    calls: list[list[str]] = []

    def crash_first(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        if len(calls) == 1:
            return subprocess.CompletedProcess(
                cmd, 1, "", "module.c:3: internal compiler error: Segmentation fault"
            )
        return real(cmd)

    monkeypatch.setattr(toolchain, "_run", crash_first)
    shared = toolchain.compile_shared(PRELUDE + "int32_t f(void **a) { (void)a; return 0; }\n")
    assert not shared.cache_hit and len(calls) == 2
    assert "-O3" in calls[0] and "-O3" not in calls[1]
    assert "-fno-tree-vectorize" in calls[1] and "-O2" in calls[1]


@pytest.mark.parametrize("combine", ["max", "min"])
def test_nested_vector_min_max_are_correct(combine: str, tmp_path: Path) -> None:
    from compiler import te
    from compiler.ir import Expr, Var
    from compiler.schedule import create_schedule

    a = te.placeholder((3, 40), name="A")
    pick = te.maximum if combine == "max" else te.minimum

    def window(i: Var, j: Var) -> Expr:
        acc: Expr = a[i, j]
        for d in range(1, 9):
            acc = pick(acc, a[i, j + d])
        return acc

    c = te.compute((3, 32), window, name="C")
    s = create_schedule(c)
    _, ji = s[c].split(s[c].axis[1], 16)
    s[c].vectorize(ji)
    art = build(s, [a, c], "slide")
    x = np.random.default_rng(2).standard_normal((3, 40), dtype=np.float32)
    y = np.zeros((3, 32), np.float32)
    _call(art, "slide", tmp_path, x, y)
    windows = np.stack([x[:, d : d + 32] for d in range(9)])
    np.testing.assert_array_equal(y, windows.max(0) if combine == "max" else windows.min(0))

"""Cross builds for aarch64 run under qemu-user, checked against numpy.

A tiny C harness (built with the same cross compiler) dlopens the kernel's shared object, reads
each argument from a raw file, calls the kernel through the packed ABI and writes the arguments
back, so the test compares real aarch64 results with numpy.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from compiler import te
from compiler.build import build
from compiler.schedule import create_schedule

CROSS = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
RUN_TIMEOUT_S = 120

pytestmark = [
    pytest.mark.usefixtures("build_cache"),
    pytest.mark.skipif(
        shutil.which(CROSS) is None or shutil.which(QEMU) is None or not Path(SYSROOT).is_dir(),
        reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 (scripts/setup.sh installs them)",
    ),
]

HARNESS = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
/* harness LIB SYMBOL FILE BYTES [FILE BYTES ...]: read, call, write back. */
int main(int argc, char **argv) {
  if (argc < 3 || (argc - 3) % 2) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 3; }
  int32_t (*fn)(void **) = (int32_t (*)(void **))dlsym(lib, argv[2]);
  if (!fn) return 4;
  int n = (argc - 3) / 2;
  void **args = calloc(n, sizeof(void *));
  for (int i = 0; i < n; ++i) {
    long bytes = atol(argv[4 + 2 * i]);
    args[i] = malloc(bytes);
    FILE *f = fopen(argv[3 + 2 * i], "rb");
    if (!f || fread(args[i], 1, bytes, f) != (size_t)bytes) return 5;
    fclose(f);
  }
  int32_t rc = fn(args);
  for (int i = 0; i < n; ++i) {
    FILE *f = fopen(argv[3 + 2 * i], "wb");
    fwrite(args[i], 1, atol(argv[4 + 2 * i]), f);
    fclose(f);
  }
  return rc;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("harness")
    (d / "harness.c").write_text(HARNESS)
    subprocess.run(
        [CROSS, "-O1", "-o", str(d / "harness"), str(d / "harness.c"), "-ldl"],
        check=True,
        timeout=RUN_TIMEOUT_S,
    )
    return d / "harness"


def run_under_qemu(
    harness: Path, so: bytes, symbol: str, arrays: list[np.ndarray], tmp: Path
) -> list[np.ndarray]:
    lib = tmp / "kernel.so"
    lib.write_bytes(so)
    argv = [QEMU, "-L", SYSROOT, str(harness), str(lib), symbol]
    for i, arr in enumerate(arrays):
        path = tmp / f"arg{i}.bin"
        path.write_bytes(arr.tobytes())
        argv += [str(path), str(arr.nbytes)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    return [
        np.frombuffer((tmp / f"arg{i}.bin").read_bytes(), a.dtype).reshape(a.shape)
        for i, a in enumerate(arrays)
    ]


def test_register_tiled_parallel_matmul_runs_on_aarch64(harness: Path, tmp_path: Path) -> None:
    m, n, k = 13, 20, 9  # tails on both tiled axes
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    s = create_schedule(c)
    cl = s.cache_write(c, "local")
    io, jo, _ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 8)
    s[c].parallel(io)
    s[c].vectorize(ji)
    s[cl].compute_at(s[c], jo)
    ci, cj = s[cl].op.axis
    s[cl].reorder(s[cl].op.reduce_axis[0], ci, cj)
    s[cl].unroll(ci)
    s[cl].vectorize(cj)
    art = build(s, [a, b, c], "mm", target="aarch64-neon")
    assert art.target == "aarch64-neon"
    assert art.data[:4] == b"\x7fELF" and art.data[18] == 183  # e_machine EM_AARCH64
    rng = np.random.default_rng(5)
    xa = rng.standard_normal((m, k), dtype=np.float32)
    xb = rng.standard_normal((k, n), dtype=np.float32)
    out = np.full((m, n), np.nan, np.float32)
    _, _, got = run_under_qemu(harness, art.data, "mm", [xa, xb, out], tmp_path)
    np.testing.assert_allclose(got, xa @ xb, rtol=1e-4, atol=1e-5)


def test_elementwise_select_kernel_runs_on_aarch64(harness: Path, tmp_path: Path) -> None:
    x = te.placeholder((37,), name="X")
    y = te.compute((37,), lambda i: te.if_then_else(x[i] < 0.0, x[i] * 0.1, x[i]), name="Y")
    s = create_schedule(y)
    _, yi = s[y].split(y.op.axis[0], 16)
    s[y].vectorize(yi)
    art = build(s, [x, y], "leaky", target="aarch64-neon")
    xs = np.random.default_rng(2).standard_normal(37, dtype=np.float32)
    _, got = run_under_qemu(harness, art.data, "leaky", [xs, np.zeros(37, np.float32)], tmp_path)
    np.testing.assert_allclose(got, np.where(xs < 0, xs * np.float32(0.1), xs), rtol=1e-6)


def test_vector_exp_and_erf_run_on_aarch64(harness: Path, tmp_path: Path) -> None:
    import math

    from compiler.te import math as tm

    x = te.placeholder((70,), name="X")
    y = te.compute((70,), lambda i: tm.erf(x[i]) + tm.exp(x[i]), name="Y")
    s = create_schedule(y)
    _, yi = s[y].split(y.op.axis[0], 16)
    s[y].vectorize(yi)
    art = build(s, [x, y], "ee", target="aarch64-neon")
    xs = np.random.default_rng(3).uniform(-6, 6, 70).astype(np.float32)
    _, got = run_under_qemu(harness, art.data, "ee", [xs, np.zeros(70, np.float32)], tmp_path)
    want = np.array([math.erf(float(v)) + math.exp(float(v)) for v in xs])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)

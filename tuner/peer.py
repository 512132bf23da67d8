"""Peers measured beside our kernels in the same run: numpy's BLAS for matmul."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Runs in a child so the thread count of numpy's BLAS is set before numpy loads.
_NUMPY_MATMUL = """
import json, sys, time
import numpy as np
m, n, k, repeat = (int(x) for x in sys.argv[1:5])
rng = np.random.default_rng(0)
a = rng.standard_normal((m, k), dtype=np.float32)
b = rng.standard_normal((k, n), dtype=np.float32)
c = a @ b
number = 1
while True:
    t0 = time.perf_counter()
    for _ in range(number):
        np.matmul(a, b, out=c)
    if time.perf_counter() - t0 >= 0.05:
        break
    number *= 2
samples = []
for _ in range(repeat):
    t0 = time.perf_counter()
    for _ in range(number):
        np.matmul(a, b, out=c)
    samples.append((time.perf_counter() - t0) / number)
print(json.dumps(samples))
"""

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def numpy_matmul_seconds(m: int, n: int, k: int, threads: int = 1, repeat: int = 5) -> list[float]:
    """Seconds per float32 (m,k)@(k,n) call, one sample per repeat, on `threads` BLAS threads."""
    env = dict(os.environ, **{v: str(threads) for v in _THREAD_VARS})
    out = subprocess.run(
        [sys.executable, "-c", _NUMPY_MATMUL, str(m), str(n), str(k), str(repeat)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return [float(s) for s in json.loads(out.stdout)]

"""Replaced by `benchmarks/cuda.py` (issue 26): this name runs its FP32 GEMM section alone.

    python benchmarks/cuda_gemm.py [--sizes 1024,2048,4096] [--rounds 7] [--budget-s 75]

is `python benchmarks/cuda.py --sections gemm ...` (any of its flags pass through), kept so that
the command lines of earlier notes still run; it ends with that script's `cuda:` line.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks import cuda

if __name__ == "__main__":
    sys.exit(cuda.main(["--sections", "gemm", *sys.argv[1:]]))

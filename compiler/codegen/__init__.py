"""Code generators: C for CPUs now (kernels and their native timing entries); CUDA and accelerator
instruction streams later."""

from compiler.codegen.c import render_c
from compiler.codegen.timing import render_timing, timing_symbol

__all__ = ["render_c", "render_timing", "timing_symbol"]

"""The integer arithmetic of a quantised network: every op exact, so a device is checked bit for bit.

Activations are int8 in HWC layout (batch 1), each with a number of fractional bits (its value is
`q * 2**-frac`; power-of-two scales, so requantisation is a shift). A convolution is an im2col
GEMM: int8 x int8 products summed in int32 with an int32 bias at the accumulator's scale, then

    y = int8(clip(acc >> shift, lo, 127))      lo = 0 with a ReLU, -128 without

the accelerator's epilogue (`compiler.ops.vta_dense`: ReLU, shift, min 127; without the ReLU the
generated program clips at -128 instead, see `compiler.quantized.accel`). `>>` is arithmetic
(floor), as on the accelerator. Sums stay far inside int32 for int8 GEMMs of K < 2**17.
"""

from __future__ import annotations

import numpy as np

INT8_MIN, INT8_MAX = -128, 127


def out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    """Output extent of a window op along one axis."""
    return (size + 2 * pad - kernel) // stride + 1


def im2col(x: np.ndarray, kernel: int, stride: int, pad: int) -> np.ndarray:
    """The GEMM input of a KxK convolution of HWC `x`: one row per output pixel (row-major),
    columns in (kh, kw, c) order, zero padding (the zero point of a symmetric int8)."""
    h, w, c = x.shape
    ho, wo = out_size(h, kernel, stride, pad), out_size(w, kernel, stride, pad)
    padded = np.pad(x, ((pad, pad), (pad, pad), (0, 0)))
    cols = np.empty((ho, wo, kernel, kernel, c), dtype=x.dtype)
    for i in range(kernel):
        for j in range(kernel):
            cols[:, :, i, j, :] = padded[
                i : i + stride * (ho - 1) + 1 : stride, j : j + stride * (wo - 1) + 1 : stride, :
            ]
    return cols.reshape(ho * wo, kernel * kernel * c)


def requantise(acc: np.ndarray, shift: int, relu: bool) -> np.ndarray:
    """int8(clip(acc >> shift, 0 or -128, 127)): the accelerator's epilogue."""
    return np.clip(acc >> shift, 0 if relu else INT8_MIN, INT8_MAX).astype(np.int8)


def gemm_accumulate(cols: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """int32 cols @ weight.T + bias, exact.

    The products run through float64 BLAS: every partial sum is an integer below 2**53, so the
    result is the integer one, at BLAS speed (numpy's integer matmul has no BLAS).
    """
    acc = cols.astype(np.float64) @ weight.astype(np.float64).T
    return (acc.astype(np.int64) + bias.astype(np.int64)).astype(np.int32)


def gemm_requantise(
    cols: np.ndarray, weight: np.ndarray, bias: np.ndarray, shift: int, relu: bool
) -> np.ndarray:
    """The accelerator's int8 GEMM with its epilogue: requantise(cols @ weight.T + bias)."""
    return requantise(gemm_accumulate(cols, weight, bias), shift, relu)


def add_requantise(
    a: np.ndarray, a_up: int, b: np.ndarray, b_up: int, shift: int, relu: bool = True
) -> np.ndarray:
    """A residual add of two int8 tensors of different scales: both shifted left onto the finer
    scale (`a_up`, `b_up` bits), summed in int32, requantised by `shift`."""
    total = (a.astype(np.int32) << a_up) + (b.astype(np.int32) << b_up)
    return requantise(total, shift, relu)


def max_pool(x: np.ndarray, kernel: int = 3, stride: int = 2, pad: int = 1) -> np.ndarray:
    """Max over KxK windows of HWC int8 `x`, padding with -128 (never the max of a window that
    holds a real value)."""
    h, w, c = x.shape
    ho, wo = out_size(h, kernel, stride, pad), out_size(w, kernel, stride, pad)
    padded = np.pad(x, ((pad, pad), (pad, pad), (0, 0)), constant_values=INT8_MIN)
    out = np.full((ho, wo, c), INT8_MIN, dtype=np.int8)
    for i in range(kernel):
        for j in range(kernel):
            window = padded[
                i : i + stride * (ho - 1) + 1 : stride, j : j + stride * (wo - 1) + 1 : stride, :
            ]
            np.maximum(out, window, out=out)
    return out


def global_avg_pool(x: np.ndarray) -> np.ndarray:
    """The per-channel mean of HWC int8 `x`, rounded half up (floor((sum + n/2) / n)): int8 of
    the same scale, as an [1, C] GEMM input."""
    n = x.shape[0] * x.shape[1]
    total = x.astype(np.int32).sum(axis=(0, 1))
    return ((total + n // 2) // n).astype(np.int8)[None, :]


def shift_for(values: np.ndarray, relu: bool, percentile: float = 99.9) -> int:
    """The smallest right shift that brings the `percentile` of |values| (of max(values, 0) with
    a ReLU) into int8: a calibration choice (outliers beyond it saturate)."""
    v = np.maximum(values, 0) if relu else np.abs(values)
    top = int(np.percentile(v, percentile)) if v.size else 0
    shift = 0
    while (top >> shift) > INT8_MAX and shift < 31:
        shift += 1
    return shift

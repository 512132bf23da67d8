"""Data layouts of the op library, in numpy (references, and the packing a caller does once).

NCHW[x]c keeps a block of x channels innermost, so one SIMD register holds x channels of one pixel:
`[N][C/x][H][W][x]`. Convolution weights are packed to `[OC/ocb][IC/icb][KH][KW][icb][ocb]`,
depthwise weights to `[C/cb][KH][KW][cb]`, dense weights (B of C = A @ B, [K][N]) to
`[ceil(N/nr)][K][nr]` with zero columns past N. Convolution inputs are pre-padded: the previous
layer (or the caller) writes zeros around the image, so kernels have no bounds checks.
`compute_*` functions give the same transforms as tensor expressions, to run as kernels.
"""

from __future__ import annotations

import numpy as np

from compiler import te
from compiler.ops.util import ceil_div
from compiler.te.tensor import Tensor


def _check_block(channels: int, block: int, what: str) -> None:
    if block < 1 or channels % block:
        raise ValueError(f"{what}: block {block} does not divide {channels} channels")


def pack_nchwc(x: np.ndarray, block: int) -> np.ndarray:
    """NCHW -> NCHW[block]c."""
    n, c, h, w = x.shape
    _check_block(c, block, "pack_nchwc")
    return np.ascontiguousarray(x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def unpack_nchwc(x: np.ndarray) -> np.ndarray:
    """NCHW[x]c -> NCHW."""
    n, co, h, w, ci = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, co * ci, h, w))


def pad_spatial(x: np.ndarray, pad: int, value: float = 0.0) -> np.ndarray:
    """`pad` rows and columns of `value` around the image of NCHW or NCHW[x]c data."""
    widths = [(0, 0), (0, 0), (pad, pad), (pad, pad)] + [(0, 0)] * (x.ndim - 4)
    return np.pad(x, widths, constant_values=np.float32(value))


def pack_conv_weight(w: np.ndarray, ic_block: int, oc_block: int) -> np.ndarray:
    """OIHW -> [OC/ocb][IC/icb][KH][KW][icb][ocb]."""
    oc, ic, kh, kw = w.shape
    _check_block(oc, oc_block, "pack_conv_weight (output channels)")
    _check_block(ic, ic_block, "pack_conv_weight (input channels)")
    blocked = w.reshape(oc // oc_block, oc_block, ic // ic_block, ic_block, kh, kw)
    return np.ascontiguousarray(blocked.transpose(0, 2, 4, 5, 3, 1))


def pack_depthwise_weight(w: np.ndarray, block: int) -> np.ndarray:
    """[C][1][KH][KW] -> [C/cb][KH][KW][cb]."""
    c, one, kh, kw = w.shape
    if one != 1:
        raise ValueError(f"pack_depthwise_weight: weight must be [C][1][KH][KW], got {w.shape}")
    _check_block(c, block, "pack_depthwise_weight")
    return np.ascontiguousarray(w.reshape(c // block, block, kh, kw).transpose(0, 2, 3, 1))


def pack_bias(b: np.ndarray, block: int) -> np.ndarray:
    """[C] -> [C/cb][cb]."""
    _check_block(b.shape[0], block, "pack_bias")
    return np.ascontiguousarray(b.reshape(-1, block))


def pack_dense_weight(b: np.ndarray, nr: int, kc: int | None = None) -> np.ndarray:
    """B [K][N] -> [ceil(N/nr)][K][nr], the columns past N zero.

    With `kc` < K (blocks of K that divide it): [K/kc][ceil(N/nr)][kc][nr], so that one k
    block's panels, which a row tile of A streams past in turn, are one contiguous run.
    """
    k, n = b.shape
    blocks = ceil_div(n, nr)
    padded = np.zeros((k, blocks * nr), dtype=b.dtype)
    padded[:, :n] = b
    if kc is None or kc >= k:
        return np.ascontiguousarray(padded.reshape(k, blocks, nr).transpose(1, 0, 2))
    if k % kc:
        raise ValueError(f"pack_dense_weight: k block {kc} does not divide K={k}")
    return np.ascontiguousarray(padded.reshape(k // kc, kc, blocks, nr).transpose(0, 2, 1, 3))


def compute_pack_nchwc(x: Tensor, block: int, name: str = "packed") -> Tensor:
    """The tensor expression of `pack_nchwc` over an NCHW tensor."""
    n, c, h, w = x.shape
    _check_block(c, block, "compute_pack_nchwc")
    return te.compute(
        (n, c // block, h, w, block),
        lambda b, co, y, xx, ci: x[b, co * block + ci, y, xx],
        name=name,
    )


def compute_unpack_nchwc(x: Tensor, name: str = "unpacked") -> Tensor:
    """The tensor expression of `unpack_nchwc` over an NCHW[x]c tensor."""
    n, co, h, w, ci = x.shape
    return te.compute(
        (n, co * ci, h, w), lambda b, c, y, xx: x[b, c // ci, y, xx, c % ci], name=name
    )

"""cuDNN's FP32 convolution through ctypes, for `benchmarks/cuda.py`'s conv section.

The legacy API (cudnnConvolutionForward; cuDNN 9 still has it), NCHW input, OIHW (KCRS)
filter, cross-correlation, FP32 data and compute with CUDNN_FMA_MATH: no TF32 tensor cores,
since our kernels are true FP32 (cuDNN's default math would take TF32 on sm_80+). The
algorithm is cuDNN's own pick by measurement (cudnnFindConvolutionForwardAlgorithm), among the
FMA ones. cuDNN shares the device's primary context and the default stream with `Gpu`, so its
buffers are `Gpu`'s and its work is timed by the same CUDA events.

Nothing here ran where it was written (no GPU, no cuDNN): `benchmarks/cuda.py` first calls it
in a child process of its own (`--section cudnn`), checked against numpy, and only if that
child reports success does the conv section use it; otherwise the peer is im2col + sgemm.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from collections.abc import Sequence
from typing import Any

from device_agent.backends.cuda_driver import CudaError, DeviceBuffer, Gpu

CUDNN_TENSOR_NCHW = 0
CUDNN_DATA_FLOAT = 0
CUDNN_CROSS_CORRELATION = 1
CUDNN_FMA_MATH = 3
CUDNN_TENSOR_OP_MATHS = (1, 2)  # TENSOR_OP_MATH, TENSOR_OP_MATH_ALLOW_CONVERSION
FIND_ALGOS = 8
# cuDNN 9's pieces, loaded first (global) from the folder of libcudnn.so.9: it opens them by name
SUBLIBRARIES = (
    "libcudnn_graph",
    "libcudnn_engines_runtime_compiled",
    "libcudnn_engines_precompiled",
    "libcudnn_heuristic",
    "libcudnn_ops",
    "libcudnn_cnn",
    "libcudnn_adv",
)


class AlgoPerf(ctypes.Structure):
    """cudnnConvolutionFwdAlgoPerf_t."""

    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]


def cudnn_candidates() -> list[str]:
    """Where libcudnn may be: $KILN_CUDNN, the loader's path, CUDA's folders, Python wheels
    (this Python's, and the lent GPU machines' /opt/*/.venv)."""
    names = [os.environ.get("KILN_CUDNN", ""), "libcudnn.so.9", "libcudnn.so"]
    roots = ["/usr/lib/x86_64-linux-gnu", "/usr/local/cuda*/lib64", "/usr/local/cuda*/lib"]
    roots += [f"{p}/nvidia/cudnn/lib" for p in sys.path]
    roots += ["/opt/*/.venv/lib/python3*/site-packages/nvidia/cudnn/lib"]
    for root in roots:
        names += sorted(glob.glob(f"{root}/libcudnn.so*"))
    return [n for n in names if n]


def _preload(folder: str) -> None:
    """Load cuDNN's sub-libraries of `folder` globally, each after those it needs (passes
    until no more load)."""
    left = [
        path
        for stem in SUBLIBRARIES
        for path in sorted(glob.glob(os.path.join(folder, f"{stem}.so*")))[:1]
    ]
    for _ in range(len(left)):
        still = []
        for path in left:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                still.append(path)
        if len(still) == len(left):
            break
        left = still


def load_cudnn() -> ctypes.CDLL:
    """The first libcudnn that loads. Raises CudaError naming what was tried."""
    errors = []
    for name in cudnn_candidates():
        try:
            if os.path.dirname(name):
                _preload(os.path.dirname(name))
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(str(e))
    raise CudaError("loading cuDNN (libcudnn)", detail="; ".join(errors[:4]) or "no candidate")


_vp = ctypes.c_void_p
_SIGNATURES: dict[str, list[Any]] = {
    "cudnnCreate": [ctypes.POINTER(_vp)],
    "cudnnDestroy": [_vp],
    "cudnnGetVersion": [],
    "cudnnGetErrorString": [ctypes.c_int],
    "cudnnCreateTensorDescriptor": [ctypes.POINTER(_vp)],
    "cudnnSetTensor4dDescriptor": [_vp] + [ctypes.c_int] * 6,
    "cudnnDestroyTensorDescriptor": [_vp],
    "cudnnCreateFilterDescriptor": [ctypes.POINTER(_vp)],
    "cudnnSetFilter4dDescriptor": [_vp] + [ctypes.c_int] * 6,
    "cudnnDestroyFilterDescriptor": [_vp],
    "cudnnCreateConvolutionDescriptor": [ctypes.POINTER(_vp)],
    "cudnnSetConvolution2dDescriptor": [_vp] + [ctypes.c_int] * 8,
    "cudnnSetConvolutionMathType": [_vp, ctypes.c_int],
    "cudnnDestroyConvolutionDescriptor": [_vp],
    "cudnnGetConvolution2dForwardOutputDim": [_vp, _vp, _vp] + [ctypes.POINTER(ctypes.c_int)] * 4,
    "cudnnFindConvolutionForwardAlgorithm": [
        _vp,
        _vp,
        _vp,
        _vp,
        _vp,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(AlgoPerf),
    ],
    "cudnnGetConvolutionForwardWorkspaceSize": [
        _vp,
        _vp,
        _vp,
        _vp,
        _vp,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_size_t),
    ],
    "cudnnConvolutionForward": [
        _vp,
        _vp,
        _vp,
        ctypes.c_uint64,
        _vp,
        ctypes.c_uint64,
        _vp,
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.c_size_t,
        _vp,
        _vp,
        ctypes.c_uint64,
    ],
}


class Cudnn:
    """A cuDNN handle in `gpu`'s context."""

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.lib = load_cudnn()
        restypes: dict[str, Any] = {
            "cudnnGetVersion": ctypes.c_size_t,
            "cudnnGetErrorString": ctypes.c_char_p,
        }
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes = argtypes
            fn.restype = restypes.get(name, ctypes.c_int)  # the rest return cudnnStatus_t
        self.handle = _vp()
        self.call("cudnnCreate", ctypes.byref(self.handle))
        self.version = int(self.lib.cudnnGetVersion())

    def call(self, name: str, *args: Any) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            text = self.lib.cudnnGetErrorString(status)
            raise CudaError(name, status, text.decode() if text else "cuDNN status")

    def conv(self, shape: Sequence[int]) -> CudnnConv:
        """The forward convolution of workload (N, C, H, W, O, KH, KW, stride, pad, ...)."""
        return CudnnConv(self, tuple(shape))

    def close(self) -> None:
        self.lib.cudnnDestroy(self.handle)


class CudnnConv:
    """One layer's descriptors, algorithm and workspace; call it with (x, w, y) buffers."""

    def __init__(self, cudnn: Cudnn, shape: tuple[int, ...]) -> None:
        n, c, h, w, o, kh, kw, stride, pad = shape[:9]
        self.cudnn = cudnn
        call = cudnn.call
        self.x_desc, self.y_desc, self.w_desc, self.conv_desc = _vp(), _vp(), _vp(), _vp()
        call("cudnnCreateTensorDescriptor", ctypes.byref(self.x_desc))
        call("cudnnCreateTensorDescriptor", ctypes.byref(self.y_desc))
        call("cudnnCreateFilterDescriptor", ctypes.byref(self.w_desc))
        call("cudnnCreateConvolutionDescriptor", ctypes.byref(self.conv_desc))
        call("cudnnSetTensor4dDescriptor", self.x_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
             n, c, h, w)  # fmt: skip
        call("cudnnSetFilter4dDescriptor", self.w_desc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
             o, c, kh, kw)  # fmt: skip
        call("cudnnSetConvolution2dDescriptor", self.conv_desc, pad, pad, stride, stride, 1, 1,
             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)  # fmt: skip
        call("cudnnSetConvolutionMathType", self.conv_desc, CUDNN_FMA_MATH)
        dims = [ctypes.c_int() for _ in range(4)]
        call("cudnnGetConvolution2dForwardOutputDim", self.conv_desc, self.x_desc, self.w_desc,
             *(ctypes.byref(d) for d in dims))  # fmt: skip
        self.out_shape = tuple(d.value for d in dims)
        call("cudnnSetTensor4dDescriptor", self.y_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
             *self.out_shape)  # fmt: skip
        perfs = (AlgoPerf * FIND_ALGOS)()
        found = ctypes.c_int()
        call("cudnnFindConvolutionForwardAlgorithm", cudnn.handle, self.x_desc, self.w_desc,
             self.conv_desc, self.y_desc, FIND_ALGOS, ctypes.byref(found), perfs)  # fmt: skip
        usable = [
            p
            for p in perfs[: found.value]
            if p.status == 0 and p.mathType not in CUDNN_TENSOR_OP_MATHS
        ]
        if not usable:
            raise CudaError("cudnnFindConvolutionForwardAlgorithm", detail="no FMA algorithm")
        best = min(usable, key=lambda p: p.time)
        self.algo, self.find_ms = int(best.algo), float(best.time)
        size = ctypes.c_size_t()
        call("cudnnGetConvolutionForwardWorkspaceSize", cudnn.handle, self.x_desc, self.w_desc,
             self.conv_desc, self.y_desc, self.algo, ctypes.byref(size))  # fmt: skip
        self.workspace_bytes = int(size.value)
        self.workspace = cudnn.gpu.alloc(max(256, self.workspace_bytes))
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def __call__(self, x: DeviceBuffer, w: DeviceBuffer, y: DeviceBuffer) -> None:
        self.cudnn.call(
            "cudnnConvolutionForward", self.cudnn.handle, ctypes.byref(self._one),
            self.x_desc, x.ptr, self.w_desc, w.ptr, self.conv_desc, self.algo,
            self.workspace.ptr, self.workspace_bytes, ctypes.byref(self._zero),
            self.y_desc, y.ptr,
        )  # fmt: skip

    def close(self) -> None:
        lib = self.cudnn.lib
        lib.cudnnDestroyTensorDescriptor(self.x_desc)
        lib.cudnnDestroyTensorDescriptor(self.y_desc)
        lib.cudnnDestroyFilterDescriptor(self.w_desc)
        lib.cudnnDestroyConvolutionDescriptor(self.conv_desc)
        self.cudnn.gpu.free(self.workspace)

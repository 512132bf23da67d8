"""The op library: compute definitions with numpy references and tunable schedule templates.

Templates: `dense` (packed weights), `conv2d_nchwc` (KxK), `conv2d_1x1_nchwc`,
`grouped_conv2d_1x1_nchwc`,
`conv2d_stem_nchwc` (few input channels), `conv2d_winograd_nchwc` (3x3 stride 1),
`depthwise_conv2d_nchwc`, `max_pool2d_nchwc`,
`avg_pool2d_nchwc`, `global_avg_pool2d_nchwc`, `softmax`, `layer_norm`, elementwise `add`,
`multiply`, `relu`, `add_relu`, `reduce_sum`, the skeleton's `matmul` (plain [K][N] B), and
`vta_dense` and `vta_conv2d` (int8, for the VTA-like accelerator: target "vta" builds
instruction streams; vta_conv2d's are lowered from its TE schedule), and `cuda_dense_fp16_tc`
(fp16 in, fp32 out, on tensor cores through the WMMA intrinsics of `cuda.tensorcore`);
float32 `cuda_dense`, `cuda_batch_matmul`, `cuda_conv2d`, `cuda_conv2d_gemm` (`cuda.gemm`,
`cuda.conv2d`); `cuda_depthwise_conv2d`, `cuda_max_pool2d`, `cuda_avg_pool2d`,
`cuda_global_avg_pool2d`, `cuda_softmax`, `cuda_layer_norm` and `cuda_elementwise_<op>`
(`cuda.depthwise`, `cuda.pool`, `cuda.norm`, `cuda.injective`, whose
`schedule_injective_cuda` schedules any fused injective group).
`layout` holds the NCHW <-> NCHW[x]c and weight packings they take.
"""

from __future__ import annotations

from compiler.ops.base import OpTemplate, Template
from compiler.ops.conv2d import Conv2d1x1Template, Conv2dNCHWcTemplate, Conv2dStemTemplate
from compiler.ops.conv2d_grouped import GroupedConv2d1x1Template
from compiler.ops.cuda.conv2d import CudaConv2dGemmTemplate, CudaConv2dTemplate
from compiler.ops.cuda.dense import CudaBatchMatmulTemplate, CudaDenseTemplate
from compiler.ops.cuda.depthwise import CudaDepthwiseConv2dTemplate
from compiler.ops.cuda.injective import CUDA_ELEMENTWISE
from compiler.ops.cuda.norm import CudaLayerNormTemplate, CudaSoftmaxTemplate
from compiler.ops.cuda.pool import CudaGlobalAvgPoolTemplate, CudaPool2dTemplate
from compiler.ops.cuda.tensorcore import TensorCoreDenseTemplate
from compiler.ops.dense import DenseTemplate
from compiler.ops.depthwise import DepthwiseConv2dTemplate
from compiler.ops.injective import ELEMENTWISE_OPS, ElementwiseTemplate
from compiler.ops.matmul import MatmulTemplate
from compiler.ops.normalization import LayerNormTemplate, SoftmaxTemplate
from compiler.ops.pool import GlobalAvgPoolTemplate, Pool2dTemplate
from compiler.ops.reduction import ReduceSumTemplate
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.ops.vta_conv2d import VtaConv2dTemplate
from compiler.ops.vta_dense import VtaDenseTemplate
from compiler.ops.winograd import Conv2dWinogradTemplate

_LIBRARY: tuple[Template, ...] = (
    MatmulTemplate(),
    DenseTemplate(),
    Conv2dNCHWcTemplate(),
    Conv2d1x1Template(),
    GroupedConv2d1x1Template(),
    Conv2dStemTemplate(),
    Conv2dWinogradTemplate(),
    DepthwiseConv2dTemplate(),
    Pool2dTemplate("max"),
    Pool2dTemplate("avg"),
    GlobalAvgPoolTemplate(),
    ReduceSumTemplate(),
    SoftmaxTemplate(),
    LayerNormTemplate(),
    *(ElementwiseTemplate(op) for op in ELEMENTWISE_OPS),
    VtaDenseTemplate(),
    VtaConv2dTemplate(),
    TensorCoreDenseTemplate(),  # cuda_dense_fp16_tc: fp16 GEMM on tensor cores (WMMA)
    CudaDenseTemplate(),
    CudaBatchMatmulTemplate(),
    CudaConv2dTemplate(),
    CudaConv2dGemmTemplate(),
    CudaDepthwiseConv2dTemplate(),
    CudaPool2dTemplate("max"),
    CudaPool2dTemplate("avg"),
    CudaGlobalAvgPoolTemplate(),
    CudaSoftmaxTemplate(),
    CudaLayerNormTemplate(),
    *CUDA_ELEMENTWISE,
)
_TEMPLATES: dict[str, Template] = {t.name: t for t in _LIBRARY}

__all__ = [
    "Config",
    "ConfigSpace",
    "Knob",
    "OpTemplate",
    "Template",
    "get_template",
    "op_templates",
    "template_names",
]


def get_template(name: str) -> Template:
    """The template registered as `name`; raises KeyError naming the known ones otherwise."""
    if name not in _TEMPLATES:
        raise KeyError(f"no op template {name!r}; known: {', '.join(sorted(_TEMPLATES))}")
    return _TEMPLATES[name]


def template_names() -> tuple[str, ...]:
    return tuple(sorted(_TEMPLATES))


def op_templates() -> dict[str, OpTemplate]:
    """The templates with layout conversion (all but the skeleton's matmul), by name."""
    return {n: t for n, t in _TEMPLATES.items() if isinstance(t, OpTemplate)}

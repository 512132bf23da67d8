"""Graph passes, each `Graph -> Graph` on a new graph (fusion and memory planning build plans).

Run in this order for inference: `fold_batch_norm`, `fold_scale_into_conv`, `fold_constants`,
`eliminate_common_subexpressions`, `eliminate_dead_code`, `shuffles_to_gathers`, `to_nchwc`, then `fuse` and
`plan_memory` on its result. Importing this package registers the NCHW[x]c ops the layout pass
emits (`compiler.graph.ops_layout`).
"""

from __future__ import annotations

from compiler.graph import ops, ops_layout  # noqa: F401  (registers the ops the passes emit)
from compiler.graph.passes.channel_shuffle import shuffles_to_gathers
from compiler.graph.passes.cse import eliminate_common_subexpressions
from compiler.graph.passes.dce import eliminate_dead_code
from compiler.graph.passes.fold_constants import fold_constants
from compiler.graph.passes.fuse import FusedGroup, FusionPlan, fuse
from compiler.graph.passes.layout import cancel_layout_transforms, default_block, to_nchwc
from compiler.graph.passes.memory_plan import MemoryPlan, plan_memory
from compiler.graph.passes.simplify_inference import fold_batch_norm, fold_scale_into_conv

__all__ = [
    "FusedGroup",
    "FusionPlan",
    "MemoryPlan",
    "cancel_layout_transforms",
    "default_block",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fold_batch_norm",
    "fold_constants",
    "fold_scale_into_conv",
    "fuse",
    "plan_memory",
    "shuffles_to_gathers",
    "to_nchwc",
]

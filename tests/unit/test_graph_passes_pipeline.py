"""The passes in their inference order on a small ResNet: outputs kept, plans consistent."""

from __future__ import annotations

import numpy as np

from compiler.graph import Graph
from compiler.graph.execute import run_reference
from compiler.graph.passes import (
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_batch_norm,
    fold_constants,
    fold_scale_into_conv,
    fuse,
    plan_memory,
    to_nchwc,
)
from compiler.graph.passes.rewrite import add_op


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.g = Graph("resnet_tiny")

    def const(self, name: str, *shape: int, lo: float = -1.0, hi: float = 1.0) -> str:
        return self.g.add_constant(name, self.rng.uniform(lo, hi, shape).astype(np.float32))

    def conv_bn(self, x: str, oc: int, k: int, stride: int, relu: bool) -> str:
        ic = self.g.type_of(x).shape[1]
        scale = 1.0 / np.sqrt(ic * k * k)
        w = self.const("w", oc, ic, k, k, lo=-scale, hi=scale)
        attrs = {"strides": (stride, stride), "pads": (k // 2,) * 4}
        (y,) = add_op(self.g, "conv2d", [x, w], attrs)
        bn = [self.const(p, oc) for p in ("gamma", "beta", "mean")]
        bn.append(self.const("var", oc, lo=0.5, hi=1.5))
        (y,) = add_op(self.g, "batch_norm", [y, *bn], {"epsilon": 1e-5})
        return add_op(self.g, "relu", [y])[0] if relu else y

    def block(self, x: str, oc: int, stride: int) -> str:
        y = self.conv_bn(self.conv_bn(x, oc, 3, stride, True), oc, 3, 1, False)
        skip = x if stride == 1 else self.conv_bn(x, oc, 1, stride, False)
        (s,) = add_op(self.g, "add", [y, skip])
        return add_op(self.g, "relu", [s])[0]


def _resnet_tiny() -> Graph:
    b = _Builder(21)
    g = b.g
    x = g.add_input("image", (1, 3, 32, 32))
    y = b.conv_bn(x, 16, 3, 1, True)
    (y,) = add_op(g, "max_pool2d", [y], {"kernel": (3, 3), "strides": (2, 2), "pads": (1,) * 4})
    y = b.block(b.block(y, 16, 1), 32, 2)
    (y,) = add_op(g, "global_avg_pool2d", [y])
    (y,) = add_op(g, "reshape", [y], {"shape": (1, 32)})
    # the classifier's weight arrives transposed, as ONNX exporters often leave it
    (fc,) = add_op(g, "transpose", [b.const("fc_t", 10, 32)], {"perm": (1, 0)})
    (y,) = add_op(g, "dense", [y, fc, b.const("fc_b", 10)])
    g.set_outputs([y])
    return g


def test_inference_pipeline_keeps_outputs_and_gives_consistent_plans() -> None:
    g = _resnet_tiny()
    out = g
    for p in (
        fold_batch_norm,
        fold_scale_into_conv,
        fold_constants,
        eliminate_common_subexpressions,
        eliminate_dead_code,
        to_nchwc,
    ):
        out = p(out)
        out.verify()
    ops = out.op_counts()
    assert "batch_norm" not in ops and "transpose" not in ops and "conv2d" not in ops
    assert ops["conv2d_nchwc"] == 6 and ops["layout_transform"] == 2
    rng = np.random.default_rng(0)
    feeds = {"image": rng.uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)}
    (want,), (got,) = run_reference(g, feeds), run_reference(out, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    plan = fuse(out)
    anchored = [grp for grp in plan.groups if grp.anchor.op == "conv2d_nchwc"]
    assert len(anchored) == 6
    # both residual adds (and their ReLUs) ride in the second convolution of their block
    assert sum(grp.ops[-2:] == ("add", "relu") for grp in anchored) == 2
    by_node, by_group = plan_memory(out), plan_memory(plan)
    by_node.check()
    by_group.check()
    assert by_group.total <= by_node.total
    assert by_group.total >= by_group.lower_bound
    print(plan.summary())
    print("per node:", by_node.summary())
    print("per group:", by_group.summary())

"""Dead-code elimination, common-subexpression elimination and constant folding, each alone."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.graph import Graph, GraphError
from compiler.graph.execute import run_reference
from compiler.graph.passes import (
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
)
from compiler.graph.passes.rewrite import add_op


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _feeds(g: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {v: rng.standard_normal(g.type_of(v).shape).astype(g.type_of(v).dtype) for v in g.inputs}


def _same_outputs(a: Graph, b: Graph) -> None:
    feeds = _feeds(a, _rng())
    for x, y in zip(run_reference(a, feeds), run_reference(b, feeds), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


# -- dead code ------------------------------------------------------------------------------------


def _graph_with_dead_code() -> Graph:
    g = Graph("dead")
    x = g.add_input("x", (2, 8))
    unused_input = g.add_input("unused", (3,))
    w = g.add_constant("w", _rng().standard_normal((8, 4)).astype(np.float32))
    g.add_constant("never_read", np.ones(5, np.float32))
    dead_w = g.add_constant("dead_w", np.ones((8, 8), np.float32))
    (y,) = add_op(g, "matmul", [x, w])
    (z,) = add_op(g, "relu", [y])
    (d1,) = add_op(g, "matmul", [x, dead_w])  # reaches nothing
    add_op(g, "sigmoid", [d1])
    add_op(g, "neg", [unused_input])
    g.set_outputs([z])
    return g


def test_dce_removes_nodes_constants_and_types_not_reaching_outputs() -> None:
    g = _graph_with_dead_code()
    out = eliminate_dead_code(g)
    assert [n.op for n in out.nodes] == ["matmul", "relu"]
    assert set(out.constants) == {"w"}
    assert out.inputs == ["x", "unused"]  # the interface stays
    assert set(out.types) == {"x", "unused", "w", *(o for n in out.nodes for o in n.outputs)}
    out.verify()
    _same_outputs(g, out)


def test_dce_leaves_its_argument_alone_and_keeps_multi_output_nodes_whole() -> None:
    g = _graph_with_dead_code()
    before = str(g)
    eliminate_dead_code(g)
    assert str(g) == before
    s = Graph("split")
    x = s.add_input("x", (4, 6))
    a, b = add_op(s, "split", [x], {"axis": 1, "sizes": (2, 4)})
    (r,) = add_op(s, "relu", [a])
    s.set_outputs([r])
    out = eliminate_dead_code(s)
    assert out.op_counts() == {"split": 1, "relu": 1}
    assert b in out.types  # the unread second output is still defined by the kept split


# -- common subexpressions ------------------------------------------------------------------------


def test_cse_merges_equal_nodes_and_constants() -> None:
    g = Graph("cse")
    x = g.add_input("x", (2, 4))
    c1 = g.add_constant("c1", np.full((4,), 2.0, np.float32))
    c2 = g.add_constant("c2", np.full((4,), 2.0, np.float32))
    c3 = g.add_constant("c3", np.full((4,), 2.0, np.float64))  # same values, other dtype
    (a1,) = add_op(g, "mul", [x, c1])
    (a2,) = add_op(g, "mul", [c2, x])  # same after merging c2 into c1, commuted
    (r1,) = add_op(g, "relu", [a1])
    (r2,) = add_op(g, "relu", [a2])
    (s,) = add_op(g, "add", [r1, r2])
    (k1,) = add_op(g, "clip", [s], {"min": 0.0, "max": 1.0})
    (k2,) = add_op(g, "clip", [s], {"min": 0.0, "max": 2.0})  # different attrs: kept
    (cast,) = add_op(g, "cast", [c3], {"dtype": "float32"})
    (o,) = add_op(g, "add", [k1, k2])
    (o2,) = add_op(g, "add", [o, cast])
    g.set_outputs([o2, r2])
    out = eliminate_common_subexpressions(g)
    assert out.op_counts() == {"mul": 1, "relu": 1, "add": 3, "clip": 2, "cast": 1}
    assert set(out.constants) == {"c1", "c3"}
    assert out.outputs == [o2, r1]  # the duplicate output now names the value it duplicated
    _same_outputs(g, out)


def test_cse_keeps_ops_whose_inputs_differ_in_order_when_not_commutative() -> None:
    g = Graph("sub")
    x = g.add_input("x", (3,))
    y = g.add_input("y", (3,))
    (a,) = add_op(g, "sub", [x, y])
    (b,) = add_op(g, "sub", [y, x])
    g.set_outputs([a, b])
    assert eliminate_common_subexpressions(g).op_counts() == {"sub": 2}


# -- constant folding -----------------------------------------------------------------------------


def test_fold_constants_evaluates_constant_subgraphs_exactly() -> None:
    rng = _rng()
    g = Graph("fold")
    x = g.add_input("x", (2, 6))
    w = g.add_constant("w", rng.standard_normal((6, 3)).astype(np.float32))
    s = g.add_constant("s", np.float32(0.5) * np.ones((3,), np.float32))
    (wt,) = add_op(g, "transpose", [w], {"perm": (1, 0)})
    (wt2,) = add_op(g, "transpose", [wt], {"perm": (1, 0)})
    (ws,) = add_op(g, "mul", [wt2, s])
    (y,) = add_op(g, "matmul", [x, ws])
    (b,) = add_op(g, "exp", [s])
    (z,) = add_op(g, "add", [y, b])
    g.set_outputs([z, b])
    out = fold_constants(g)
    assert out.op_counts() == {"matmul": 1, "add": 1}
    np.testing.assert_array_equal(out.constants[ws], g.constants[w] * g.constants[s])
    np.testing.assert_array_equal(out.constants[b], np.exp(g.constants[s]))
    assert "w" not in out.constants and out.outputs == [z, b]  # the folded output is a constant
    feeds = _feeds(g, rng)
    for want, got in zip(run_reference(g, feeds), run_reference(out, feeds), strict=True):
        np.testing.assert_array_equal(want, got)


def test_fold_constants_skips_results_over_the_size_limit() -> None:
    g = Graph("big")
    x = g.add_input("x", (64, 64))
    c = g.add_constant("c", np.ones((1, 64), np.float32))
    z = g.add_constant("z", np.ones((64, 1), np.float32))
    (big,) = add_op(g, "add", [c, z])  # a 16 KiB broadcast of two small constants
    (y,) = add_op(g, "mul", [x, big])
    g.set_outputs([y])
    assert fold_constants(g, max_bytes=1024).op_counts() == {"add": 1, "mul": 1}
    assert fold_constants(g, max_bytes=64 * 64 * 4).op_counts() == {"mul": 1}


def test_fold_constants_names_a_reference_that_disagrees_with_the_type() -> None:
    g = Graph("bad")
    c = g.add_constant("c", np.ones((2, 3), np.float32))
    g.add_node("relu", [c], [g.type_of(c).__class__((3, 2))], name="liar")
    g.set_outputs([g.nodes[0].outputs[0]])
    with pytest.raises(GraphError, match="liar"):
        fold_constants(g)

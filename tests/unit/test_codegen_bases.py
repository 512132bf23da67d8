"""Shared base pointers (compiler/codegen/bases.py): accesses of a block that differ by a constant
go through one pointer, nothing is hoisted where its variables are not bound, and kernels built
with them compute exactly what they compute without."""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from compiler import build as compiler_build
from compiler.codegen.c import FunctionWriter, render_c
from compiler.ir import (
    And,
    Buffer,
    FloatImm,
    For,
    ForKind,
    IntImm,
    Load,
    PrimFunc,
    Select,
    Seq,
    Store,
    Var,
)
from compiler.ops.base import OpTemplate
from compiler.toolchain import compile_shared
from device_agent import abi
from tuner.records import Workload
from tuner.task import Task


def _kernel(src: str, symbol: str) -> str:
    start = src.index(f"int32_t {symbol}(")
    return src[start : src.index("return 0;", start)]


def test_accesses_that_differ_by_a_constant_share_one_pointer() -> None:
    x, y = Buffer("x", (32,), "float32"), Buffer("y", (8,), "float32")
    i = Var("i")
    four = i * 4
    body = Seq(
        (
            Store(y, i, Load(x, four + 1) + Load(x, four + 3) - Load(x, four + 2)),
            Store(y, i, Load(y, i) * 2.0),
        )
    )
    src = _kernel(
        render_c([(PrimFunc("f", (x, y), For(i, IntImm(8), ForKind.SERIAL, body)), "f")]), "f"
    )
    assert "float *x_at = &x[(i * 4)];" in src
    assert "x_at[1]" in src and "x_at[3]" in src and "x_at[2]" in src
    # y[i] is read and written (twice): one pointer for that too, at offset 0
    assert "float *y_at = &y[i];" in src and "y_at[0] = (y_at[0] * 2.0f);" in src
    assert "\x01" not in src


def test_an_access_used_once_keeps_its_plain_index() -> None:
    x, y = Buffer("x", (32,), "float32"), Buffer("y", (8,), "float32")
    i = Var("i")
    body = Store(y, i, Load(x, i * 4 + 1))
    src = _kernel(
        render_c([(PrimFunc("f", (x, y), For(i, IntImm(8), ForKind.SERIAL, body)), "f")]), "f"
    )
    assert "_at" not in src
    assert "y[i] = x[(i * 4) + 1];" in src


def test_a_gathered_index_and_an_inner_loop_variable_are_never_hoisted() -> None:
    x, idx, y = (
        Buffer("x", (64,), "float32"),
        Buffer("idx", (8,), "int32"),
        Buffer("y", (64,), "float32"),
    )
    i, j = Var("i"), Var("j")
    gather = Store(y, i, Load(x, Load(idx, i)) + Load(x, Load(idx, i) + 1))
    inner = For(j, IntImm(8), ForKind.SERIAL, Store(y, i * 8 + j, Load(y, i * 8 + j) + 1.0))
    func = PrimFunc("f", (x, idx, y), For(i, IntImm(8), ForKind.SERIAL, Seq((gather, inner))))
    src = _kernel(render_c([(func, "f")]), "f")
    # x's index reads memory: plain x[...] both times (idx[i], read twice, may share a pointer)
    assert "float *x_at" not in src and src.count("&x[") == 0 and src.count("x[") >= 2
    # y[i * 8 + j] is shared inside j's loop, declared after it starts, never above it
    declaration = src.index("float *y_at")
    assert src.index("for (int32_t j = 0;") < declaration
    assert "&y[((i * 8) + j)]" in src[declaration:]
    assert "\x01" not in src


def test_accesses_c_may_not_evaluate_keep_plain_indices() -> None:
    """A ?: arm or the right side of && runs only past its guard: no pointer is formed for it
    ahead of the guard."""
    x, y = Buffer("x", (40,), "float32"), Buffer("y", (8,), "float32")
    i = Var("i")
    shifted = (i - 1) * 4  # one term: at i = 0 its pointer would be x - 4
    padded = Select(i > 0, Load(x, shifted + 1) + Load(x, shifted + 2), FloatImm(0.0))
    guarded = Select(And(i > 0, Load(x, shifted + 3) > 0.0), FloatImm(1.0), FloatImm(0.0))
    body = Store(y, i, padded + guarded)
    src = _kernel(
        render_c([(PrimFunc("f", (x, y), For(i, IntImm(8), ForKind.SERIAL, body)), "f")]), "f"
    )
    assert "_at" not in src
    assert "x[(((i - 1) * 4) + 1)]" in src
    assert "\x01" not in src


@pytest.mark.parametrize("seed", [0, 1])
def test_a_kernel_computes_the_same_with_and_without_shared_bases(
    seed: int, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """A dense candidate (register tile, packing, tails) built both ways: the same bits out,
    and numpy's product within float32 rounding."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    workload = Workload("dense", (40, 72, 24))
    task = Task(workload)
    template = task.template
    assert isinstance(template, OpTemplate)
    rng = random.Random(seed)
    index = next(
        i
        for i in iter(lambda: rng.randrange(len(task.space)), None)
        if task.worth_measuring(i, "host")
    )
    data = np.random.default_rng(seed)
    a = data.standard_normal((40, 24)).astype(np.float32)
    b = data.standard_normal((24, 72)).astype(np.float32)
    outputs, sources = [], []
    for share in (True, False):
        monkeypatch.setattr(FunctionWriter, "share_bases", share)
        sch, tensors = task.template.instantiate(workload.shape, task.space.get(index))
        kernel = compiler_build.Kernel(sch, tensors, "kiln_dense", task.flop)
        source = compiler_build.build_source_many([kernel], "host")
        lib = ctypes.CDLL(str(compile_shared(source, "host").path))
        config = task.space.get(index)
        inputs = template.pack_inputs(workload.shape, config, [a, b])
        out = np.zeros([int(d) for d in tensors[-1].shape], np.float32)
        buffers = [*inputs, out]
        assert abi.bind_entry(lib, "kiln_dense")(abi.pack_args(buffers)) == 0
        outputs.append(template.unpack_output(workload.shape, config, out))
        sources.append(_kernel(source, "kiln_dense"))
    assert "_at = &" in sources[0] and "_at = &" not in sources[1]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_allclose(outputs[0], a @ b, rtol=1e-4, atol=1e-4)

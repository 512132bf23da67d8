"""C rendering (no compiler run here): ABI, vector extension code, pragmas, names; target table."""

from __future__ import annotations

import re

import pytest

from compiler import ops, te, toolchain
from compiler.build import build_source
from compiler.codegen.c import check_symbol, render_c
from compiler.errors import BuildError, CodegenError
from compiler.ir import Buffer, Expr, FloorDiv, For, ForKind, IntImm, Load, PrimFunc, Store, Var
from compiler.schedule import create_schedule

MATMUL = ops.get_template("matmul")


def matmul_source(shape: tuple[int, int, int], **knobs: object) -> str:
    space = MATMUL.config_space(shape)
    sch, args = MATMUL.instantiate(shape, space.get(space.index_of(knobs)))
    return build_source(sch, args, "mm", target="x86_64-avx512")  # 64-byte vectors, any host


def test_packed_abi_and_timing_entry() -> None:
    src = matmul_source((8, 8, 8), tile_m=8, tile_n=8, tile_k=8, vectorize=False, unroll=False)
    assert "int32_t mm(void **args) {" in src
    assert "float *restrict B = (float *)args[1];" in src
    assert "int32_t mm__time(void **args, const kiln_timing_config *cfg, double *samples_s," in src
    # the timing loop lives in the harness, which needs POSIX clocks; a kernel needs none
    assert "_POSIX_C_SOURCE" not in src and "clock_gettime(" not in src


def test_vectorized_inner_loop_uses_vector_extensions() -> None:
    src = matmul_source((8, 16, 8), tile_m=4, tile_n=16, tile_k=4, vectorize=True, unroll=True)
    assert "typedef float kiln_vec_float32x16 __attribute__((vector_size(64)));" in src
    # C tile += A scalar (broadcast) * B row, as one vector statement
    assert "kiln_vstore_float32x16(&C[" in src  # the init
    # the update reads and writes C and reads B through base pointers (codegen.bases)
    assert "kiln_vload_float32x16(&C_at[0])" in src and "kiln_vload_float32x16(&B_at[16])" in src
    # the k tile (4) is unrolled in the IR: one vector update statement per k, after the init
    assert src.count("kiln_vstore_float32x16(&C") == 1 + 4


def test_wide_vector_loop_becomes_one_statement_per_register() -> None:
    src = matmul_source((4, 64, 4), tile_m=1, tile_n=64, tile_k=4, vectorize=True, unroll=False)
    assert "kiln_vec_float32x64" not in src
    assert src.count("kiln_vstore_float32x16(&C") == 2 * 4  # init and update, 4 chunks each
    assert "float *B_at = &B[(k_i * 64)];" in src and "kiln_vload_float32x16(&B_at[48])" in src


def test_vectorized_tail_is_partitioned_into_power_of_two_vectors() -> None:
    src = matmul_source((5, 13, 3), tile_m=1, tile_n=8, tile_k=1, vectorize=True, unroll=False)
    start = src.index("int32_t mm(")
    kernel = src[start : src.index("return 0;", start)]
    # C's row through a base pointer (codegen.bases) `C_at...` = &C[(m_o * 13)]
    assert re.search(r"kiln_vstore_float32x8\(&C_at\w*\[0\]", kernel)  # the main tile
    assert re.search(r"kiln_vstore_float32x4\(&C_at\w*\[8\]", kernel)  # tail: 5 = 4 lanes + 1
    assert re.search(r"C_at\w*\[12\] = 0.0f;", kernel)
    assert "?" not in kernel and "ivdep" not in kernel and "if (" not in kernel


def test_unqualified_vector_loop_falls_back_to_ivdep() -> None:
    x, y = Buffer("x", (12,), "float32"), Buffer("y", (12,), "float32")
    i = Var("i")
    body = Store(y, i, Load(x, FloorDiv(i, IntImm(2))))  # not linear in i
    src = render_c([(PrimFunc("f", (x, y), For(i, IntImm(12), ForKind.VECTORIZED, body)), "f")])
    assert "kiln_vstore" not in src
    assert "#pragma GCC ivdep\n  for (int32_t i = 0; i < 12; ++i) {" in src
    assert "kiln_floordiv_int32(i, 2)" in src


def test_shifted_self_read_is_not_vectorized() -> None:
    y = Buffer("y", (17,), "float32")
    i = Var("i")
    body = Store(y, i + 1, Load(y, i) * 2.0)  # lane i+1 reads lane i: a scalar recurrence
    src = render_c([(PrimFunc("f", (y,), For(i, IntImm(16), ForKind.VECTORIZED, body)), "f")])
    assert "kiln_vstore" not in src


def test_names_are_made_unique_and_legal() -> None:
    x = te.placeholder((4,), name="x")
    y = te.compute((4,), lambda int: x[int] + 1.0, name="out.put")
    src = build_source(create_schedule(y), [x, y], "f")
    assert "float *restrict out_put = (float *)args[1];" in src
    assert "for (int32_t int_1 = 0;" in src


@pytest.mark.parametrize("bad", ["1x", "a-b", "static", "kiln_vload_x", "f__time", ""])
def test_bad_symbols(bad: str) -> None:
    with pytest.raises(CodegenError, match="not a usable C function name"):
        check_symbol(bad)


def test_target_table() -> None:
    host = toolchain.host_target()
    assert host.name in toolchain.TARGETS
    assert "-march=native" in host.flags or "-mcpu=native" in host.flags
    assert toolchain.get_target("x86_64-avx2").flags[-1] == "-march=x86-64-v3"
    with pytest.raises(BuildError, match="unknown target 'riscv'"):
        toolchain.get_target("riscv")


def test_nested_max_renders_in_linear_size() -> None:
    # A 12-wide sliding maximum written as a chain of maxima: a ?: rendering repeats both operands
    # at each level, so its size doubles per term (9 terms of a pooling window once took 40 MB).
    a = te.placeholder((16, 28), name="A")

    def window(i: Var, j: Var) -> Expr:
        acc: Expr = a[i, j]
        for d in range(1, 12):
            acc = te.maximum(acc, a[i, j + d])
        return acc

    c = te.compute((16, 16), window, name="C")
    src = build_source(create_schedule(c), [a, c], "slide")
    assert "kiln_max_float32(" in src
    assert len(src) < 20_000, len(src)


def test_nested_max_in_a_vectorized_loop_renders_in_linear_size() -> None:
    a = te.placeholder((4, 80), name="A")

    def window(i: Var, j: Var) -> Expr:
        acc: Expr = a[i, j]
        for d in range(1, 12):
            acc = te.maximum(acc, a[i, j + d])
        return acc

    c = te.compute((4, 64), window, name="C")
    s = create_schedule(c)
    _, ji = s[c].split(s[c].axis[1], 16)
    s[c].vectorize(ji)
    src = build_source(s, [a, c], "vslide", target="x86_64-avx512")
    assert "kiln_vmax_float32x16(" in src
    assert len(src) < 20_000, len(src)

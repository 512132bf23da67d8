"""Render vectorized loops with GCC vector extensions, so SIMD code need not wait on auto-vectorizing.

A loop qualifies when its extent is a power of two from 2 to 64 lanes (or `min(lanes, rest)`, in
which case a full-width check picks the vector or the scalar path at run time) and its body is
one store whose index moves by one element per iteration, of a value built from +, -, *, /,
min, max, select, exp and erf (`vector_math`), and integer &, |, ^, ~ of loads that move by one
element (vector loads) or not at all (broadcast scalars). A loop with any other call (floor, sin,
isnan, a shift, ...) stays a scalar loop, which gcc may still vectorize itself. Unaligned
memory is read and written through memcpy, which gcc turns into single unaligned moves. Loops
wider than one 64-byte register become one vector statement per register-wide chunk. A slice of
a register-promoted buffer is its vector variables themselves (assigned and read, no memcpy);
a loop whose lanes do not match that buffer's slot takes the scalar path.

A vectorized loop with the pragma NONTEMPORAL (`Stage.pragma(axis, "nontemporal")`) stores through
`kiln_vstream_*`: a streaming (non-temporal) store where the target has one for the vector's width
and the address is aligned to it, else the ordinary store. Streaming stores write around the
caches: an output written once and not read again soon then neither evicts the kernel's inputs
nor is read in before being overwritten. They are weakly ordered, so the C renderer fences them
(`kiln_stream_fence`) at the end of each parallel iteration that issues them and before the
function returns.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compiler.arith import const_bounds
from compiler.arith.linear import linear_form
from compiler.codegen.ctypes import C_TYPES, constant_bound
from compiler.ir import expr as E
from compiler.ir.buffer import Buffer
from compiler.ir.stmt import For, ForKind, Store

if TYPE_CHECKING:
    from compiler.codegen.c import FunctionWriter

_ITEM_BYTES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8}
VECTOR_DTYPES = frozenset(_ITEM_BYTES)
MAX_LANES = 64
# One AVX-512 register. Wider vector types would be aligned past what the stack guarantees, and
# gcc splits a 64-byte type into two on AVX2 hosts; a per-target width comes with target-aware codegen.
MAX_VECTOR_BYTES = 64
_OPS = {E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/"}
_CMP = {E.LT: "<", E.LE: "<=", E.EQ: "==", E.NE: "!="}
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}
_MASK_DTYPE = {"float32": "int32", "float64": "int64", "int32": "int32", "int64": "int64"}
NONTEMPORAL = "nontemporal"  # pragma of a vectorized loop: stream its stores past the caches
# x86 streaming stores by (dtype kind, vector bytes): the macro that says the target has the
# instruction, the intrinsic, and the intrinsic's vector type.
_STREAM = {
    ("float32", 16): ("__SSE__", "_mm_stream_ps", "__m128"),
    ("float32", 32): ("__AVX__", "_mm256_stream_ps", "__m256"),
    ("float32", 64): ("__AVX512F__", "_mm512_stream_ps", "__m512"),
    ("float64", 16): ("__SSE2__", "_mm_stream_pd", "__m128d"),
    ("float64", 32): ("__AVX__", "_mm256_stream_pd", "__m256d"),
    ("float64", 64): ("__AVX512F__", "_mm512_stream_pd", "__m512d"),
    ("int", 16): ("__SSE2__", "_mm_stream_si128", "__m128i"),
    ("int", 32): ("__AVX__", "_mm256_stream_si256", "__m256i"),
    ("int", 64): ("__AVX512F__", "_mm512_stream_si512", "__m512i"),
}
STREAM_PRELUDE = r"""#if defined(__SSE__)
#include <immintrin.h>
#endif
/* Streaming stores are weakly ordered: fence them before other threads may read their data. */
static inline void kiln_stream_fence(void) {
#if defined(__SSE__)
  _mm_sfence();
#endif
}
"""


def vector_type(dtype: str, lanes: int) -> str:
    return f"kiln_vec_{dtype}x{lanes}"


def vector_helpers(dtype: str, lanes: int) -> str:
    """The typedef and unaligned load/store helpers of one vector type."""
    vt, ct, suffix = vector_type(dtype, lanes), C_TYPES[dtype], f"{dtype}x{lanes}"
    size = lanes * _ITEM_BYTES[dtype]
    return (
        f"typedef {ct} {vt} __attribute__((vector_size({size})));\n"
        f"static inline {vt} kiln_vload_{suffix}(const {ct} *p) {{\n"
        f"  {vt} v;\n  memcpy(&v, p, sizeof v);\n  return v;\n}}\n"
        f"static inline void kiln_vstore_{suffix}({ct} *p, {vt} v) {{ memcpy(p, &v, sizeof v); }}\n"
        + (_minmax_helpers(dtype, suffix, vt, size) if dtype in _MASK_DTYPE else "")
    )


def stream_helper(dtype: str, lanes: int) -> str:
    """`kiln_vstream_<dtype>x<lanes>`: a streaming store where the target has one and the address
    is aligned to the vector's size (the instruction faults otherwise), else `kiln_vstore_*`."""
    vt, ct, suffix = vector_type(dtype, lanes), C_TYPES[dtype], f"{dtype}x{lanes}"
    size = lanes * _ITEM_BYTES[dtype]
    head = f"static inline void kiln_vstream_{suffix}({ct} *p, {vt} v) {{\n"
    tail = f"  kiln_vstore_{suffix}(p, v);\n}}\n"
    found = _STREAM.get((dtype if dtype.startswith("float") else "int", size))
    if found is None:
        return head + tail
    macro, intrinsic, itype = found
    pointer = f"({itype} *)p" if itype.endswith("i") else "p"
    return (
        f"{head}#if defined({macro})\n"
        f"  if (((uintptr_t)p & {size - 1}) == 0) {{\n"
        f"    {intrinsic}({pointer}, ({itype})v);\n    return;\n  }}\n#endif\n{tail}"
    )


def _minmax_helpers(dtype: str, suffix: str, vt: str, size: int) -> str:
    """Lane-wise min/max as functions: C has no vector ?:, and a select written inline would
    repeat its operands, doubling the code at every level of a nested min/max."""
    mt = f"kiln_mask_{suffix}"
    lines = [f"typedef {C_TYPES[_MASK_DTYPE[dtype]]} {mt} __attribute__((vector_size({size})));"]
    for name, op in (("min", "<"), ("max", ">")):
        lines.append(
            f"static inline {vt} kiln_v{name}_{suffix}({vt} a, {vt} b) {{ {mt} m = ({mt})(a {op} b);"
            f" return ({vt})((({mt})a & m) | (({mt})b & ~m)); }}"
        )
    return "\n".join(lines) + "\n"


def render_vector_loop(w: FunctionWriter, loop: For, depth: int) -> list[str] | None:
    """C lines for `loop` in vector form, or None when the loop does not qualify."""
    lanes = constant_bound(loop.extent)
    store = loop.body
    if (
        lanes is None
        or not 2 <= lanes <= MAX_LANES
        or lanes & (lanes - 1)
        or not isinstance(store, Store)
        or store.buffer.dtype not in VECTOR_DTYPES
    ):
        return None
    if isinstance(loop.extent, E.IntImm) and loop.extent.value != lanes:
        return None
    form = linear_form(store.index, loop.var)
    if form is None or form[0] != 1:
        return None
    dtype = store.buffer.dtype
    stream = is_nontemporal(loop)
    # Wider than one vector register: several register-wide statements, one per chunk of lanes.
    width = min(lanes, w.vector_bytes // _ITEM_BYTES[dtype])
    lines: list[str] = []
    for offset in range(0, lanes, width):
        chunk = _Chunk(loop.var, store, width, offset, "", lanes)
        target = chunk.element(w, store.buffer, form[1])
        if target is None:
            return None
        chunk.target = target
        value = _vector_expr(w, store.value, chunk)
        if value is None:
            return None
        code, is_vector = value
        if not is_vector:
            # scalar - {0} broadcasts the scalar and, unlike {0} + scalar, keeps the sign of -0.0.
            code = f"({code} - ({vector_type(dtype, width)}){{0}})"
        if w.in_registers(store.buffer):
            lines.append(f"{chunk.target} = {code};")
        elif stream:
            lines.append(f"kiln_vstream_{dtype}x{width}(&{chunk.target}, {code});")
        else:
            lines.append(f"kiln_vstore_{dtype}x{width}(&{chunk.target}, {code});")
    w.vec_types.add((dtype, width))
    if stream and not w.in_registers(store.buffer):
        w.stream_types.add((dtype, width))
        w.stream_stores += len(lines)
    pad = "  " * depth
    if isinstance(loop.extent, E.IntImm):
        return [pad + line for line in lines]
    # The tail of a split that does not divide its axis: full tiles take the vector path.
    v = w.name(loop.var)
    return [
        f"{pad}if ({w.expr(loop.extent)} == {lanes}) {{",
        *(f"{pad}  {line}" for line in lines),
        f"{pad}}} else {{",
        f"{pad}  #pragma GCC ivdep",
        f"{pad}  for (int32_t {v} = 0; {v} < {w.expr(loop.extent)}; ++{v}) {{",
        *w.block(lambda: w.stmt(store, depth + 2), depth + 2, loop.var),
        f"{pad}  }}",
        f"{pad}}}",
    ]


def is_nontemporal(loop: For) -> bool:
    """Whether the schedule asked `loop`, a vectorized loop, to stream its stores."""
    return loop.kind is ForKind.VECTORIZED and any(
        key == NONTEMPORAL and value for key, value in loop.pragmas
    )


@dataclass
class _Chunk:
    """Lanes [offset, offset + width) of a vectorized loop over `var` whose body is `store`."""

    var: E.Var
    store: Store
    width: int
    offset: int
    target: str  # the C element the chunk's store starts at
    lanes: int  # of the whole loop
    # id(sub-expression) -> whether it reads `var`, for `reads_var` (the store keeps them alive)
    _reads: dict[int, bool] = field(default_factory=dict)

    def reads_var(self, e: E.Expr) -> bool:
        """Whether `e` reads the loop's var, each sub-expression looked at once per chunk
        (`E.free_vars` at every level of `_vector_expr` was quadratic in an expression's
        depth: 2.8 of 10 s lowering 16 Winograd tile-4 candidates, their unrolled sums deep)."""
        known = self._reads.get(id(e))
        if known is None:
            if isinstance(e, E.Var):
                known = e is self.var
            else:
                known = any(self.reads_var(c) for c in E.children(e))
            self._reads[id(e)] = known
        return known

    def element(self, w: FunctionWriter, buf: Buffer, rest: E.Expr) -> str | None:
        """The C element the chunk's lanes of `buf[rest + var]` start at; for a register-promoted
        buffer the vector variable holding them, or None when no variable holds exactly them."""
        if w.in_registers(buf):
            bounds = const_bounds(rest, {}) if not E.free_vars(rest) else None
            if bounds is None or bounds[0] != bounds[1]:
                return None
            start = bounds[0]
            if buf.register_slot(start) != (start, self.lanes):
                return None
            if w.register_width(buf, start) != self.width:
                return None
            return w.register_name(buf, start + self.offset)
        return w.element(buf, rest, self.offset)


def _vector_expr(w: FunctionWriter, e: E.Expr, chunk: _Chunk) -> tuple[str, bool] | None:
    """(C code, whether it is a vector) for `e` over the chunk's lanes, or None if unsupported."""
    if not chunk.reads_var(e):
        return w.expr(e), False
    if isinstance(e, E.Load):
        form = linear_form(e.index, chunk.var)
        if form is None or form[0] not in (0, 1):
            return None
        if form[0] == 0:
            if e.buffer is chunk.store.buffer:
                return None  # another element of the buffer being written: lanes out of order
            return w.expr(E.Load(e.buffer, form[1])), False
        element = chunk.element(w, e.buffer, form[1])
        if element is None:
            return None
        if e.buffer is chunk.store.buffer and element != chunk.target:
            # Reading other elements of the buffer being written would see lanes out of order.
            return None
        if w.in_registers(e.buffer):
            return element, True
        return f"kiln_vload_{e.dtype}x{chunk.width}(&{element})", True
    if type(e) in _OPS:
        assert isinstance(e, E.BinaryOp)
        if isinstance(e, E.Div) and e.dtype not in E.FLOAT_DTYPES:
            return None
        a = _vector_expr(w, e.a, chunk)
        b = _vector_expr(w, e.b, chunk)
        if a is None or b is None:
            return None
        return f"({a[0]} {_OPS[type(e)]} {b[0]})", a[1] or b[1]
    if isinstance(e, E.Min | E.Max):
        if e.dtype not in _MASK_DTYPE:
            return None
        a = _vector_expr(w, e.a, chunk)
        b = _vector_expr(w, e.b, chunk)
        if a is None or b is None:
            return None
        vt = vector_type(e.dtype, chunk.width)
        w.vec_types.add((e.dtype, chunk.width))
        av = a[0] if a[1] else f"({a[0]} - ({vt}){{0}})"
        bv = b[0] if b[1] else f"({b[0]} - ({vt}){{0}})"
        name = "min" if isinstance(e, E.Min) else "max"
        return f"kiln_v{name}_{e.dtype}x{chunk.width}({av}, {bv})", True
    if isinstance(e, E.Select):
        return _vector_select(w, e, chunk)
    if isinstance(e, E.Call) and e.name in (*_BITWISE, "bitwise_not") and e.dtype in VECTOR_DTYPES:
        # int32 / int64 only (the vector dtypes): no promotion, so no cast back is needed.
        parts = [_vector_expr(w, a, chunk) for a in e.args]
        if any(p is None for p in parts):
            return None
        codes = [p[0] for p in parts if p is not None]
        if e.name == "bitwise_not":
            return f"(~{codes[0]})", True
        return f"({codes[0]} {_BITWISE[e.name]} {codes[1]})", True
    if isinstance(e, E.Call) and e.name in ("exp", "erf") and e.dtype == "float32":
        (arg,) = e.args
        value = _vector_expr(w, arg, chunk)
        if value is None:
            return None
        vt = vector_type("float32", chunk.width)
        code = value[0] if value[1] else f"({value[0]} - ({vt}){{0}})"
        w.vec_types.update({("float32", chunk.width), ("int32", chunk.width)})
        w.vec_math.add((e.name, chunk.width))
        return f"kiln_v{e.name}_float32x{chunk.width}({code})", True
    return None


def _vector_select(w: FunctionWriter, e: E.Select, chunk: _Chunk) -> tuple[str, bool] | None:
    """select(cond, a, b) over lanes: (a & m) | (b & ~m) on the bits, m the lane mask of cond."""
    dtype = e.dtype
    if dtype not in _MASK_DTYPE:
        return None
    cond = e.condition
    uniform = not chunk.reads_var(cond)
    # One condition for every lane is a C ?:, which evaluates one arm (see `bases.conditional`);
    # a lane mask evaluates both.
    with w.bases.conditional() if uniform else contextlib.nullcontext():
        a = _vector_expr(w, e.true_value, chunk)
        b = _vector_expr(w, e.false_value, chunk)
    if a is None or b is None:
        return None
    vt = vector_type(dtype, chunk.width)
    if uniform:
        # One condition for every lane: a plain ?: between two values of the same type.
        av = a[0] if a[1] else f"({a[0]} - ({vt}){{0}})"
        bv = b[0] if b[1] else f"({b[0]} - ({vt}){{0}})"
        return f"({w.expr(cond)} ? {av} : {bv})", True
    if not isinstance(cond, E.LT | E.LE | E.EQ | E.NE) or cond.a.dtype != dtype:
        return None
    x = _vector_expr(w, cond.a, chunk)
    y = _vector_expr(w, cond.b, chunk)
    if x is None or y is None:
        return None
    mt = vector_type(_MASK_DTYPE[dtype], chunk.width)
    w.vec_types.add((_MASK_DTYPE[dtype], chunk.width))
    xv = x[0] if x[1] else f"({x[0]} - ({vt}){{0}})"
    mask = f"(({mt})({xv} {_CMP[type(cond)]} {y[0]}))"
    av = f"(({mt})({a[0]} - ({vt}){{0}}))" if not a[1] else f"(({mt}){a[0]})"
    bv = f"(({mt})({b[0]} - ({vt}){{0}}))" if not b[1] else f"(({mt}){b[0]})"
    return f"(({vt})(({av} & {mask}) | ({bv} & ~{mask})))", True

"""Vector forms of float32 math calls for vectorized loops: exp and erf, in GCC vector extensions.

libm's expf and erff are scalar calls; a softmax or a GELU spends most of its time in them. These
helpers compute all lanes at once with the same operations on any target (AVX-512, AVX2, NEON):

- exp: Cephes' expf. x = n ln2 + r with n = floor(x log2(e) + 1/2) and |r| <= ln2/2 (ln2 split
  in two constants), e^r by a degree-7 polynomial, 2^n put into the exponent bits. About 1 ulp
  for x in [-87.3, 88.4]; inputs are clamped to that range (so e^-inf = 1.2e-38, not 0).
- erf: x P(x^2) / Q(x^2) for |x| clamped to 4 (erf = 1 in float32 beyond 3.84), P of degree 6
  and Q of degree 4 in x^2: one branch, 10 FMAs and a division per vector. The coefficients are
  our own fit (`compiler.codegen.erf_fit` re-derives them): linearized least squares of the
  relative error on [0, 4], reweighted toward its maximum, 6.5e-8 in exact arithmetic; float32
  rounding makes it at most 2.8e-7 absolute (5 float32 spacings just below 1). It replaced a
  Taylor series below 1 and an erfc fit with an exp above, both computed for every lane: a GELU
  over BERT-tiny's 128 x 512 activations took 0.17-0.23 ms with it (Zen 3).
"""

from __future__ import annotations

from compiler.codegen.vector import vector_type

VECTOR_MATH = frozenset({"exp", "erf"})

_EXP_LO, _EXP_HI = -87.3365447504019, 88.3762626647949
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2)
_EXP_POLY2 = (1.6666665459e-1, 5.0000001201e-1)
# erf(x) = x P(s) / Q(s), s = x^2, |x| <= 4; highest power first (from `erf_fit`).
_ERF_P = (
    1.9111346782896277e-08,
    -1.942320399617864e-06,
    1.4728310736911708e-04,
    3.990395430626551e-03,
    5.152429003366616e-02,
    2.0712087750023364e-01,
    1.1283790939577052,
)
_ERF_Q = (
    1.0210728464504753e-03,
    1.4957696273856264e-02,
    1.1796892920744957e-01,
    5.168873464656026e-01,
    1.0,
)
_ERF_CLAMP = 4.0


def _f(value: float) -> str:
    return f"{value!r}f"


def _horner(
    vt: str, var: str, coefficients: list[float] | tuple[float, ...], into: str
) -> list[str]:
    """C statements leaving sum c_i var^(k-1-i) (highest power first) in `into`."""
    lines = [f"{into} = (({vt}){{0}}) + {_f(coefficients[0])};"]
    lines += [f"{into} = {into} * {var} + {_f(c)};" for c in coefficients[1:]]
    return lines


def vector_math_helper(name: str, lanes: int) -> str:
    """The C definition of `kiln_v<name>_float32x<lanes>` (needs the float32 and int32 vector
    types of that width, and the float32 min/max helpers, defined before it)."""
    vt, it = vector_type("float32", lanes), vector_type("int32", lanes)
    suffix = f"float32x{lanes}"
    if name == "exp":
        body = [
            f"x = kiln_vmax_{suffix}(kiln_vmin_{suffix}(x, (({vt}){{0}}) + {_f(_EXP_HI)}), "
            f"(({vt}){{0}}) + {_f(_EXP_LO)});",
            f"{vt} fx = x * {_f(1.44269504088896341)} + 0.5f;",
            f"{vt} t = __builtin_convertvector(__builtin_convertvector(fx, {it}), {vt});",
            f"t = t + __builtin_convertvector(({it})(t > fx), {vt});  /* floor: -1 where cut up */",
            f"x = x - t * {_f(0.693359375)} + t * {_f(2.12194440e-4)};",
            f"{vt} z = x * x;",
            f"{vt} y;",
            *_horner(vt, "x", _EXP_POLY + _EXP_POLY2, "y"),
            "y = y * z + x + 1.0f;",
            f"{it} n = (__builtin_convertvector(t, {it}) + 127) << 23;",
            f"return y * ({vt})n;",
        ]
    elif name == "erf":
        body = [
            f"{it} sign = ({it})x & (-2147483647 - 1);",
            f"{vt} a = ({vt})(({it})x & 2147483647);",
            f"a = kiln_vmin_{suffix}(a, (({vt}){{0}}) + {_f(_ERF_CLAMP)});",
            f"{vt} s = a * a;",
            f"{vt} p, q;",
            *_horner(vt, "s", _ERF_P, "p"),
            *_horner(vt, "s", _ERF_Q, "q"),
            f"{vt} r = kiln_vmin_{suffix}(a * p / q, (({vt}){{0}}) + 1.0f);",
            f"return ({vt})(({it})r | sign);",
        ]
    else:
        raise ValueError(f"no vector form of {name!r} (have {', '.join(sorted(VECTOR_MATH))})")
    lines = [f"static inline {vt} kiln_v{name}_{suffix}({vt} x) {{"]
    lines += [f"  {line}" for line in body]
    lines.append("}")
    return "\n".join(lines) + "\n"


def vector_math_helpers(calls: set[tuple[str, int]]) -> list[str]:
    """Definitions for every (name, lanes) used, in a fixed order (exp, then erf; by lanes)."""
    order = {"exp": 0, "erf": 1}
    return [vector_math_helper(n, k) for n, k in sorted(calls, key=lambda c: (order[c[0]], c[1]))]

"""Vector forms of float32 math calls for vectorized loops: exp and erf, in GCC vector extensions.

libm's expf and erff are scalar calls; a softmax or a GELU spends most of its time in them. These
helpers compute all lanes at once with the same operations on any target (AVX-512, AVX2, NEON):

- exp: Cephes' expf. x = n ln2 + r with n = floor(x log2(e) + 1/2) and |r| <= ln2/2 (ln2 split
  in two constants), e^r by a degree-7 polynomial, 2^n put into the exponent bits. About 1 ulp
  for x in [-87.3, 88.4]; inputs are clamped to that range (so e^-inf = 1.2e-38, not 0).
- erf: an odd Taylor polynomial for |x| < 1 (terms to x^23: truncation below 1e-9), and
  1 - erfc(|x|) above, with erfc by Numerical Recipes' Chebyshev fit
  t exp(-x^2 + P(t)), t = 1/(1 + x/2) (fractional error below 1.2e-7), clamped at |x| = 9
  (erf = 1 in float32 there); the sign of x is put back.
"""

from __future__ import annotations

import math

from compiler.codegen.vector import vector_type

VECTOR_MATH = frozenset({"exp", "erf"})

_EXP_LO, _EXP_HI = -87.3365447504019, 88.3762626647949
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2)
_EXP_POLY2 = (1.6666665459e-1, 5.0000001201e-1)
_ERFC_POLY = (
    0.17087277,
    -0.82215223,
    1.48851587,
    -1.13520398,
    0.27886807,
    -0.18628806,
    0.09678418,
    0.37409196,
    1.00002368,
    -1.26551223,
)
_ERF_TERMS = 12  # Taylor terms of erf for |x| < 1: the next is below 1e-9


def _f(value: float) -> str:
    return f"{value!r}f"


def _erf_taylor() -> list[float]:
    """erf(x) = x * sum_n c_n x^(2n): c_n = 2/sqrt(pi) (-1)^n / (n! (2n + 1))."""
    return [
        2.0 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1))
        for n in range(_ERF_TERMS)
    ]


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
            f"{vt} s = a * a;",
            f"{vt} p;",
            *_horner(vt, "s", _erf_taylor()[::-1], "p"),
            "p = p * a;",
            f"{vt} b = kiln_vmin_{suffix}(a, (({vt}){{0}}) + 9.0f);",
            f"{vt} t = 1.0f / (1.0f + 0.5f * b);",
            f"{vt} q;",
            *_horner(vt, "t", _ERFC_POLY, "q"),
            f"{vt} big = 1.0f - t * kiln_vexp_{suffix}(q - b * b);",
            f"{it} small = ({it})(a < 1.0f);",
            f"{it} r = (({it})p & small) | (({it})big & ~small);",
            f"return ({vt})(r | sign);",
        ]
    else:
        raise ValueError(f"no vector form of {name!r} (have {', '.join(sorted(VECTOR_MATH))})")
    lines = [f"static inline {vt} kiln_v{name}_{suffix}({vt} x) {{"]
    lines += [f"  {line}" for line in body]
    lines.append("}")
    return "\n".join(lines) + "\n"


def vector_math_helpers(calls: set[tuple[str, int]]) -> list[str]:
    """Definitions for every (name, lanes) used, each after the ones it calls (erf uses exp)."""
    needed = set(calls) | {("exp", lanes) for name, lanes in calls if name == "erf"}
    order = {"exp": 0, "erf": 1}
    return [vector_math_helper(n, k) for n, k in sorted(needed, key=lambda c: (order[c[0]], c[1]))]

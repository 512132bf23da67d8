"""Linear canonical forms of integer expressions: `sum(coef * atom) + const`.

An atom is any non-linear subexpression (a Var, a floordiv, a load...), compared structurally, so
`(x // 4) * 8 + i - (x // 4) * 8` cancels to `i`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.ir import expr as E


@dataclass
class LinearSum:
    """coef * atom terms (keyed by the atom's structural key, in first-seen order) plus a constant."""

    terms: dict[tuple[object, ...], tuple[int, E.Expr]] = field(default_factory=dict)
    const: int = 0
    dtype: str = E.INDEX_DTYPE

    def add(self, other: LinearSum, scale: int = 1) -> None:
        for key, (coef, atom) in other.terms.items():
            old = self.terms.get(key, (0, atom))[0]
            self.terms[key] = (old + coef * scale, atom)
        self.const += other.const * scale

    def scaled(self, c: int) -> LinearSum:
        out = LinearSum(dtype=self.dtype)
        out.add(self, c)
        return out

    def nonzero(self) -> list[tuple[int, E.Expr]]:
        return [(c, a) for c, a in self.terms.values() if c != 0]


def to_sum(expr: E.Expr) -> LinearSum:
    """The linear form of integer `expr`; non-linear parts become atoms as they are."""
    out = LinearSum(dtype=expr.dtype)
    if isinstance(expr, E.IntImm):
        out.const = expr.value
    elif isinstance(expr, E.Add):
        out.add(to_sum(expr.a))
        out.add(to_sum(expr.b))
    elif isinstance(expr, E.Sub):
        out.add(to_sum(expr.a))
        out.add(to_sum(expr.b), -1)
    elif isinstance(expr, E.Mul) and isinstance(expr.b, E.IntImm):
        out.add(to_sum(expr.a), expr.b.value)
    elif isinstance(expr, E.Mul) and isinstance(expr.a, E.IntImm):
        out.add(to_sum(expr.b), expr.a.value)
    else:
        out.terms[E.structural_key(expr)] = (1, expr)
    return out


def from_sum(s: LinearSum) -> E.Expr:
    """An expression for `s`: positive terms first (in order), then negative ones, then the constant."""
    pos = [(c, a) for c, a in s.nonzero() if c > 0]
    neg = [(-c, a) for c, a in s.nonzero() if c < 0]
    result: E.Expr | None = None
    const = s.const
    if not pos and neg and const != 0:
        result, const = E.IntImm(const, s.dtype), 0
    for c, atom in pos:
        term = atom if c == 1 else E.Mul(atom, E.IntImm(c, s.dtype))
        result = term if result is None else E.Add(result, term)
    for c, atom in neg:
        term = atom if c == 1 else E.Mul(atom, E.IntImm(c, s.dtype))
        result = E.Sub(E.IntImm(0, s.dtype), term) if result is None else E.Sub(result, term)
    if result is None:
        return E.IntImm(s.const, s.dtype)
    if const > 0:
        return E.Add(result, E.IntImm(const, s.dtype))
    if const < 0:
        return E.Sub(result, E.IntImm(-const, s.dtype))
    return result

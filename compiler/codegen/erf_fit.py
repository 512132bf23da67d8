"""The fit behind the vector erf's coefficients (`vector_math`): erf(x) = x P(x^2) / Q(x^2).

Run `python -m compiler.codegen.erf_fit` to print them. Linearized least squares: minimise
sum w (P(s) - g Q(s))^2 / Q_prev(s)^2 with g = erf(x)/x, s = x^2, Q(0) = 1, where Q_prev is the
previous iteration's denominator (so the residual approaches the relative error of erf); after
ten plain iterations the weights move toward the points of largest error (Lawson), which lowers
the maximum. Only numpy and math.erf: nothing at build time depends on this.
"""

from __future__ import annotations

import math

import numpy as np

CLAMP = 4.0
P_DEGREE, Q_DEGREE = 6, 4  # in s = x^2
ITERATIONS = 60


def sample() -> np.ndarray:
    """Points on (0, CLAMP]: uniform, plus Chebyshev-like crowding toward the ends."""
    x = np.concatenate(
        [np.linspace(1e-4, CLAMP, 20_000), np.cos(np.linspace(0.0, np.pi / 2, 4_000)) * CLAMP]
    )
    return np.sort(np.abs(x)) + 1e-9


def fit() -> tuple[list[float], list[float], float]:
    """(P, Q, max relative error in float64), P and Q lowest power first, Q[0] = 1."""
    x = sample()
    s = x * x
    g = np.array([math.erf(v) for v in x]) / x
    weights = np.ones_like(x)
    q_prev = np.ones_like(x)
    p_vander = np.vander(s, P_DEGREE + 1, increasing=True)
    q_vander = np.vander(s, Q_DEGREE + 1, increasing=True)[:, 1:]
    a = np.hstack([p_vander, -(g[:, None] * q_vander)])
    p = q = np.zeros(0)
    rel = np.zeros_like(x)
    for it in range(ITERATIONS):
        scale = weights / (q_prev * g)
        coef, *_ = np.linalg.lstsq(a * scale[:, None], g * scale, rcond=None)
        p, q = coef[: P_DEGREE + 1], np.concatenate([[1.0], coef[P_DEGREE + 1 :]])
        q_prev = np.polyval(q[::-1], s)
        rel = (np.polyval(p[::-1], s) / q_prev - g) / g
        if it >= 10:
            weights = weights * np.sqrt(np.abs(rel) / np.abs(rel).max()) + 1e-12
            weights /= weights.mean()
    return [float(v) for v in p], [float(v) for v in q], float(np.abs(rel).max())


if __name__ == "__main__":
    p, q, err = fit()
    print(f"max relative error {err:.3g}")
    print("P (highest power first):", p[::-1])
    print("Q (highest power first):", q[::-1])

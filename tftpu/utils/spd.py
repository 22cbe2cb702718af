"""Symmetric positive definite systems, batched, through LAPACK's Cholesky routines (scipy).

The weight refit's normal equations and GPTQ's inverse factor are SPD; Cholesky solves them with
half the work of numpy's general LU routines (a 3x3 conv over 512 channels: 4,609 unknowns),
and the inverse's factor comes from one factorization and one triangular inverse, with no
general inverse at all. Small matrices stay in numpy's batched routines, where one call for
the whole batch beats a Python loop of LAPACK calls (a depthwise conv's channels).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve, lapack

__all__ = ["solve", "inverse_cholesky_upper", "SMALL"]

SMALL = 64      # below this many unknowns, numpy's batched routines


def solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x [B, n, m] with a x = b for SPD `a` [B, n, n] (float64); a matrix that Cholesky finds not
    positive definite (round-off on a singular one) falls back to LU, as numpy solves it."""
    if a.shape[-1] < SMALL:
        return np.linalg.solve(a, b)
    out = np.empty(b.shape, np.float64)
    for i in range(a.shape[0]):
        try:
            out[i] = cho_solve(cho_factor(a[i], lower=True, check_finite=False), b[i], check_finite=False)
        except np.linalg.LinAlgError:
            out[i] = np.linalg.solve(a[i], b[i])
    return out


def inverse_cholesky_upper(h: np.ndarray) -> np.ndarray:
    """U [B, n, n], upper triangular, with U^T U = h^-1 for SPD `h` [B, n, n] (GPTQ's factor).

    With P the order reversal and P h P = L L^T, h^-1 = (P L^-1 P)^T (P L^-1 P), and P L^-1 P
    is upper triangular: one Cholesky factorization and one triangular inverse."""
    if h.shape[-1] < SMALL:
        hinv = np.linalg.inv(h)
        hinv = (hinv + np.swapaxes(hinv, -1, -2)) / 2
        return np.swapaxes(np.linalg.cholesky(hinv), -1, -2)
    out = np.empty(h.shape, np.float64)
    for i in range(h.shape[0]):
        lower = np.linalg.cholesky(h[i, ::-1, ::-1])
        inv, info = lapack.dtrtri(lower, lower=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"triangular inverse: LAPACK dtrtri info {info}")
        out[i] = inv[::-1, ::-1]
    return out

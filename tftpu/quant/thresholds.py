"""Symmetric INT8 clipping thresholds from a histogram of |x| (the calibration methods).

Each method takes `hist` (counts of |x| in equal bins over [0, absmax]) and `absmax`, and
returns the threshold t that INT8 quantization maps to 127 (values beyond t clip):

- `minmax`: t = absmax.
- `percentile`: the upper edge of the bin where the cumulative count reaches `q` percent.
- `kl`: TensorRT's entropy calibration, as TPU-MLIR runs it: for each candidate i (from 128
  bins up), P = the first i bins with the tail folded into the last one, Q = those bins merged
  into 128 levels and spread back over their non-empty bins; t minimises KL(P || Q).
- `mse`: t minimises the expected squared error: uniform rounding noise (t/127)^2/12 for the
  values inside, (|x| - t)^2 for the clipped ones, with |x| at its bin's centre.

>>> hist = np.histogram(np.abs(np.random.default_rng(0).normal(size=10000)), 2048)[0]  # doctest: +SKIP
>>> kl(hist, absmax)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

__all__ = ["METHODS", "threshold", "minmax", "percentile", "kl", "mse"]

QMAX = 127
_LEVELS = 128


def minmax(hist: np.ndarray, absmax: float) -> float:
    return float(absmax)


def percentile(hist: np.ndarray, absmax: float, q: float = 99.99) -> float:
    total = hist.sum()
    if total == 0 or absmax == 0:
        return float(absmax)
    k = int(np.searchsorted(np.cumsum(hist), q / 100.0 * total))
    return float(min(k + 1, len(hist)) * absmax / len(hist))


def kl(hist: np.ndarray, absmax: float) -> float:
    n = len(hist)
    if absmax == 0 or n <= _LEVELS or hist.sum() == 0:
        return float(absmax)
    hist = hist.astype(np.float64)
    tails = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # tails[i] = sum(hist[i:])
    best_i, best = n, np.inf
    for i in range(_LEVELS, n + 1):
        p = hist[:i].copy()
        p[-1] += tails[i]
        sliced = hist[:i]
        starts = (np.arange(_LEVELS) * i) // _LEVELS
        sums = np.add.reduceat(sliced, starts)
        nonzero = np.add.reduceat((sliced != 0).astype(np.float64), starts)
        level = np.repeat(np.arange(_LEVELS), np.diff(np.append(starts, i)))
        q = np.where(sliced != 0, (sums / np.maximum(nonzero, 1))[level], 0.0)
        p_sum, q_sum = p.sum(), q.sum()
        mask = p > 0
        if q_sum == 0:
            continue
        pn, qn = p[mask] / p_sum, q[mask] / q_sum
        qn = np.where(qn > 0, qn, 1e-12)  # P has mass where Q has none (the folded tail): a large, finite cost
        div = float(np.sum(pn * np.log(pn / qn)))
        if div < best:
            best, best_i = div, i
    return float((best_i + 0.5) * absmax / n) if best_i < n else float(absmax)


def mse(hist: np.ndarray, absmax: float) -> float:
    n = len(hist)
    if absmax == 0 or hist.sum() == 0:
        return float(absmax)
    width = absmax / n
    h = hist.astype(np.float64)
    centre = (np.arange(n) + 0.5) * width
    t = (np.arange(n) + 1) * width  # candidate thresholds: the bins' upper edges
    # counts and moments of the bins strictly above each candidate
    s0 = np.concatenate([np.cumsum(h[::-1])[::-1][1:], [0.0]])
    s1 = np.concatenate([np.cumsum((h * centre)[::-1])[::-1][1:], [0.0]])
    s2 = np.concatenate([np.cumsum((h * centre ** 2)[::-1])[::-1][1:], [0.0]])
    inside = h.sum() - s0
    err = inside * (t / QMAX) ** 2 / 12.0 + s2 - 2.0 * t * s1 + t * t * s0
    return float(t[int(np.argmin(err))])


METHODS = {"minmax": minmax, "percentile": percentile, "kl": kl, "mse": mse}


def threshold(method: str, hist: np.ndarray, absmax: float) -> float:
    """The threshold of `method` (a key of METHODS) for one tensor's |x| histogram."""
    return METHODS[method](np.asarray(hist), float(absmax))

"""Symmetric INT8 clipping thresholds from a histogram of |x| (the calibration methods).

Each method takes `hist` (counts of |x| in equal bins over [0, absmax]) and `absmax`, and
returns the threshold t that INT8 quantization maps to 127 (values beyond t clip):

- `minmax`: t = absmax.
- `percentile`: the upper edge of the bin where the cumulative count reaches `q` percent.
- `kl`: TensorRT's entropy calibration, as TPU-MLIR runs it: for each candidate i (from 128
  bins up), P = the first i bins with the tail folded into the last one, Q = those bins merged
  into 128 levels and spread back over their non-empty bins; t minimises KL(P || Q). All
  candidates are scored at once from prefix sums (about 10 ms for 2048 bins; a test checks it
  against the candidate-by-candidate definition).
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
    h = hist.astype(np.float64)
    total = h.sum()
    # Every candidate at once, from prefix sums: O(128) per candidate instead of O(i).
    cand = np.arange(_LEVELS, n + 1)
    prefix = np.concatenate([[0.0], np.cumsum(h)])
    nonzero = np.concatenate([[0.0], np.cumsum(h != 0)])
    hlogh = np.concatenate([[0.0], np.cumsum(np.where(h > 0, h * np.log(np.where(h > 0, h, 1.0)), 0.0))])
    starts = (np.arange(_LEVELS)[None, :] * cand[:, None]) // _LEVELS
    ends = np.concatenate([starts[:, 1:], cand[:, None]], axis=1)
    level_sum = prefix[ends] - prefix[starts]
    level_nz = nonzero[ends] - nonzero[starts]
    avg = np.where(level_nz > 0, level_sum / np.maximum(level_nz, 1.0), 0.0)  # Q's value on a non-empty bin
    log_avg = np.log(np.where(avg > 0, avg, 1.0))
    q_sum = prefix[cand]                  # Q spreads each level's count over its bins: sum(Q) = sum(hist[:i])
    last = h[cand - 1]
    before = prefix[cand - 1]             # the bins before the last one: P = hist, Q = their level's average
    body = (hlogh[cand - 1] - ((level_sum * log_avg).sum(1) - last * log_avg[:, -1])
            + before * (np.log(np.where(q_sum > 0, q_sum, 1.0)) - np.log(total))) / total
    p_last = (last + total - q_sum) / total  # the last bin holds the folded tail
    q_last = np.where(last > 0, avg[:, -1] / np.where(q_sum > 0, q_sum, 1.0), 0.0)
    q_last = np.where(q_last > 0, q_last, 1e-12)  # P has mass where Q has none (the tail): large, finite
    tail = np.where(p_last > 0, p_last * np.log(np.where(p_last > 0, p_last, 1.0) / q_last), 0.0)
    div = np.where(q_sum > 0, body + tail, np.inf)
    best = int(np.argmin(div))
    i = int(cand[best])
    return float((i + 0.5) * absmax / n) if i < n else float(absmax)


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

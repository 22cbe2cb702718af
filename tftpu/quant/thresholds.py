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
- `tail_mse`: mse with the clipped values' error counted TAIL_WEIGHT times. A detector's objects
  are its rare large activations: plain mse clips them to spare the many small values rounding
  noise, and the outputs lose the objects (`docs/guides/quantize.md` has the figures).
- `aciq_gauss`, `aciq_laplace`: ACIQ (Banner, Nahshan & Soudry, "Post training 4-bit
  quantization", 2019): fit a zero-centred Gaussian / Laplace to x (symmetric INT8's grid is
  centred on 0, so the fit is to |x|: sigma = RMS of x, b = mean |x|, from the histogram) and clip
  at the closed-form optimum for 8 bits, alpha = 3.92 sigma / 9.89 b. The constants are solved
  here from the paper's expected-error formula (`aciq_alpha`), not copied.

Asymmetric ranges (`asymmetric_range`) come from a signed histogram over [lo, hi]: `minmax` the
observed range, `mse` (`tail_mse`) the joint (lo, hi) of least expected error on a 256-level grid, `kl` and
`percentile` each side of zero clipped as its own magnitude histogram, ACIQ mu -/+ alpha around
the mean (the paper's setting). A range always holds 0, as an INT8 zero point must be one of the
256 levels (TFLite and onnxruntime widen ranges the same way), so exact zeros stay exact.

>>> hist = np.histogram(np.abs(np.random.default_rng(0).normal(size=10000)), 2048)[0]  # doctest: +SKIP
>>> kl(hist, absmax)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["METHODS", "CLIP_WEIGHTS", "TAIL_WEIGHT", "threshold", "minmax", "percentile", "kl", "mse", "tail_mse",
           "aciq_gauss", "aciq_laplace", "aciq_alpha", "asymmetric_range"]

QMAX = 127
TAIL_WEIGHT = 64.0
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


def mse(hist: np.ndarray, absmax: float, candidates: np.ndarray | None = None, clip_weight: float = 1.0) -> float:
    """`candidates`, if given, masks the bins' upper edges it may pick (the last must be allowed);
    `clip_weight` multiplies the clipped values' error."""
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
    w = clip_weight  # (term by term: weight 1 sums exactly as mse always did)
    err = inside * (t / QMAX) ** 2 / 12.0 + w * s2 - w * 2.0 * t * s1 + w * t * t * s0
    if candidates is not None:
        err = np.where(candidates, err, np.inf)
    return float(t[int(np.argmin(err))])


def tail_mse(hist: np.ndarray, absmax: float, candidates: np.ndarray | None = None) -> float:
    return mse(hist, absmax, candidates, clip_weight=TAIL_WEIGHT)


@functools.lru_cache(maxsize=None)
def aciq_alpha(dist: str, bits: int = 8) -> float:
    """ACIQ's optimal clip in units of sigma (gauss) or b (laplace), from the paper's closed form.

    Expected error of clipping to [-a, a] and rounding to 2^bits levels (scale 1):
    Laplace 2 e^-a + a^2 / (3 4^bits); Gaussian (a^2 + 1) erfc(a/sqrt 2) - a sqrt(2/pi) e^(-a^2/2)
    + a^2 / (3 4^bits). Its derivative has one root, found by bisection (deterministic).
    """
    q = 3.0 * 4.0 ** bits
    if dist == "laplace":
        slope = lambda a: -2.0 * math.exp(-a) + 2.0 * a / q  # noqa: E731
    elif dist == "gauss":
        slope = lambda a: (2.0 * a * math.erfc(a / math.sqrt(2.0))  # noqa: E731
                           - 2.0 * math.sqrt(2.0 / math.pi) * math.exp(-a * a / 2.0) + 2.0 * a / q)
    else:
        raise ValueError(f"ACIQ distribution {dist!r}: expected gauss or laplace")
    lo, hi = 1e-3, 100.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if slope(mid) > 0 else (mid, hi)
    return 0.5 * (lo + hi)


def _centres(n: int, absmax: float) -> np.ndarray:
    return (np.arange(n) + 0.5) * (absmax / n)


def aciq_gauss(hist: np.ndarray, absmax: float) -> float:
    total = hist.sum()
    if absmax == 0 or total == 0:
        return float(absmax)
    sigma = math.sqrt(float(np.dot(hist.astype(np.float64), _centres(len(hist), absmax) ** 2)) / total)
    return float(min(aciq_alpha("gauss") * sigma, absmax))


def aciq_laplace(hist: np.ndarray, absmax: float) -> float:
    total = hist.sum()
    if absmax == 0 or total == 0:
        return float(absmax)
    b = float(np.dot(hist.astype(np.float64), _centres(len(hist), absmax))) / total
    return float(min(aciq_alpha("laplace") * b, absmax))


METHODS = {"minmax": minmax, "percentile": percentile, "kl": kl, "mse": mse, "tail_mse": tail_mse,
           "aciq_gauss": aciq_gauss, "aciq_laplace": aciq_laplace}
CLIP_WEIGHTS = {"mse": 1.0, "tail_mse": TAIL_WEIGHT}  # the mse family: its weight of the clipping error


def threshold(method: str, hist: np.ndarray, absmax: float) -> float:
    """The threshold of `method` (a key of METHODS) for one tensor's |x| histogram."""
    return METHODS[method](np.asarray(hist), float(absmax))


_ASYM_LEVELS = 255  # steps of the 256-level asymmetric INT8 grid
_COARSE = 512


def _side(method: str, hist: np.ndarray, width: float, extent: float) -> float:
    """One side of zero (bins of `width` from 0 out) clipped as a magnitude histogram, at most `extent`."""
    if extent <= 0 or hist.sum() == 0:
        return max(float(extent), 0.0)
    return min(threshold(method, hist, len(hist) * width), float(extent))


def _asym_mse(h: np.ndarray, lo: float, width: float, vmin: float, vmax: float,
              clip_weight: float = 1.0) -> tuple[float, float]:
    """The (lo, hi) bin-edge pair of least expected error (rounding inside, clipping outside x `clip_weight`)."""
    n = len(h)
    if n > _COARSE:  # search all pairs on at most _COARSE merged bins, then refine each end finely
        f = -(-n // _COARSE)
        hc = np.concatenate([h, np.zeros(-n % f)]).reshape(-1, f).sum(1)
        clo, chi = _asym_mse(hc, lo, width * f, vmin, vmax, clip_weight)
        return _asym_refine(h, lo, width, f, clo, chi, vmin, vmax, clip_weight)
    edges = lo + np.arange(n + 1) * width
    c = lo + (np.arange(n) + 0.5) * width
    cnt = np.concatenate([[0.0], np.cumsum(h)])
    m1 = np.concatenate([[0.0], np.cumsum(h * c)])
    m2 = np.concatenate([[0.0], np.cumsum(h * c * c)])
    total = cnt[-1]
    i = np.arange(n + 1)[:, None]       # lo = edges[i]: bins < i are clipped up to it
    j = np.arange(n + 1)[None, :]       # hi = edges[j]: bins >= j are clipped down to it
    a, b = edges[:, None], edges[None, :]
    below = cnt[i] * a * a - 2 * a * m1[i] + m2[i]
    above = (total - cnt[j]) * b * b - 2 * b * (m1[-1] - m1[j]) + (m2[-1] - m2[j])
    inside = cnt[j] - cnt[i]
    err = np.where(j > i, clip_weight * (below + above) + inside * ((b - a) / _ASYM_LEVELS) ** 2 / 12.0, np.inf)
    err = np.where(_keeps_zero(a, b, vmin, vmax), err, np.inf)
    k = int(np.argmin(err))
    return float(edges[k // (n + 1)]), float(edges[k % (n + 1)])


def _keeps_zero(a, b, vmin: float, vmax: float):
    return (a <= 0) & (b >= 0)


def _asym_refine(h, lo, width, f, clo, chi, vmin, vmax, clip_weight):
    """Refine a coarse (lo, hi) one end at a time over the fine edges within `f` bins of it."""
    n = len(h)
    edges = lo + np.arange(n + 1) * width
    c = lo + (np.arange(n) + 0.5) * width

    def err(a, b):
        inside = (c >= a) & (c <= b)
        clipped = np.where(c < a, a - c, np.where(c > b, c - b, 0.0))
        return float(clip_weight * np.dot(h, clipped ** 2) + h[inside].sum() * ((b - a) / _ASYM_LEVELS) ** 2 / 12.0)

    best = (clo, chi)
    for _ in range(2):
        for end in (0, 1):
            ref = best[end]
            near = edges[np.abs(edges - ref) <= (f + 0.5) * width]
            cands = [(e, best[1]) if end == 0 else (best[0], e) for e in near]
            cands = [p for p in cands if p[0] < p[1] and bool(_keeps_zero(p[0], p[1], vmin, vmax))]
            if cands:
                scores = [err(*p) for p in cands]
                best = cands[int(np.argmin(scores))]
    return float(best[0]), float(best[1])


def asymmetric_range(method: str, hist: np.ndarray, lo: float, width: float,
                     vmin: float, vmax: float) -> tuple[float, float]:
    """The clipped [min, max] of `method` from a signed histogram (bin k covers lo + [k, k+1) width).

    The histogram's span holds 0 and the observed extremes `vmin`/`vmax`, with 0 on a bin edge;
    the result lies within [min(vmin, 0), max(vmax, 0)] and holds 0.
    """
    h = np.asarray(hist, np.float64)
    vmin, vmax = min(float(vmin), 0.0), max(float(vmax), 0.0)
    if not (lo <= min(vmin, 0.0) and max(vmax, 0.0) <= lo + len(h) * width):
        raise ValueError(f"histogram span [{lo}, {lo + len(h) * width}] misses 0 or [{vmin}, {vmax}]")
    if method == "minmax" or h.sum() == 0 or vmax <= vmin:
        return vmin, vmax
    n = len(h)
    c = lo + (np.arange(n) + 0.5) * width
    if method in CLIP_WEIGHTS:
        a, b = _asym_mse(h, lo, width, vmin, vmax, CLIP_WEIGHTS[method])
    elif method in ("aciq_gauss", "aciq_laplace"):
        total = h.sum()
        mu = float(np.dot(h, c)) / total
        if method == "aciq_gauss":
            spread = aciq_alpha("gauss") * math.sqrt(float(np.dot(h, (c - mu) ** 2)) / total)
        else:
            spread = aciq_alpha("laplace") * float(np.dot(h, np.abs(c - mu))) / total
        a, b = mu - spread, mu + spread
    elif method in METHODS:
        zero = int(round(-lo / width))  # the first bin at or above 0
        neg, pos = h[:zero][::-1], h[zero:]
        a = -_side(method, neg, width, -vmin)
        b = _side(method, pos, width, vmax)
    else:
        raise ValueError(f"calibration method {method!r}")
    a, b = min(max(a, vmin), 0.0), max(min(b, vmax), 0.0)
    if b <= a:
        return vmin, vmax
    return float(a), float(b)

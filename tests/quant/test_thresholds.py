"""Calibration threshold methods on distributions whose right answer is known."""

import numpy as np
import pytest

from tftpu.quant import thresholds as T

RNG = np.random.default_rng(0)
BINS = 2048


def _hist(values):
    mags = np.abs(values)
    absmax = float(mags.max())
    return np.histogram(mags[mags != 0], BINS, (0.0, absmax))[0], absmax


def _int8_mse(values, t):
    """Mean squared error of symmetric INT8 quantization with threshold t, computed directly."""
    step = t / 127
    q = np.clip(np.round(values / step), -127, 127) * step
    return float(np.mean((q - values) ** 2))


def test_minmax_and_percentile():
    x = RNG.uniform(-3, 3, 200000)
    hist, absmax = _hist(x)
    assert T.minmax(hist, absmax) == absmax
    assert T.percentile(hist, absmax, 99.99) == pytest.approx(np.percentile(np.abs(x), 99.99), abs=2 * absmax / BINS)
    assert T.percentile(hist, absmax, 50) == pytest.approx(1.5, abs=0.01)


@pytest.mark.parametrize("dist", ["gauss", "laplace", "relu_gauss", "uniform"])
def test_mse_is_the_least_squared_error_threshold(dist):
    x = {"gauss": lambda: RNG.normal(size=100000),
         "laplace": lambda: RNG.laplace(size=100000),
         "relu_gauss": lambda: np.maximum(RNG.normal(size=100000), 0),
         "uniform": lambda: RNG.uniform(-1, 1, 100000)}[dist]()
    x[:3] = [12.0, -10.0, 9.0]  # outliers: clipping them costs less than the resolution they take
    hist, absmax = _hist(x)
    t = T.mse(hist, absmax)
    grid = np.linspace(absmax / 400, absmax, 400)
    errors = [_int8_mse(x, g) for g in grid]
    assert _int8_mse(x, t) <= min(errors) * 1.05      # as good as the best of a direct search
    assert abs(t - grid[int(np.argmin(errors))]) <= 0.1 * absmax


def test_kl_clips_outliers_and_keeps_the_bulk():
    x = RNG.normal(size=200000)
    x[:5] = 60.0
    hist, absmax = _hist(x)
    t = T.kl(hist, absmax)
    assert 2.5 < t < 8.0, t        # a few sigma: the outliers are clipped, the Gaussian is not
    assert _int8_mse(x[5:], t) < _int8_mse(x[5:], absmax) / 10


def test_kl_on_a_uniform_range_keeps_most_of_it():
    x = RNG.uniform(-2, 2, 200000)
    hist, absmax = _hist(x)
    assert T.kl(hist, absmax) > 0.9 * absmax


def test_degenerate_inputs():
    zeros = np.zeros(BINS, np.int64)
    for method in T.METHODS:
        assert T.threshold(method, zeros, 0.0) == 0.0
    one = zeros.copy()
    one[100] = 5
    for method in T.METHODS:
        assert 0 < T.threshold(method, one, 1.0) <= 1.0


def _kl_reference(hist, absmax, levels=128):
    """TensorRT's entropy calibration written out candidate by candidate (the definition)."""
    n = len(hist)
    h = hist.astype(np.float64)
    best_i, best = n, np.inf
    for i in range(levels, n + 1):
        p = h[:i].copy()
        p[-1] += h[i:].sum()
        q = np.zeros(i)
        bounds = (np.arange(levels + 1) * i) // levels
        for a, b in zip(bounds[:-1], bounds[1:]):
            nz = h[a:b] != 0
            if nz.any():
                q[a:b][nz] = h[a:b].sum() / nz.sum()
        if q.sum() == 0:
            continue
        mask = p > 0
        pn, qn = p[mask] / p.sum(), q[mask] / q.sum()
        qn = np.where(qn > 0, qn, 1e-12)
        div = float(np.sum(pn * np.log(pn / qn)))
        if div < best:
            best, best_i = div, i
    return (best_i + 0.5) * absmax / n if best_i < n else absmax


@pytest.mark.parametrize("dist", ["gauss_outliers", "relu", "uniform", "sparse", "two_bumps"])
def test_kl_prefix_sum_form_equals_the_definition(dist):
    rng = np.random.default_rng(7)
    x = {"gauss_outliers": lambda: np.concatenate([rng.normal(size=50000), [30.0, -25.0]]),
         "relu": lambda: np.maximum(rng.normal(size=50000), 0),
         "uniform": lambda: rng.uniform(-2, 2, 50000),
         "sparse": lambda: rng.choice([0.5, 1.0, 7.0], 3000),
         "two_bumps": lambda: np.concatenate([rng.normal(1, 0.1, 20000), rng.normal(6, 0.5, 2000)])}[dist]()
    mags = np.abs(x)
    absmax = float(mags.max())
    hist = np.histogram(mags[mags != 0], 512, (0.0, absmax))[0]   # 512 bins keep the loop quick
    assert T.kl(hist, absmax) == pytest.approx(_kl_reference(hist, absmax), abs=absmax / 512)


def _expected_error(hist, centres, a, b, levels, clip_weight):
    """The error model the mse family minimises: rounding (step^2/12) inside [a, b], clipping outside."""
    inside = (centres >= a) & (centres <= b)
    clipped = np.where(centres < a, a - centres, np.where(centres > b, centres - b, 0.0))
    return clip_weight * float(np.dot(hist, clipped ** 2)) + hist[inside].sum() * ((b - a) / levels) ** 2 / 12.0


@pytest.mark.parametrize("dist", ["gauss", "laplace", "relu_gauss", "two_bumps"])
@pytest.mark.parametrize("method", ["mse", "tail_mse"])
def test_the_mse_family_picks_its_least_error_threshold(dist, method):
    """mse and tail_mse against a direct search of every bin edge under their own weighting."""
    x = {"gauss": lambda: RNG.normal(size=50000),
         "laplace": lambda: RNG.laplace(size=50000),
         "relu_gauss": lambda: np.maximum(RNG.normal(size=50000), 0),
         "two_bumps": lambda: np.concatenate([RNG.normal(1, 0.1, 20000), RNG.normal(6, 0.5, 300)])}[dist]()
    hist, absmax = _hist(x)
    hist = hist.astype(np.float64)
    centres = (np.arange(BINS) + 0.5) * absmax / BINS
    weight = T.CLIP_WEIGHTS[method]
    edges = (np.arange(BINS) + 1) * absmax / BINS
    errors = [_expected_error(hist, centres, -t, t, 2 * T.QMAX, weight) for t in edges]
    t = T.threshold(method, hist, absmax)
    assert t == pytest.approx((int(np.argmin(errors)) + 1) * absmax / BINS)


def test_tail_mse_clips_less_than_mse():
    """Counting the clipped tail more moves every threshold out, never in (minmax bounds it)."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        x = np.concatenate([rng.laplace(size=20000) * rng.uniform(0.1, 3), rng.uniform(5, 40, rng.integers(0, 50))])
        hist, absmax = _hist(x)
        assert T.mse(hist, absmax) <= T.tail_mse(hist, absmax) <= absmax
    x = np.concatenate([RNG.normal(size=100000), [19.0, 20.0]])   # an object's few large values
    hist, absmax = _hist(x)
    assert T.mse(hist, absmax) < 0.85 * absmax and T.tail_mse(hist, absmax) > 0.95 * absmax


@pytest.mark.parametrize("bins", [300, 1500])   # all pairs searched; coarse search then refined
@pytest.mark.parametrize("method", ["mse", "tail_mse"])
def test_asymmetric_mse_family_is_the_least_error_pair(bins, method):
    rng = np.random.default_rng(bins)
    x = np.concatenate([rng.gamma(2.0, 1.0, 50000) - 1.5, rng.uniform(8, 12, 20), [-4.0]])
    lo, hi = float(x.min()), float(x.max())
    width = (hi - lo) / bins
    k0 = int(np.floor(lo / width))
    edges0 = k0 * width
    n = int(np.ceil((hi - edges0) / width))
    hist = np.histogram(x, n, (edges0, edges0 + n * width))[0].astype(np.float64)
    centres = edges0 + (np.arange(n) + 0.5) * width
    edges = edges0 + np.arange(n + 1) * width
    weight = T.CLIP_WEIGHTS[method]
    a, b = T.asymmetric_range(method, hist, edges0, width, lo, hi)
    got = _expected_error(hist, centres, a, b, 255, weight)
    neg, pos = edges[edges <= 0], edges[edges >= 0]
    best = min(_expected_error(hist, centres, p, q, 255, weight) for p in neg[::max(1, len(neg) // 150)]
               for q in pos[::max(1, len(pos) // 150)])
    assert a <= 0 <= b and got <= best * (1.0 if bins <= 512 else 1.02)

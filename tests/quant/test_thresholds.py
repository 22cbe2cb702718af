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

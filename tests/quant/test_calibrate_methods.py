"""ACIQ, auto and asymmetric calibration against known answers; the streaming pass against the two-pass one."""

import importlib
import math

import numpy as np
import pytest

from tests import material
from tftpu import errors, frontend, models, quant
from tftpu.quant import thresholds as T

C = importlib.import_module("tftpu.quant.calibrate")
RNG = np.random.default_rng(3)

# Banner, Nahshan & Soudry (2019), optimal clip for 2..8 bits, in units of b (Laplace) and sigma (Gaussian)
PAPER_LAPLACE = [2.83, 3.89, 5.03, 6.2, 7.41, 8.64, 9.89]
PAPER_GAUSS = [1.71, 2.15, 2.55, 2.94, 3.29, 3.61, 3.92]


def _stats(values, bins=2048):
    st = C.TensorStatistics(2 * bins)
    for part in np.array_split(np.asarray(values, np.float32), 4):   # several samples: the grid doubles
        st.add(part)
    return st


def test_aciq_constants_are_the_papers():
    for bits, lap, gau in zip(range(2, 9), PAPER_LAPLACE, PAPER_GAUSS):
        assert T.aciq_alpha("laplace", bits) == pytest.approx(lap, abs=0.011)
        assert T.aciq_alpha("gauss", bits) == pytest.approx(gau, abs=0.011)


def test_aciq_constant_minimises_the_closed_form_error():
    grid = np.linspace(5, 15, 20001)
    err = 2 * np.exp(-grid) + grid ** 2 / (3 * 4 ** 8)
    assert T.aciq_alpha("laplace") == pytest.approx(grid[np.argmin(err)], abs=1e-3)


@pytest.mark.parametrize("dist,scale,alpha", [("gauss", 2.0, 3.92), ("laplace", 0.5, 9.89)])
def test_aciq_clips_a_synthetic_distribution_at_alpha_times_its_scale(dist, scale, alpha):
    x = RNG.normal(0, scale, 400000) if dist == "gauss" else RNG.laplace(0, scale, 400000)
    st = _stats(x)
    assert st.threshold(f"aciq_{dist}") == pytest.approx(alpha * scale, rel=0.02)
    # the paper's setting for an asymmetric grid: mu -/+ alpha around the mean (0 always inside)
    lo, hi = _stats(x + 3 * scale).range_of(f"aciq_{dist}")
    assert lo == pytest.approx(max(3 * scale - alpha * scale, float((x + 3 * scale).min())), rel=0.03, abs=0.03 * scale)
    assert hi == pytest.approx(min(3 * scale + alpha * scale, float((x + 3 * scale).max())), rel=0.02)


def test_streaming_histogram_equals_a_direct_one():
    x = RNG.normal(size=100000).astype(np.float32)
    x[::7] = 0
    st = C.TensorStatistics(512)
    for part, grow in zip(np.array_split(x, 5), (0.1, 1, 0.5, 3, 1)):
        st.add(part * grow)
    data = np.concatenate([p * g for p, g in zip(np.array_split(x, 5), (0.1, 1, 0.5, 3, 1))])
    edges = (np.arange(2 * 512 + 1) - 512) * st.width
    direct = np.histogram(data[data != 0], edges)[0]
    assert st.hist.sum() == np.count_nonzero(data)
    np.testing.assert_array_equal(st.hist, direct)   # power-of-two range and bins: every bin exact
    assert (st.vmin, st.vmax) == (float(data.min()), float(data.max()))


def test_the_table_lies_on_a_power_of_two_grid():
    """The range is a power of two; min/max are rounded outward to 1/256 of it, thresholds and
    asymmetric ranges have at most 8 significant bits, so no last-bit noise of a value moves them
    unless it crosses one of those grid points. A max that is itself a grid point (ReLU6's 6)
    stays the max and a threshold."""
    raw = RNG.normal(2, 2, 200000).astype(np.float32)
    x = np.clip(raw, -0.3, 6)
    st = _stats(x)
    assert st.range == 8.0 and st.width == 8.0 / 4096 and st.step == 8.0 / 256
    assert (st.lo, st.hi) == (-0.3125, 6.0)
    for method in C.AUTO_CANDIDATES:
        t = st.threshold(method)
        assert C.significant(t) == t and 0 < t <= 6.0, method
        lo, hi = st.range_of(method)
        assert C.significant(lo) == lo and C.significant(hi) == hi and st.lo <= lo <= 0 < hi <= 6.0, method
    assert [C.significant(x) for x in (1.0 + 2 ** -9, 255.5, -0.3)] == [1.0, 256.0, -0.30078125]
    assert C.significant(0.3, up=True) == 0.30078125 and C.significant(0.30078125, up=True) == 0.30078125
    assert st.threshold("minmax") == st.threshold("percentile") == 6.0   # the 6s are counted, not cut off
    # a few ulps of noise where a CPU's kernels round (the sum), none where they cannot (the clamp)
    noisy = _stats(np.clip(raw * (1 + RNG.integers(-4, 5, x.size) * 2.0 ** -23).astype(np.float32), -0.3, 6))
    assert (noisy.lo, noisy.hi, noisy.range) == (st.lo, st.hi, st.range)
    tiny = _stats(x * np.float32(2.0 ** -60))
    assert tiny.range == 2.0 ** -57 and tiny.threshold("mse") == st.threshold("mse") * 2.0 ** -60


def test_asymmetric_ranges_hold_zero_and_clip_outliers():
    x = np.concatenate([RNG.normal(2, 0.5, 400000), [15.0, -12.0]])
    st = _stats(x)
    for method in quant.METHODS:
        lo, hi = st.range_of(method)
        assert float(x.min()) <= lo <= 0 <= hi <= float(x.max()), method
    lo, hi = st.range_of("mse")
    assert -6 < lo <= 0 and 3.5 < hi < 10, (lo, hi)   # the outliers clipped, the bulk kept
    assert (lo, hi) == st.range_of("mse")               # deterministic
    relu = _stats(np.maximum(RNG.normal(size=100000), 0))
    assert relu.range_of("mse")[0] == 0.0


def _keras_to_top(build):
    import keras
    keras.utils.set_random_seed(0)
    return frontend.load(build(keras))


@pytest.fixture(scope="module")
def maxpool_model():
    def build(keras):
        inp = keras.Input((128, 128, 1), name="x")
        return keras.Model(inp, keras.layers.GlobalMaxPooling2D()(inp))
    return _keras_to_top(build)


def test_auto_keeps_the_outliers_a_max_needs(maxpool_model):
    """percentile, kl and ACIQ clip a few rare outliers; the tensor's consumer, a global max, is
    made of them: auto must take a threshold that keeps them (mse's or minmax's)."""
    samples = []
    for i in range(4):
        x = RNG.normal(size=(1, 128, 128, 1)).astype(np.float32)
        x[0, 5 * i, 7 * i, 0] = 20.0 + i     # one outlier per sample (under 0.01% of the values)
        samples.append({"x": x})
    clipped = quant.calibrate(maxpool_model, samples, "percentile")
    assert clipped.entries["x"][0] < 6
    auto = quant.calibrate(maxpool_model, samples, "auto", tune_num=2)
    assert auto.chosen["x"] in ("mse", "minmax") and auto.entries["x"][0] > 20, auto.entries["x"]
    out = maxpool_model.output_names[0]
    got = {t.method: np.concatenate([r[out].ravel() for r in quant.simulate(maxpool_model, t, samples)])
           for t in (auto, clipped)}
    want = np.array([20.0, 21.0, 22.0, 23.0])
    assert np.abs(got["auto"] - want).max() < 0.3 and np.abs(got["percentile"] - want).min() > 10
    assert "# auto chose:" in auto.text() and sum(auto.counts().values()) == len(auto.entries)


@pytest.fixture(scope="module")
def resnet():
    return frontend.load(models.resnet18_like((64, 64, 3)))


@pytest.fixture(scope="module")
def photos(resnet):
    name = resnet.input_names[0]
    return [{name: (material.image(n, (64, 64)).astype(np.float32) / 127.5 - 1)[None]}
            for n in material.COLOUR_PHOTOS[:4]]


def test_asymmetric_tables_round_trip_byte_identical(resnet, photos, tmp_path):
    for method in ("mse", "auto"):
        table = quant.calibrate(resnet, photos, method, asymmetric=True, tune_num=1)
        table.save(tmp_path / "a.txt")
        quant.calibrate(resnet, photos, method, asymmetric=True, tune_num=1).save(tmp_path / "b.txt")
        assert (tmp_path / "a.txt").read_bytes() == (tmp_path / "b.txt").read_bytes()
        assert "# asymmetric: true" in (tmp_path / "a.txt").read_text()
        back = quant.read_table(tmp_path / "a.txt")
        assert back.asymmetric and back.method == method and list(back.entries) == list(table.entries)
        sym = quant.calibrate(resnet, photos, "minmax")
        for name, (t, lo, hi) in table.entries.items():
            np.testing.assert_allclose(back.entries[name], (t, lo, hi), rtol=1e-8)
            _, vmin, vmax = sym.entries[name]
            assert min(vmin, 0) <= lo <= 0 <= hi <= max(vmax, 0), name
    assert not quant.read_table(tmp_path / "a.txt").entries == {} and not sym.asymmetric


def test_tables_from_one_pass_equal_calibrates_own(resnet, photos, tmp_path):
    methods = ("mse", "minmax", "auto", "kl")
    for asymmetric in (False, True):
        tables = quant.calibrate_each(resnet, photos, methods + ("mse",), asymmetric=asymmetric, tune_num=1)
        assert list(tables) == list(methods)
        for m in methods:
            tables[m].save(tmp_path / "each.txt")
            quant.calibrate(resnet, photos, m, asymmetric=asymmetric, tune_num=1).save(tmp_path / "one.txt")
            assert (tmp_path / "each.txt").read_bytes() == (tmp_path / "one.txt").read_bytes(), (m, asymmetric)
    with pytest.raises(errors.UsageError, match="at least one method"):
        quant.calibrate_each(resnet, photos, [])
    with pytest.raises(errors.UsageError, match="entropy"):
        quant.calibrate_each(resnet, photos, ["mse", "entropy"])


def test_streaming_matches_the_two_pass_implementation(resnet, photos):
    """min/max and minmax's threshold are the old exact ones rounded outward by under one step of
    the extremes' grid (1/256 of the power-of-two range, so under 1/128 of the largest |x|); mse
    and percentile within a few of the old 2048 bins (the grid now has 2048 to 4096 bins over the
    range, not exactly 2048) plus one step of the 8-significant-bit values they now pick among
    (t / 128 at most); kl, which moves between local minima when the bins change, within 0.5 dB
    of the old table's simulated SQNR."""
    out = resnet.output_names[0]
    for method in ("minmax", "mse", "percentile", "kl"):
        new, old = quant.calibrate(resnet, photos, method), quant.calibrate_two_pass(resnet, photos, method)
        assert list(new.entries) == list(old.entries)
        for name, (t, lo, hi) in old.entries.items():
            step = max(-lo, hi) / 128
            t_new, lo_new, hi_new = new.entries[name]
            assert lo - step < lo_new <= lo and hi <= hi_new < hi + step, name
            if method == "minmax":
                assert t_new == max(-lo_new, hi_new)
            elif method != "kl":
                assert abs(t_new - t) <= 3 * max(-lo, hi) / 2048 + t / 128, (method, name)
        if method == "kl":
            snr_new = quant.evaluate(resnet, new, photos).rows[out][1]
            snr_old = quant.evaluate(resnet, old, photos).rows[out][1]
            assert snr_new > snr_old - 0.5, (snr_new, snr_old)


def test_bad_input_is_one_clear_error(resnet, photos, tmp_path):
    bad = {k: v.copy() for k, v in photos[0].items()}
    next(iter(bad.values()))[0, 3, 3, 0] = np.nan
    with pytest.raises(errors.InputError, match=r"sample 1: tensor .* non-finite"):
        quant.calibrate(resnet, [photos[1], bad])
    with pytest.raises(errors.UsageError, match="tune_num"):
        quant.calibrate(resnet, photos, "auto", tune_num=0)
    with pytest.raises(errors.UsageError, match="bins"):
        quant.calibrate(resnet, photos, bins=100)
    with pytest.raises(errors.UsageError, match="auto"):
        quant.calibrate(resnet, photos, "aciq")
    table = tmp_path / "t.txt"
    table.write_text("# asymmetric: maybe\nconv1 1.0 -1.0 1.0\n")
    with pytest.raises(errors.ModelFileError, match="asymmetric"):
        quant.read_table(table)
    assert math.isfinite(quant.calibrate(resnet, photos[:1], "aciq_laplace").entries[resnet.input_names[0]][0])

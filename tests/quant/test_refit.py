"""Noise-aware refit of conv weights (`tftpu.quant.refit`, through `correct_biases(refit=True)`
and deploy's `weight_refit`): exact inputs give back the float weights; on noisy inputs the refit
conv is closer to the float output than the float weights are, on inputs it never saw; the copy
is deterministic, the ops kept in float get their own weights and biases back, and deploy's
guard judges it like the other corrections."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tftpu import quant
from tftpu.interp.kernels import KERNELS
from tftpu.ir import TopBuilder, top
from tftpu.pipelines.deploy import deploy
from tftpu.quant import params as P
from tftpu.quant.bias_correction import correct_biases
from tftpu.quant.refit import Fit
from tftpu.quant.weight_rounding import restore_weights

RNG = np.random.default_rng(7)


def _conv(x, w, b, attrs):
    return KERNELS["top.Conv"]([x, w, b], attrs)[0]


def _smooth(n, c, h, w, rng):
    """Images whose energy sits at low spatial frequencies (as photos' features do)."""
    x = rng.standard_normal((n, c, h + 4, w + 4)).astype(np.float32)
    k = np.ones(5, np.float32) / 5
    x = np.apply_along_axis(lambda r: np.convolve(r, k, "valid"), 2, x)
    x = np.apply_along_axis(lambda r: np.convolve(r, k, "valid"), 3, x)
    return (3 * x).astype(np.float32)


@pytest.mark.parametrize("group,cin,cout", [(1, 3, 5), (4, 4, 4), (2, 4, 6)], ids=["dense", "depthwise", "grouped"])
@pytest.mark.parametrize("ridge", [0.0, 1.0])
def test_exact_inputs_give_the_float_weights_back(group, cin, cout, ridge):
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": group, "strides": [1, 1], "dilations": [1, 1]}
    w = RNG.standard_normal((cout, cin // group, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(cout).astype(np.float32)
    fit = Fit(w, b, attrs)
    for _ in range(2):
        x = _smooth(1, cin, 12, 12, RNG)
        fit.observe(x, x)
    w2, b2 = fit.solve(ridge)
    np.testing.assert_allclose(w2, w, atol=1e-4)
    np.testing.assert_allclose(b2, b, atol=1e-4)


def _normal_equations(fit, xs, xqs, ridge):
    """The refit solved as the docstring writes it, from every patch row: (X_q^T X_q + lam I)^-1
    (X_q^T X_f WB + lam WB) per group."""
    from tftpu.quant.weight_rounding import conv_patches

    kernel = tuple(fit.attrs["kernel_shape"])
    xq = np.swapaxes(np.concatenate([p for x in xqs for p in conv_patches(x, kernel, fit.attrs, ones=True)], 2),
                     1, 2).astype(float)                                  # [g, rows, d + 1]
    xf = np.swapaxes(np.concatenate([p for x in xs for p in conv_patches(x, kernel, fit.attrs, ones=True)], 2),
                     1, 2).astype(float)
    qq, qf = np.swapaxes(xq, 1, 2) @ xq, np.swapaxes(xq, 1, 2) @ xf
    lam = ridge * np.diagonal(qq, axis1=1, axis2=2)[:, :-1].mean(axis=1)[:, None, None]
    sol = np.linalg.solve(qq + lam * np.eye(qq.shape[1]), qf @ fit.wb + lam * fit.wb)
    sol = np.swapaxes(sol, 1, 2)
    return sol[:, :, :-1].reshape(fit.shape), sol[:, :, -1].reshape(-1), xq.shape[1]


@pytest.mark.parametrize("group,cin,cout", [(1, 2, 3), (1, 16, 5), (1, 64, 8), (2, 32, 6), (4, 4, 4)])
@pytest.mark.parametrize("images,side", [(1, 2), (3, 3), (2, 6), (4, 4)])
@pytest.mark.parametrize("ridge", [0.3, 1.0])
def test_few_rows_solve_as_the_normal_equations(group, cin, cout, images, side, ridge):
    """Fewer patch rows than a channel's unknowns (a wide conv deep in a small map) are solved
    from the rows' side; more, or patches kept until the rows reach the unknowns, from the
    normal equations: the same refit either way, over both sides of the threshold."""
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": group, "strides": [1, 1], "dilations": [1, 1]}
    rng = np.random.default_rng(images * 100 + side + cin)
    w = rng.standard_normal((cout, cin // group, 3, 3)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    fit = Fit(w, b, attrs)
    xs = [rng.standard_normal((1, cin, side, side)).astype(np.float32) for _ in range(images)]
    xqs = [x + 0.1 * rng.standard_normal(x.shape).astype(np.float32) for x in xs]
    for x, xq in zip(xs, xqs):
        fit.observe(x, xq)
    want_w, want_b, rows = _normal_equations(fit, xs, xqs, ridge)
    assert fit.rows == rows and bool(fit.patches) == (rows < fit.qq.shape[1])
    got_w, got_b = fit.solve(ridge)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-6, atol=1e-6 * np.abs(want_w).max())
    np.testing.assert_allclose(got_b, want_b, rtol=1e-6, atol=1e-6 * np.abs(want_b).max())


@pytest.mark.parametrize("group", [1, 3], ids=["dense", "depthwise"])
def test_a_high_pass_conv_refit_to_noisy_inputs_is_closer_on_unseen_ones(group):
    """A Laplacian-like kernel passes little of a smooth image and all of white noise: the fitted
    kernel trades a little signal for much less noise, on images the fit never saw."""
    c = 3
    lap = np.array([[0, -1, 0], [-1, 4, -1], [0, -1, 0]], np.float32)
    w = np.stack([np.stack([lap * (1.0 if i == o or group > 1 else 0.3) for i in range(c // group)])
                  for o in range(c)]).astype(np.float32)
    b = np.zeros(c, np.float32)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": group, "strides": [1, 1], "dilations": [1, 1]}
    rng = np.random.default_rng(1)
    noisy = lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(np.float32)  # noqa: E731
    fit = Fit(w, b, attrs)
    for _ in range(4):
        x = _smooth(1, c, 24, 24, rng)
        fit.observe(x, noisy(x))
    w2, b2 = fit.solve()
    err_plain = err_fit = 0.0
    for _ in range(3):
        x = _smooth(1, c, 24, 24, rng)
        xq, want = noisy(x), _conv(x, w, b, attrs)
        err_plain += float(np.square(_conv(xq, w, b, attrs) - want).sum())
        err_fit += float(np.square(_conv(xq, w2.astype(np.float32), b2.astype(np.float32), attrs) - want).sum())
    assert err_fit < 0.8 * err_plain, (err_fit, err_plain)


@pytest.mark.parametrize("group,cin,cout", [(1, 6, 5), (6, 6, 6), (2, 4, 6)], ids=["dense", "depthwise", "grouped"])
def test_gptq_rounded_refit_stays_on_the_lowering_grid_and_fits_closer_than_nearest(group, cin, cout):
    """`Fit.rounded`: levels the lowering takes as given (its per-channel scale, max |level| 127),
    whose output on the fitted inputs is nearer the float output than nearest rounding's, with
    the bias taking back the rounding's mean."""
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": group, "strides": [1, 1], "dilations": [1, 1]}
    rng = np.random.default_rng(group * 100 + cout)
    w = rng.standard_normal((cout, cin // group, 3, 3)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    xs = [_smooth(1, cin, 12, 12, rng) + 1.0 for _ in range(4)]         # a mean the bias must take
    xqs = [np.round(x * 4) / 4 for x in xs]
    fit = Fit(w, b, attrs)
    for x, xq in zip(xs, xqs):
        fit.observe(x, xq)
    w_fit, b_fit = fit.solve()
    w_fit = w_fit.astype(np.float32)
    w_g, b_g = fit.rounded(w_fit, b_fit)
    levels, scales = P.weights_per_channel(w_g, 0)
    _, fit_scales = P.weights_per_channel(w_fit, 0)
    np.testing.assert_allclose(scales, fit_scales, rtol=1e-6)
    np.testing.assert_allclose(w_g / scales[:, None, None, None], levels, rtol=0, atol=1e-3)       # on the grid
    assert np.all(np.abs(levels).reshape(cout, -1).max(axis=1) == 127)
    nearest = (P.weights_per_channel(w_fit, 0)[0] * fit_scales[:, None, None, None]).astype(np.float32)

    def error(wq, bq):
        return sum(float(np.square(_conv(xq, wq, np.asarray(bq, np.float32), attrs) - _conv(x, w, b, attrs)).sum())
                   for x, xq in zip(xs, xqs))

    assert error(w_g, b_g) < error(nearest, b_fit)


def test_gptq_rounds_only_convs_whose_samples_determine_their_inputs_covariance(case, monkeypatch):
    """`Fit.determined`: at least as many input rows as a channel has weights (bias included).
    With fewer, GPTQ's feedback would run on its damping alone, so the GPTQ build rounds that
    conv to nearest: its weights then equal the nearest build's, the others' do not."""
    import tftpu.quant.refit as refit

    fit = Fit(np.ones((2, 3, 3, 3), np.float32), np.zeros(2, np.float32), {"kernel_shape": [3, 3]})
    fit.observe(np.ones((1, 3, 5, 7), np.float32), np.ones((1, 3, 5, 7), np.float32))    # 3 x 5 = 15 rows
    assert fit.rows == 15 and not fit.determined                                        # 28 weights a channel
    fit.observe(np.ones((1, 3, 5, 7), np.float32), np.ones((1, 3, 5, 7), np.float32))
    assert fit.rows == 30 and fit.determined
    model, table, samples = case
    nearest, _ = correct_biases(model, table, samples, refit=True, rounding="nearest")
    gptq, _ = correct_biases(model, table, samples, refit=True, rounding="gptq")
    assert not np.array_equal(gptq.weights["wp1"], nearest.weights["wp1"])
    monkeypatch.setattr(refit.Fit, "determined", property(lambda self: self.rows >= 10 ** 9))
    undetermined, _ = correct_biases(model, table, samples, refit=True, rounding="gptq")
    for key in ("wp1", "wd1", "wp2"):
        assert undetermined.weights[key].tobytes() == nearest.weights[key].tobytes(), key


def chain():
    """Depthwise high-pass convs between pointwise ones, on smooth images: INT8 activation noise
    the refit can lower."""
    RNG = np.random.default_rng(11)           # the same model whichever tests ran before
    lap = np.array([[0, -1, 0], [-1, 4, -1], [0, -1, 0]], np.float32)
    b = TopBuilder("chain")
    x = b.input("x", (1, 4, 16, 16))
    y = b.op("Conv", [x, b.weight("wp1", RNG.standard_normal((8, 4, 1, 1)).astype(np.float32)),
                      b.weight("bp1", RNG.standard_normal(8).astype(np.float32))], {"kernel_shape": [1, 1]}, "p1")
    y = b.op("Conv", [y, b.weight("wd1", np.stack([lap[None]] * 8) * np.float32(0.5)), b.none()],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 8}, "d1")
    y = b.op("Relu", [y], {}, "r1")
    y = b.op("Conv", [y, b.weight("wp2", RNG.standard_normal((4, 8, 1, 1)).astype(np.float32)), b.none()],
             {"kernel_shape": [1, 1]}, "p2")
    model = b.finish([y])
    samples = [{"x": _smooth(1, 4, 16, 16, RNG)} for _ in range(6)]
    return model, samples


@pytest.fixture(scope="module")
def case():
    model, samples = chain()
    return model, quant.calibrate(model, samples, "mse"), samples


def test_the_refit_copy_changes_conv_weights_only_and_is_deterministic(case):
    model, table, samples = case
    a, report = correct_biases(model, table, samples, refit=True)
    b, _ = correct_biases(model, table, samples, refit=True)
    assert report.refit == 3 and "3 conv weights refit" in str(report)
    assert [op.name for op in a.ops if not isinstance(op, top.Weight)] == \
        [op.name for op in model.ops if not isinstance(op, top.Weight)]
    for key in ("wp1", "wd1", "wp2"):
        assert not np.array_equal(a.weights[key], model.weights[key])
        assert a.weights[key].tobytes() == b.weights[key].tobytes()
    assert model.weights["wd1"].dtype == a.weights["wd1"].dtype


@pytest.mark.parametrize("rounding", ["nearest", "gptq"])
def test_the_refit_gives_the_same_bytes_on_one_thread_as_on_several(case, monkeypatch, rounding):
    """The samples are gathered on worker threads; every sum is still taken in sample order."""
    import tftpu.quant.bias_correction as bc
    model, table, samples = case
    made = {}
    for n in (1, 3):
        monkeypatch.setattr(bc, "pool_size", lambda n=n: n)
        made[n], report = correct_biases(model, table, samples, refit=True, rounding=rounding, asymmetric="auto")
        assert report.refit == 3
    for key, value in made[1].weights.items():
        assert value.tobytes() == made[3].weights[key].tobytes(), key


def test_ops_kept_in_float_get_their_own_weights_and_bias_back(case):
    model, table, samples = case
    refit, _ = correct_biases(model, table, samples, refit=True)
    back = restore_weights(refit, model, {"p1", "d1"})
    np.testing.assert_array_equal(back.weights["wp1"], model.weights["wp1"])
    np.testing.assert_array_equal(back.weights["bp1"], model.weights["bp1"])
    d1 = next(op for op in back.ops if isinstance(op, top.Conv) and op.loc == "d1")
    bias = d1.operands[2].owner           # the refit gave d1 a bias it had not: zeros again
    assert not isinstance(bias, top.Weight) or not np.any(back.weights[bias.key])
    assert not np.array_equal(back.weights["wp2"], model.weights["wp2"])


def test_deploy_refits_and_judges_against_the_model_as_given(case):
    model, table, samples = case
    plain = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, mixed_precision="none")
    refit = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, mixed_precision="none",
                   samples=samples, weight_refit=True, test_input=samples[0])
    assert refit.bias_correction is not None and refit.bias_correction.refit == 3
    assert "kept" in refit.bias_correction.check
    # kept only where the worst output SQNR the guard judges does not drop; else the plain lowering
    before, after = map(float, re.search(r"SQNR on .*? ([-\d.]+) -> ([-\d.]+) dB", refit.bias_correction.check).groups())
    if refit.bias_correction.kept:
        assert after >= before
    else:
        assert after < before and len(list(refit.model.ops)) == len(list(plain.model.ops))


def test_compile_refits_by_default_and_reports_it(case):
    import tftpu

    model, _, samples = case
    on = tftpu.compile(model, chip="npu1", calibration_data=samples, test_input=samples[0], mixed_precision="none",
                       space_to_depth=False)
    stage = next(s for s in on.stages if s.name in ("weight refit", "bias correction"))
    assert all(s.name != "weight rounding" for s in on.stages)
    # the refit, or plain bias correction where that did better on what the guard judges
    assert "3 conv weights refit to their INT8 inputs" in stage.check if stage.name == "weight refit" \
        else "(weight refit " in stage.check
    alone = tftpu.compile(model, chip="npu1", calibration_data=samples, test_input=samples[0],
                          mixed_precision="none", space_to_depth=False, bias_correction=False)
    stage = next(s for s in alone.stages if s.name == "weight refit")
    assert "3 conv weights refit to their INT8 inputs" in stage.check and alone.report["weight_refit"]["refit"] == 3
    off = tftpu.compile(model, chip="npu1", calibration_data=samples, test_input=samples[0], mixed_precision="none",
                        space_to_depth=False, weight_refit=False)
    assert "weight_refit" not in off.report and any(s.name == "weight rounding" for s in off.stages)


def test_a_refit_that_does_worse_gives_way_to_bias_correction(case, monkeypatch):
    import tftpu.quant.refit as refit_module

    model, table, samples = case
    real = refit_module.Fit.solve
    monkeypatch.setattr(refit_module.Fit, "solve", lambda self, ridge=None: tuple(-v for v in real(self, ridge)))
    got = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, mixed_precision="none",
                 samples=samples, weight_refit=True, bias_correction=True, test_input=samples[0])
    assert got.bias_correction.refit == 0 and "(weight refit not kept" in got.bias_correction.check
    alone = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, mixed_precision="none",
                   samples=samples, bias_correction=True, test_input=samples[0])
    assert got.bias_correction.kept == alone.bias_correction.kept


def test_deploy_rounds_the_refit_by_gptq_or_keeps_the_better_of_both(case):
    from tftpu.errors import UsageError

    model, table, samples = case
    common = dict(quantize="INT8", chip="npu1", calibration_table=table, mixed_precision="none", samples=samples,
                  weight_refit=True, test_input=samples[0])
    nearest = deploy(model, refit_rounding="nearest", **common)
    gptq = deploy(model, refit_rounding="gptq", **common)
    auto = deploy(model, **common)
    assert nearest.bias_correction.rounding == "nearest" and "GPTQ" not in nearest.bias_correction.check
    assert gptq.bias_correction.rounding == "gptq" and gptq.bias_correction.refit == 3
    assert "rounded by GPTQ's error feedback" in str(gptq.bias_correction)
    # auto: the first program built both ways, the one the guard judges better lowered
    taken = gptq if auto.bias_correction.rounding == "gptq" else nearest
    assert auto.bias_correction.rounding in ("nearest", "gptq")
    assert auto.bias_correction.kept == taken.bias_correction.kept
    if auto.bias_correction.rounding == "gptq":
        assert "(rounded to nearest: " in auto.bias_correction.check
    with pytest.raises(UsageError, match="refit_rounding"):
        deploy(model, refit_rounding="adaround", **common)

"""Ranges clipped to what saturating readers tell apart (`tftpu.quant.saturation`): each reader's
interval holds (its output the same on the clipped input: exactly, or within SOFT_TAIL), the walk
through moves and constant shifts and scales finds it, and deploy lowers with it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tftpu import quant
from tftpu.interp.kernels import KERNELS
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.ir import TopBuilder
from tftpu.pipelines.deploy import deploy
from tftpu.quant.saturation import READERS, SOFT_TAIL, clip_to_readers, reader_intervals

EXACT = {"top.HardSigmoid", "top.Clip", "top.Relu", "top.HardSwish"}
ATTRS = {"top.HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "top.Clip": {"min": -1.5, "max": 4.0},
         "top.Relu": {"relu_limit": 6.0}, "top.GELU": {"approximate": "none"}}


@pytest.mark.parametrize("name", sorted(READERS))
@settings(max_examples=25, deadline=None)
@given(scale=st.floats(0.1, 400.0), seed=st.integers(0, 2 ** 16), alpha=st.floats(0.05, 2.0),
       beta=st.floats(-1.0, 2.0))
def test_a_readers_output_is_the_same_on_its_clipped_input(name, scale, seed, alpha, beta):
    attrs = dict(ATTRS.get(name, {}))
    if name == "top.HardSigmoid":
        attrs = {"alpha": alpha, "beta": beta}
    lo, hi = READERS[name](attrs)
    x = (np.random.default_rng(seed).standard_normal((4, 64)) * scale).astype(np.float32)
    kernel = KERNELS[name]
    y = np.asarray(kernel([x], attrs)[0], np.float64)
    y_clipped = np.asarray(kernel([np.clip(x, lo, hi).astype(np.float32)], attrs)[0], np.float64)
    if name in EXACT:
        np.testing.assert_array_equal(y, y_clipped)
    else:
        np.testing.assert_allclose(y, y_clipped, rtol=0, atol=SOFT_TAIL + 2.0 ** -23)   # (float32's step below 1)


def _se_head():
    """A conv whose output only a HardSigmoid gate reads (an SE block's), and a sigmoid head
    reading a conv through a constant shift and a reshape; one tensor also read by a Mul."""
    rng = np.random.default_rng(3)
    b = TopBuilder("heads")
    x = b.input("x", (1, 4, 8, 8))
    f = b.op("Conv", [x, b.weight("w0", 3 * rng.standard_normal((4, 4, 1, 1)).astype(np.float32)), b.none()],
             {"kernel_shape": [1, 1]}, "feat")
    g = b.op("Conv", [f, b.weight("w1", 20 * rng.standard_normal((4, 4, 1, 1)).astype(np.float32)), b.none()],
             {"kernel_shape": [1, 1]}, "gate_in")
    g = b.op("HardSigmoid", [g], {"alpha": 0.2, "beta": 0.5}, "gate")
    y = b.op("Mul", [f, g], {}, "se")
    s = b.op("Conv", [y, b.weight("w2", 30 * rng.standard_normal((1, 4, 1, 1)).astype(np.float32)), b.none()],
             {"kernel_shape": [1, 1]}, "logit")
    s = b.op("Add", [s, b.weight("shift", np.full((1, 1, 1, 1), 2.0, np.float32))], {}, "shifted")
    s = b.op("Reshape", [s], {"shape": [1, 64]}, "flat")
    s = b.op("Sigmoid", [s], {}, "prob")
    model = b.finish([s])
    samples = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(6)]
    return model, samples


def test_the_walk_finds_saturating_readers_through_shifts_and_moves():
    model, _ = _se_head()
    found = reader_intervals(model)
    assert found["gate_in"] == pytest.approx((-2.5, 2.5))
    a = READERS["top.Sigmoid"]({})
    assert found["flat"] == pytest.approx(a)
    assert found["shifted"] == pytest.approx(a)
    assert found["logit"] == pytest.approx((a[0] - 2.0, a[1] - 2.0))      # before the +2
    # read by the Mul as well (feat), or a model output (prob): left alone
    assert "feat" not in found and "prob" not in found and "se" not in found


def _gated():
    """A HardSigmoid gate over steep inputs (a sum of 16 channels, about +-100): where it moves,
    |x| < 2.5, is a small part of their range."""
    rng = np.random.default_rng(5)
    b = TopBuilder("gated")
    x = b.input("x", (1, 16, 16, 16))
    g = b.op("Conv", [x, b.weight("w", (8 * rng.standard_normal((2, 16, 1, 1))).astype(np.float32)),
                      b.weight("b", np.array([0.5, -0.5], np.float32))], {"kernel_shape": [1, 1]}, "gate_in")
    g = b.op("HardSigmoid", [g], {"alpha": 0.2, "beta": 0.5}, "gate")
    model = b.finish([g])
    samples = [{"x": rng.standard_normal((1, 16, 16, 16)).astype(np.float32)} for _ in range(6)]
    return model, samples


def test_clipped_table_and_deploy_uses_it():
    model, samples = _se_head()
    table = quant.calibrate(model, samples, "mse")
    clipped, report = clip_to_readers(model, table)
    assert set(report.changed) <= {"gate_in", "logit", "shifted", "flat"} and "gate_in" in report.changed
    t, lo, hi = clipped.entries["gate_in"][:3]
    assert lo >= -2.5 - 1e-5 and hi <= 2.5 + 1e-5 and t <= 2.5 + 1e-5     # (the knees widened a last bit)
    assert clipped.entries["feat"] == table.entries["feat"]
    assert "ranges clipped" in report.line and "gate_in" in report.line

    model, samples = _gated()
    table = quant.calibrate(model, samples, "mse")
    runs = {rr: deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                       mixed_precision="none", samples=samples[1:], reader_ranges=rr, wide_links=False)
            for rr in (True, False)}          # (8-bit links: a 16-bit one would hold the wide range finely too)
    assert "gate_in" in runs[True].reader_ranges and runs[False].reader_ranges is None
    # the gate's input on a grid many times as fine where it moves: the outputs nearer float
    on, off = runs[True].outputs[0].sqnr, runs[False].outputs[0].sqnr
    assert on > off + 2, (on, off)


@pytest.mark.parametrize("op,first", [("Add", True), ("Sub", True), ("Sub", False), ("Mul", True),
                                      ("Div", True)])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2 ** 16), per_channel=st.booleans())
def test_the_interval_through_a_constant_shift_or_scale_leaves_the_output_as_it_is(op, first, seed, per_channel):
    rng = np.random.default_rng(seed)
    shape = (1, 3, 1, 1) if per_channel else (1, 1, 1, 1)
    c = rng.uniform(0.2, 3.0, shape) * rng.choice([-1.0, 1.0], shape)
    b = TopBuilder("affine")
    x = b.input("x", (1, 3, 8, 8))
    k = b.weight("c", c.astype(np.float32))
    y = b.op(op, [x, k] if first else [k, x], {}, "shifted")
    y = b.op("HardSigmoid", [y], {"alpha": 0.2, "beta": 0.5}, "gate")
    model = b.finish([y])
    lo, hi = reader_intervals(model)["x"]
    v = (rng.standard_normal((1, 3, 8, 8)) * 20).astype(np.float32)
    run = TopInterpreter(model)
    want = run.run({"x": v})["gate"]
    got = run.run({"x": np.clip(v, lo, hi).astype(np.float32)})["gate"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert np.mean((v < lo) | (v > hi)) > 0          # (the interval did clip something)

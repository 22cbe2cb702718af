"""INT8 Div by a constant: an INT8 Mul by the reciprocal (its own per-tensor grid), bit-exact
against the integer reference and close to the float Div; Div by an activation, or by a
constant holding a zero, stays float and says why."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.interp.test_tpu_int8_exact import SWEEP, feeds, make_model, run_exact, table_for
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter


@SWEEP
@given(st.data())
def test_div_by_constant_exact_and_close(data):
    d = data.draw
    form = d(st.sampled_from(["scalar", "one", "channels", "full"]))
    asym, seed = d(st.booleans()), d(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    shape = (1, 3, 4, 5)
    cshape = {"scalar": (), "one": (1,), "channels": (1, 3, 1, 1), "full": shape}[form]
    mag = d(st.sampled_from([6.0, 0.1, 3.7, 1000.0]))
    c = (mag * rng.uniform(0.5, 1.0, cshape) * rng.choice([-1.0, 1.0], cshape)).astype(np.float32)
    model = make_model({"x": shape}, lambda b, xs: b.op("Div", [b.op("Neg", [xs[0]], {}, "n"), b.weight("c", c)],
                                                        {}, "y"))
    inputs = feeds({"x": shape}, seed)
    tm, report, dump, seen = run_exact(model, inputs, table_for(model, inputs, seed, spread=(1.0, 1.2)),
                                       asymmetric=asym)
    assert not report.fallbacks, str(report)
    assert seen.get("tpu.Mul") == 1 and not any(op.name == "tpu.Div" for op in tm.ops)
    got = TpuInterpreter(tm).run(inputs)["y"].astype(np.float64)
    want = TopInterpreter(model).run(inputs)["y"].astype(np.float64)
    out = next(op for op in tm.ops if op.name == "tpu.Mul").results[0].type.element_type
    xin = next(op for op in tm.ops if op.name == "tpu.Mul").operands[0].type.element_type
    # one level of the output and one of the input carried through 1/c (half a level each,
    # symmetric; asymmetric grids may clip an extreme by up to half a level more), and for a
    # non-scalar divisor the reciprocal's own rounding (half a level of max|1/c| / 127, times |x|)
    recip = np.abs(1.0 / c.astype(np.float64))
    bound = out.scale + xin.scale * recip.max() + 1e-6
    if c.size > 1:
        bound += np.abs(-inputs["x"]).max() * recip.max() / 127 * 0.5
    assert np.abs(got - want).max() <= bound * 1.01


def test_div_by_scalar_is_a_plain_requantization():
    """x / 6: the reciprocal is exactly 127 levels of (1/6) / 127, so INT8 x / 6 is within one
    output level of the float result."""
    shape = (2, 8)
    model = make_model({"x": shape}, lambda b, xs: b.op("Div", [xs[0], b.weight("six", np.float32(6.0))], {}, "y"))
    inputs = feeds({"x": shape}, 3)
    tm, report, _, seen = run_exact(model, inputs, table_for(model, inputs, 3, spread=(1.0, 1.0)))
    assert not report.fallbacks and seen["tpu.Mul"] == 1
    recip = next(op for op in tm.ops if op.name == "tpu.Mul").operands[1]
    assert tm.weights[recip.owner.key].tolist() == 127
    got = TpuInterpreter(tm).run(inputs)["y"]
    want = inputs["x"] / 6
    lsb = next(op for op in tm.ops if op.name == "tpu.Mul").results[0].type.element_type.scale
    assert np.abs(got - want).max() <= lsb


def test_div_by_activation_or_zero_stays_float_with_reason():
    shapes = {"x": (1, 4), "y": (1, 4)}

    def body(b, xs):
        by_act = b.op("Div", [xs[0], b.op("Exp", [xs[1]], {}, "e")], {}, "q")
        by_zero = b.op("Div", [xs[0], b.weight("z", np.array([1.0, 0.0, 2.0, 3.0], np.float32))], {}, "z0")
        return [by_act, by_zero]

    model = make_model(shapes, body)
    inputs = feeds(shapes, 4)
    with np.errstate(divide="ignore"):
        _, report, _, _ = run_exact(model, inputs, table_for(model, inputs, 4))
    reasons = {d.name: d.reason for d in report.fallbacks}
    assert "divisor is not a constant" in reasons["q"]
    assert "has a zero" in reasons["z0"]

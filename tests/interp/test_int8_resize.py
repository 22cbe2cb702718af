"""INT8 Resize: nearest is a data move on the input's grid; linear interpolates in exact
integers (10-bit fixed-point source coordinates, rounding half away from zero), bit-equal to the
independent reference (`int8_reference.resize_linear`) and within one output level of the float
Resize of the same int8 input, over shapes, up/down and non-integral scales, 1-3 spatial axes,
both layouts and every coordinate / nearest mode."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.interp import int8_reference as R
from tests.interp.test_tpu_int8_exact import SWEEP, feeds, make_model, run_exact, table_for
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.quant import CalibrationTable

COORD_MODES = ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel", "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
MANY = settings(SWEEP, max_examples=80)        # modes x layouts x axes: more cases, ~2 s


def _resize_case(d):
    """A random Resize: (input shape, attrs)."""
    nsp = d(st.sampled_from([1, 2, 2, 2, 3]), "spatial axes")
    size = [d(st.integers(1, 7)) for _ in range(nsp)]
    target = [d(st.sampled_from([1, 2, 3, 5, 8, 13, s, 2 * s, max(1, s // 2)])) for s in size]
    nhwc = d(st.booleans(), "NHWC")
    c, n = d(st.integers(1, 3)), d(st.integers(1, 2))
    attrs = {"mode": d(st.sampled_from(["nearest", "linear"])), "coord_mode": d(st.sampled_from(COORD_MODES)),
             "nearest_mode": d(st.sampled_from(NEAREST_MODES)), "target_shape": target,
             "layout": "NHWC" if nhwc else "NCHW"}
    return ((n, *size, c) if nhwc else (n, c, *size)), attrs


def _grid_of(tm, op_name):
    op = next(op for op in tm.ops if op.name == op_name)
    return R.Info.of(op.operands[0]), R.Info.of(op.results[0])


@MANY
@given(st.data())
def test_resize_exact(data):
    d = data.draw
    shape, attrs = _resize_case(d)
    asym, produced = d(st.booleans(), "asymmetric"), d(st.booleans(), "after an INT8 op")
    seed = d(st.integers(0, 2 ** 16))

    def body(b, xs):
        x = b.op("Neg", [xs[0]], {}, "n") if produced else xs[0]
        return b.op("Resize", [x], attrs, "y")

    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, seed)
    tm, report, dump, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    assert not report.fallbacks, str(report)
    assert seen.get("tpu.Resize") == 1
    xi, yi = _grid_of(tm, "tpu.Resize")
    assert (xi.scales, xi.zps) == (yi.scales, yi.zps)      # the input's grid


@MANY
@given(st.data())
def test_resize_close_to_float(data):
    """Linear: within one output level of the float Resize of the dequantized int8 input (0.5
    for the final rounding, under 2**-11 * 255 per axis for the coordinates), and within that
    plus half an input level of the float Resize of the float input. Nearest: equal to the
    float Resize of the dequantized input (it only moves elements)."""
    d = data.draw
    shape, attrs = _resize_case(d)
    asym, seed = d(st.booleans(), "asymmetric"), d(st.integers(0, 2 ** 16))
    model = make_model({"x": shape}, lambda b, xs: b.op("Resize", [b.op("Neg", [xs[0]], {}, "n")], attrs, "y"))
    inputs = feeds({"x": shape}, seed)
    table = table_for(model, inputs, seed, spread=(1.0, 1.3))      # no saturation
    tm, report, dump, _ = run_exact(model, inputs, table, asymmetric=asym)
    xi, yi = _grid_of(tm, "tpu.Resize")
    xq = next(op.operands[0] for op in tm.ops if op.name == "tpu.Resize")
    from tftpu.ir.base import value_name
    x_deq = R.dequantize(dump[value_name(xq)], xi.scale, xi.zp)
    y_deq = R.dequantize(dump[value_name(next(op for op in tm.ops if op.name == "tpu.Resize").results[0])],
                         yi.scale, yi.zp).astype(np.float64)
    resize = lambda x: TopInterpreter(make_model({"x": shape}, lambda b, xs: b.op(   # noqa: E731
        "Resize", [xs[0]], attrs, "y"))).run({"x": x})["y"].astype(np.float64)
    same_input = resize(x_deq)
    if attrs["mode"] == "nearest":
        assert np.array_equal(y_deq, same_input)
        return
    lsb = yi.scale
    assert np.abs(y_deq - same_input).max() <= lsb * (0.5 + len(attrs["target_shape"]) * 255 * 2.0 ** -11) + 1e-6
    want = resize(-inputs["x"])
    assert np.abs(y_deq - want).max() <= lsb * (1.0 + len(attrs["target_shape"]) * 255 * 2.0 ** -11) + 1e-6


def test_linear_rounding_of_known_values():
    """2x up, half_pixel: output 1 sits at 0.25, output 2 at 0.75 of the way from input 0 to 1
    (weights 768/256 and 256/768 of 1024); 1/2 level ties round away from zero."""
    x = np.array([[[0.0, 2.0, -2.0, 0.0]]], np.float32)           # levels 0, 2, -2, 0 at scale 1
    attrs = {"mode": "linear", "coord_mode": "half_pixel", "target_shape": [8]}
    model = make_model({"x": x.shape}, lambda b, xs: b.op("Resize", [xs[0]], attrs, "y"))
    table = CalibrationTable({"x": (127.0, -127.0, 127.0), "y": (127.0, -127.0, 127.0)})
    tm, report, dump, seen = run_exact(model, {"x": x}, table)
    assert seen["tpu.Resize"] == 1
    y = TpuInterpreter(tm).run({"x": x})["y"]
    # exact: 0, 0.5, 1.5, 1, -1, -1.5, -0.5, 0 -> ties away from zero
    assert y.ravel().tolist() == [0, 1, 2, 1, -1, -2, -1, 0]


def test_resize_follows_a_float_input_when_nearest():
    """A nearest Resize after an op that runs in float stays float (a data move); a linear one
    runs in INT8."""
    from tftpu.transforms.lowering import lower

    shape = (1, 2, 3, 4)

    def body(b, xs):
        s = b.op("Tanh", [xs[0]], {}, "s")
        near = b.op("Resize", [s], {"mode": "nearest", "target_shape": [6, 8]}, "near")
        lin = b.op("Resize", [s], {"mode": "linear", "target_shape": [6, 8]}, "lin")
        return [near, lin]

    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, 1)
    tm, report = lower(model, "npu1", "INT8", table_for(model, inputs, 1), qtable={"s": "F32"})
    modes = {d.name: (d.mode, d.reason) for d in report.decisions}
    assert modes["near"][0] == "F32" and "follows its float input" in modes["near"][1]
    assert modes["lin"][0] == "INT8"
    R.check_model(tm, TpuInterpreter(tm).run(inputs, dump_all=True))


def test_resize_and_div_on_the_simulated_chip_bit_equal():
    """The program (layer groups, DDR, commands) runs INT8 Resize (both modes) and Div by a
    constant to the same integers as TPU inference."""
    from tftpu.backend.codegen import generate
    from tftpu.backend.simulator import Simulator
    from tftpu.transforms.lowering import lower

    shape = (1, 4, 6, 5)

    def body(b, xs):
        t = b.op("Tanh", [xs[0]], {}, "t")
        lin = b.op("Resize", [t], {"mode": "linear", "target_shape": [11, 13]}, "lin")
        near = b.op("Resize", [t], {"mode": "nearest", "coord_mode": "asymmetric", "nearest_mode": "floor",
                                    "target_shape": [11, 13]}, "near")
        return b.op("Div", [b.op("Add", [lin, near], {}, "a"), b.weight("six", np.float32(6.0))], {}, "y")

    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, 2)
    tm, report = lower(model, "npu1", "INT8", table_for(model, inputs, 2))
    assert not report.fallbacks, str(report)
    got = Simulator(generate(tm, "npu1")).run(inputs)
    want = TpuInterpreter(tm).run(inputs)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_a_mode_without_an_integer_rule_declines_with_its_reason():
    """The TOP op knows nearest and linear only; any other mode (a module from elsewhere) stays
    float, saying why."""
    from tftpu.transforms.lowering import int8_resize

    class Cubic:
        name = "top.Resize"

        def attrs(self):
            return {"mode": "cubic"}

    assert int8_resize.resize(None, Cubic()) == "cubic resize has no INT8 rule (nearest and linear do)"

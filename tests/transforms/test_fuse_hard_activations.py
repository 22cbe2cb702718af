"""HardSwish / HardSigmoid as ONNX exporters write them (PyTorch, Paddle, Keras via tf2onnx):
every order and grouping of `x * clip(x + 3, 0, 6) / 6`, `x * HardSigmoid(x)`,
`clip(alpha * x + beta, 0, 1)` becomes one op under the full canonicalization, computing the same
as the unfused graph (TOP interpreter) on random inputs and at the breakpoints -3, 0 and 3; near
misses (3.1, / 5, 0.17, a Relu fused into the product, another tensor) are left alone."""

from __future__ import annotations

import numpy as np
import pytest

from tftpu.interp.top_interpreter import run
from tftpu.ir import TopBuilder
from tftpu.transforms import canonicalize as C

SHAPE = (2, 3, 4, 5)


def _inputs():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(SHAPE) * 4).astype(np.float32)
    flat = x.reshape(-1)
    edges = np.array([-3, 3, 0, -6, 6, -3.0001, -2.9999, 2.9999, 3.0001, 1e-7, -1e-7], np.float32)
    flat[:edges.size] = edges
    return {"x": x, "y": rng.standard_normal(SHAPE).astype(np.float32)}


def _c(b, name, v):
    return b.weight(name, np.array(v, np.float32))


def _relu6_plus3(b, x, how="clip", swap=False):
    t = b.op("Add", [_c(b, "three", 3.0), x] if swap else [x, _c(b, "three", 3.0)], {}, "t")
    if how == "clip":
        return b.op("Clip", [t], {"min": 0.0, "max": 6.0}, "r6")
    return b.op("Relu", [t], {"relu_limit": 6.0}, "r6")


def _hardsigmoid_affine(b, x, alpha=1 / 6, beta=0.5, div=False, name="hs"):
    t = b.op("Div", [x, _c(b, "d", 1 / alpha)], {}, "ax") if div else b.op("Mul", [x, _c(b, "a", alpha)], {}, "ax")
    return b.op("Clip", [b.op("Add", [t, _c(b, "b", beta)], {}, "axb")], {"min": 0.0, "max": 1.0}, name)


# each: (name, body(b, x, y) -> output, the ops left after canonicalization)
HARDSWISH = {
    "paddle_div_last": lambda b, x, y: b.op("Div", [b.op("Mul", [x, _relu6_plus3(b, x)], {}, "m"),
                                                    _c(b, "six", 6.0)], {}, "out"),
    "mul_sixth_last": lambda b, x, y: b.op("Mul", [b.op("Mul", [x, _relu6_plus3(b, x, swap=True)], {}, "m"),
                                                   _c(b, "k", 1 / 6)], {}, "out"),
    "sixth_first": lambda b, x, y: b.op("Mul", [_c(b, "k", 1 / 6), b.op("Mul", [_relu6_plus3(b, x), x], {}, "m")],
                                        {}, "out"),
    "relu6_div_inside": lambda b, x, y: b.op("Mul", [x, b.op("Div", [_relu6_plus3(b, x, "relu"), _c(b, "six", 6.0)],
                                                             {}, "h")], {}, "out"),
    "x_div_six_first": lambda b, x, y: b.op("Mul", [b.op("Div", [x, _c(b, "six", 6.0)], {}, "xs"),
                                                    _relu6_plus3(b, x)], {}, "out"),
    "paddle_constant_0.1666667": lambda b, x, y: b.op("Mul", [b.op("Mul", [x, _relu6_plus3(b, x)], {}, "m"),
                                                              _c(b, "k", 0.1666667)], {}, "out"),
    "torch_hardsigmoid_op": lambda b, x, y: b.op("Mul", [b.op("HardSigmoid", [x], {"alpha": 1 / 6, "beta": 0.5}, "h"),
                                                         x], {}, "out"),
    "paddle_hardsigmoid_mul": lambda b, x, y: b.op("Mul", [x, _hardsigmoid_affine(b, x)], {}, "out"),
    "paddle_hardsigmoid_div": lambda b, x, y: b.op("Mul", [_hardsigmoid_affine(b, x, div=True), x], {}, "out"),
}

HARDSIGMOID = {
    "relu6_div": lambda b, x, y: b.op("Div", [_relu6_plus3(b, x), _c(b, "six", 6.0)], {}, "out"),
    "sixth_times_relu6": lambda b, x, y: b.op("Mul", [_c(b, "k", 1 / 6), _relu6_plus3(b, x, "relu", True)], {}, "out"),
    "paddle_slope_0.2": lambda b, x, y: _hardsigmoid_affine(b, x, alpha=0.2, beta=0.5, name="out"),
    "div_by_5_plus_0.4": lambda b, x, y: _hardsigmoid_affine(b, x, alpha=0.2, beta=0.4, div=True, name="out"),
}

NOT_FUSED = {
    "three_is_3.1": lambda b, x, y: b.op("Div", [b.op("Mul", [x, b.op("Clip", [b.op(
        "Add", [x, _c(b, "c", 3.1)], {}, "t")], {"min": 0.0, "max": 6.0}, "r")], {}, "m"), _c(b, "six", 6.0)], {}, "out"),
    "div_by_5": lambda b, x, y: b.op("Div", [b.op("Mul", [x, _relu6_plus3(b, x)], {}, "m"), _c(b, "five", 5.0)],
                                     {}, "out"),
    "times_0.17": lambda b, x, y: b.op("Mul", [b.op("Mul", [x, _relu6_plus3(b, x)], {}, "m"), _c(b, "k", 0.17)],
                                       {}, "out"),
    "clip_to_6.5": lambda b, x, y: b.op("Div", [b.op("Mul", [x, b.op("Clip", [b.op(
        "Add", [x, _c(b, "three", 3.0)], {}, "t")], {"min": 0.0, "max": 6.5}, "r")], {}, "m"), _c(b, "six", 6.0)],
        {}, "out"),
    "other_tensor": lambda b, x, y: b.op("Div", [b.op("Mul", [y, _relu6_plus3(b, x)], {}, "m"), _c(b, "six", 6.0)],
                                         {}, "out"),
    "relu_on_the_product": lambda b, x, y: b.op("Div", [b.op("Mul", [x, _relu6_plus3(b, x)], {"do_relu": True}, "m"),
                                                        _c(b, "six", 6.0)], {}, "out"),
    "hardsigmoid_0.2": lambda b, x, y: b.op("Mul", [x, b.op("HardSigmoid", [x], {"alpha": 0.2, "beta": 0.5}, "h")],
                                            {}, "out"),
    "bare_clip_of_x_plus_half": lambda b, x, y: b.op("Clip", [b.op("Add", [x, _c(b, "h", 0.5)], {}, "t")],
                                                     {"min": 0.0, "max": 1.0}, "out"),
}


def _model(body):
    b = TopBuilder("m")
    x, y = b.input("x", SHAPE), b.input("y", SHAPE)
    out = body(b, x, y)
    return b.finish([out])


def _check(body):
    """Full canonicalization: same outputs as the unfused graph; returns (ops left, report)."""
    model = _model(body)
    inputs = _inputs()
    before = run(model, inputs)
    report = C.canonicalize(model)
    after = run(model, inputs)
    assert list(after) == list(before) == ["out"]
    np.testing.assert_allclose(after["out"], before["out"], rtol=1e-6, atol=1e-6)
    ops = [op.op_name for op in model.ops if op.op_name not in ("Weight", "None", "Input")]
    return ops, report


@pytest.mark.parametrize("form", list(HARDSWISH))
def test_hardswish_forms_become_one_op(form):
    ops, report = _check(HARDSWISH[form])
    assert ops == ["HardSwish"], (ops, str(report))


@pytest.mark.parametrize("form", list(HARDSIGMOID))
def test_hardsigmoid_forms_become_one_op(form):
    ops, report = _check(HARDSIGMOID[form])
    assert ops == ["HardSigmoid"], (ops, str(report))


@pytest.mark.parametrize("form", list(NOT_FUSED))
def test_near_misses_are_not_fused(form):
    ops, report = _check(NOT_FUSED[form])
    assert "HardSwish" not in ops and report.counts["fuse-hardswish"] == 0, (ops, str(report))
    if form != "hardsigmoid_0.2":
        assert "HardSigmoid" not in ops, (ops, str(report))


def test_shared_product_is_kept():
    """x * relu6(x + 3) also used elsewhere: the product stays (fusing would compute it twice)."""
    b = TopBuilder("m")
    x = b.input("x", SHAPE)
    m = b.op("Mul", [x, _relu6_plus3(b, x)], {}, "m")
    out = b.op("Div", [m, _c(b, "six", 6.0)], {}, "out")
    model = b.finish([out, b.op("Neg", [m], {}, "neg")])
    inputs = {"x": _inputs()["x"]}
    before = run(model, inputs)
    C.canonicalize(model)
    after = run(model, inputs)
    for k in before:
        np.testing.assert_allclose(after[k], before[k], rtol=1e-6, atol=1e-6)
    assert "HardSwish" not in [op.op_name for op in model.ops]


def test_fused_values_at_the_breakpoints():
    """HardSwish(-3) = 0, HardSwish(3) = 3, HardSigmoid(-3) = 0, HardSigmoid(3) = 1, as the
    unfused graphs give."""
    x = np.array([[-6, -3, -1.5, 0, 1.5, 3, 6]], np.float32)
    for body, want in ((HARDSWISH["paddle_div_last"], x * np.clip(x + 3, 0, 6) / 6),
                       (HARDSIGMOID["relu6_div"], np.clip(x + 3, 0, 6) / 6)):
        b = TopBuilder("m")
        xi, yi = b.input("x", x.shape), b.input("y", x.shape)
        model = b.finish([body(b, xi, yi)])
        C.canonicalize(model)
        got = run(model, {"x": x, "y": x})["out"]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

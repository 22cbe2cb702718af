"""INT8 Deconv, Scale and Softmax: bit-exact against the independent integer reference
(`int8_reference.py`), driven through the real lowering, and close to the float op they replace.
A Softmax that feeds a DFL box expectation stays float, with the reason the report prints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.interp import int8_reference as R
from tests.interp.test_tpu_int8_exact import FEW, SWEEP, W, feeds, make_model, run_exact, table_for
from tftpu import geometry
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.transforms.lowering import lower


def sqnr_db(want, got) -> float:
    want, got = np.asarray(want, np.float64).ravel(), np.asarray(got, np.float64).ravel()
    noise = float(np.sum((want - got) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(want ** 2)) / noise)


def close_to_float(model, inputs, table, asymmetric=False):
    """(INT8 output dequantized, the TOP float output) of a one-output model."""
    tm, report = lower(model, "npu1", "INT8", table, asymmetric=asymmetric)
    got = TpuInterpreter(tm).run(inputs)
    want = TopInterpreter(model).run(inputs)
    name = model.output_names[0]
    return np.asarray(got[name], np.float64), np.asarray(want[name], np.float64), report


# ---------------------------------------------------------------- Deconv

def _deconv_case(d):
    nsp = d(st.sampled_from([1, 2]), "spatial dims")
    kind = d(st.sampled_from(["plain", "grouped", "depthwise"]))
    g = 1 if kind == "plain" else d(st.integers(2, 3))
    cg = 1 if kind == "depthwise" else d(st.integers(1, 3))
    og = 1 if kind == "depthwise" else d(st.integers(1, 3))
    k = [d(st.integers(1, 4)) for _ in range(nsp)]
    s = [d(st.integers(1, 3)) for _ in range(nsp)]
    dil = [d(st.integers(1, 2)) for _ in range(nsp)]
    pads = [d(st.integers(0, 2)) for _ in range(2 * nsp)]
    opad = [d(st.integers(0, max(s[i], dil[i]) - 1)) for i in range(nsp)]
    size = [d(st.integers(1, 6)) for _ in range(nsp)]
    for i in range(nsp):
        assume(geometry.deconv_out(size[i], k[i], s[i], dil[i], pads[i], pads[i + nsp], opad[i]) >= 1)
    nhwc = d(st.booleans(), "NHWC")
    attrs = {"kernel_shape": k, "strides": s, "dilations": dil, "pads": pads, "output_padding": opad,
             "group": g, "do_relu": d(st.booleans()), "relu_limit": d(st.sampled_from([-1.0, 0.5, 3.0])),
             "layout": "NHWC" if nhwc else "NCHW"}
    n = d(st.integers(1, 2))
    xshape = (n, *size, g * cg) if nhwc else (n, g * cg, *size)
    return attrs, xshape, (g * cg, og, *k), g * og


def _deconv_model(attrs, xshape, wshape, o, rng, has_bias):
    w = W(rng, *wshape) * rng.uniform(0.2, 3, (1, wshape[1]) + (1,) * (len(wshape) - 2)).astype(np.float32)

    def body(b, xs):
        bias = b.weight("b", W(rng, o)) if has_bias else b.none()
        return b.op("Deconv", [xs[0], b.weight("w", w), bias], attrs, "y")

    return make_model({"x": xshape}, body)


@SWEEP
@given(st.data())
def test_deconv_exact(data):
    d = data.draw
    attrs, xshape, wshape, o = _deconv_case(d)
    has_bias, asym = d(st.booleans()), d(st.booleans(), "asymmetric")
    seed = d(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    model = _deconv_model(attrs, xshape, wshape, o, rng, has_bias)
    inputs = feeds({"x": xshape}, seed)
    tm, report, _, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    assert not report.fallbacks, str(report)
    assert seen.get("tpu.Deconv") == 1


@FEW
@given(st.data())
def test_deconv_close_to_float(data):
    """On a table that holds the real ranges, the INT8 deconv is within a few output steps of
    the float one (input and weight rounding, one requantization)."""
    d = data.draw
    attrs, xshape, wshape, o = _deconv_case(d)
    attrs = {**attrs, "do_relu": False}
    seed = d(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    model = _deconv_model(attrs, xshape, wshape, o, rng, True)
    inputs = feeds({"x": xshape}, seed)
    got, want, _ = close_to_float(model, inputs, table_for(model, inputs, seed, spread=(1.0, 1.0)))
    step = (np.abs(want).max() + 0.05) / 127
    assert np.abs(got - want).max() <= 4 * step + 1e-6
    if np.abs(want).max() > 0.1 and want.size >= 8:
        assert sqnr_db(want, got) > 25


def test_deconv_reference_is_onnx_conv_transpose():
    """The integer reference itself against onnxruntime's ConvTranspose (integer data, float
    arithmetic exact at these sizes), including groups, dilations and output padding."""
    from tests.interp.onnx_ref import run_node

    rng = np.random.default_rng(1)
    for g, cg, og, k, s, dil, pads, opad in [(1, 3, 2, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (1, 1)),
                                             (2, 2, 3, (2, 3), (3, 1), (2, 1), (0, 2, 1, 0), (1, 0)),
                                             (4, 1, 1, (4, 4), (2, 2), (1, 1), (1, 1, 1, 1), (0, 0))]:
        x = rng.integers(-128, 128, (1, g * cg, 4, 5))
        w = rng.integers(-127, 128, (g * cg, og, *k))
        want = run_node("ConvTranspose", [x.astype(np.float32), w.astype(np.float32)],
                        dict(strides=list(s), pads=list(pads), dilations=list(dil), group=g,
                             output_padding=list(opad)))[0]
        got = R.deconv_nchw(x, w, s, pads, dil, g, opad)
        np.testing.assert_array_equal(got, want.astype(np.int64))


def test_deconv_grouped_weights_keep_one_scale_per_output_channel():
    """Depthwise deconvs quantize per channel (along the filter's input axis, one scale per
    group); plain ones along the output axis."""
    from tftpu.quant.params import deconv_weights

    rng = np.random.default_rng(2)
    w = W(rng, 4, 1, 3, 3) * np.array([0.1, 1, 10, 100], np.float32).reshape(4, 1, 1, 1)
    q, axis, scales, out = deconv_weights(w, 4)
    assert axis == 0 and np.allclose(out, np.abs(w).reshape(4, -1).max(axis=1) / 127)
    assert np.abs(q).reshape(4, -1).max(axis=1).tolist() == [127] * 4
    q, axis, scales, out = deconv_weights(W(rng, 3, 5, 2, 2), 1)
    assert axis == 1 and scales.shape == (5,) and out.shape == (5,)


# ---------------------------------------------------------------- Scale

def _scale_model(d, rng):
    rank = d(st.sampled_from([2, 3, 4]))
    nhwc = rank > 2 and d(st.booleans(), "NHWC")
    c = d(st.integers(1, 5))
    rest = [d(st.integers(1, 4)) for _ in range(rank - 2)]
    xshape = (d(st.integers(1, 2)), *rest, c) if nhwc else (d(st.integers(1, 2)), c, *rest)
    pshape = d(st.sampled_from([(c,), (1, c) + (1,) * (rank - 2) if not nhwc else (c,)]))
    s = W(rng, c, scale=1.0) * rng.choice([0.01, 1.0, 10.0], c).astype(np.float32)
    s[rng.random(c) < 0.15] = 0.0
    bias = W(rng, c, scale=1.0)
    attrs = {"do_relu": d(st.booleans()), "relu_limit": d(st.sampled_from([-1.0, 1.0])),
             "layout": "NHWC" if nhwc else "NCHW"}

    def body(b, xs):
        return b.op("Scale", [xs[0], b.weight("s", s.reshape(pshape)), b.weight("t", bias.reshape(pshape))],
                    attrs, "y")

    return make_model({"x": xshape}, body), xshape


@SWEEP
@given(st.data())
def test_scale_exact(data):
    d = data.draw
    asym = d(st.booleans(), "asymmetric")
    seed = d(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    model, xshape = _scale_model(d, rng)
    inputs = feeds({"x": xshape}, seed)
    tm, report, _, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    assert not report.fallbacks, str(report)
    assert seen.get("tpu.Scale") == 1


@FEW
@given(st.data())
def test_scale_close_to_float(data):
    """Each channel's multiplier is exact (+-127 steps of |s| / 127): the INT8 Scale is within
    an output step (plus the input's rounding times |s|) of the float one."""
    d = data.draw
    seed = d(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    model, xshape = _scale_model(d, rng)
    inputs = feeds({"x": xshape}, seed)
    table = table_for(model, inputs, seed, spread=(1.0, 1.0))
    got, want, _ = close_to_float(model, inputs, table)
    s = np.abs(np.asarray(model.weights["s"], np.float64)).max()
    step_out = table.entries["y"][0] / 127
    step_in = table.entries["x"][0] / 127
    assert np.abs(got - want).max() <= 1.01 * step_out + s * step_in / 2 + 1e-6


def test_scale_with_a_negligible_multiplier_keeps_its_bias():
    """A channel whose scale is tiny beside its bias: the bias grid widens (no int32
    saturation), so the output is the bias, as in float."""
    from tftpu.transforms.lowering.int8_scale import scale_weights

    q, scales, bq = scale_weights(np.array([1e-12, 2.0]), np.array([3.0, -1.0]), 0.01)
    assert q.tolist() == [0, 127] and abs(bq[0] * 0.01 * scales[0] - 3.0) < 1e-6 and abs(bq[0]) <= 1 << 30
    s = np.array([1e-12, 2.0], np.float32)

    def body(b, xs):
        return b.op("Scale", [xs[0], b.weight("s", s), b.weight("t", np.array([3.0, -1.0], np.float32))], {}, "y")

    model = make_model({"x": (1, 2, 3, 3)}, body)
    inputs = feeds({"x": (1, 2, 3, 3)}, 4)
    tm, report, dump, seen = run_exact(model, inputs, table_for(model, inputs, 4, spread=(1.0, 1.0)))
    got, want, _ = close_to_float(model, inputs, table_for(model, inputs, 4, spread=(1.0, 1.0)))
    assert np.abs(got[:, 0] - 3.0).max() < 0.05


# ---------------------------------------------------------------- Softmax

def _softmax_f64(x, axis):
    z = np.asarray(x, np.float64)
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@SWEEP
@given(st.data())
def test_softmax_exact(data):
    d = data.draw
    rank = d(st.integers(1, 4))
    shape = tuple(d(st.integers(1, 6)) for _ in range(rank))
    axis = d(st.integers(-rank, rank - 1))
    asym = d(st.booleans(), "asymmetric")
    spread = d(st.sampled_from([0.5, 3.0, 20.0]), "logit range")
    read = d(st.booleans(), "read in INT8 (1/256 grid) or only an output (16 bits)")
    seed = d(st.integers(0, 2 ** 16))

    def body(b, xs):
        y = b.op("Softmax", [xs[0]], {"axis": axis}, "y")
        return b.op("Sqrt", [y], {}, "r") if read else y

    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, seed, scale=spread)
    tm, report, _, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    assert not report.fallbacks, str(report)
    assert seen.get("tpu.Softmax") == 1
    sm = next(op for op in tm.ops if op.name == "tpu.Softmax")
    assert R.Info.of(sm.results[0]).dtype == ("i8" if read else "i16")


@FEW
@given(st.data())
def test_softmax_close_to_float(data):
    """Against the float softmax of the very INT8 logits it reads, the INT8 softmax is off by at
    most half an output step plus the table's rounding (1/256 grid, or 1/65536 for an output;
    1 - one step at most); against the float softmax of the float logits, close."""
    d = data.draw
    shape = (d(st.integers(1, 3)), d(st.integers(2, 40)))
    spread = d(st.sampled_from([0.5, 3.0, 20.0]))
    read = d(st.booleans())
    seed = d(st.integers(0, 2 ** 16))

    def body(b, xs):
        y = b.op("Softmax", [xs[0]], {"axis": -1}, "y")
        return b.op("Reshape", [y], {"shape": list(shape)}, "r") if read else y

    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, seed, scale=spread)
    table = table_for(model, inputs, seed, spread=(1.0, 1.0))
    tm, _ = lower(model, "npu1", "INT8", table)
    dump = TpuInterpreter(tm).run(inputs, dump_all=True)
    sm = next(op for op in tm.ops if op.name == "tpu.Softmax")
    xi = R.Info.of(sm.operands[0])
    from tftpu.ir.base import value_name
    logits = R.dequantize(dump[value_name(sm.operands[0])], xi.scale, xi.zp).astype(np.float64)
    yi = R.Info.of(sm.results[0])
    assert yi.dtype == ("i8" if read else "i16")
    got = R.dequantize(dump[value_name(sm.results[0])], yi.scale, yi.zp).astype(np.float64)
    want = np.minimum(_softmax_f64(logits, -1), 1 - yi.scale)
    assert np.abs(got - want).max() <= 0.5 * yi.scale + shape[1] * 2.0 ** -17 + 1e-9
    assert np.abs(got - _softmax_f64(inputs["x"], -1)).max() <= 1.5 * yi.scale + xi.scale


@pytest.mark.parametrize("form", ["matmul", "matmul_t", "conv", "mul", "conv_scaled", "split"])
def test_softmax_feeding_a_dfl_projection_stays_float_with_its_reason(form):
    """DFL box decode: a softmax over N bins times the constant 0..N-1 (PicoDet / YOLOv8 heads)
    stays float, and the report says why."""
    n = 8
    proj = np.arange(n, dtype=np.float32) * (2.0 if form == "conv_scaled" else 1.0)

    def body(b, xs):
        if form.startswith("conv"):
            sm = b.op("Softmax", [xs[0]], {"axis": 1}, "sm")                  # [1, n, 4, 5]
            return b.op("Conv", [sm, b.weight("proj", proj.reshape(1, n, 1, 1)), b.none()],
                        {"kernel_shape": [1, 1]}, "box")
        sm = b.op("Softmax", [xs[0]], {"axis": -1}, "sm")                     # [1, 4, 5, n]
        r = b.op("Reshape", [sm], {"shape": [20, n]}, "r")
        if form == "split":                                                    # per box side, as PicoDet
            parts = b.op("Split", [r], {"axis": 0, "split_size": [5, 5, 5, 5]}, ["r0", "r1", "r2", "r3"])
            return [b.op("MatMul", [p, b.weight(f"proj{i}", proj.reshape(n, 1)), b.none()], {}, f"side{i}")
                    for i, p in enumerate(parts)]
        if form == "matmul":
            return b.op("MatMul", [r, b.weight("proj", proj.reshape(n, 1)), b.none()], {}, "box")
        if form == "matmul_t":
            return b.op("MatMul", [r, b.weight("proj", proj.reshape(1, n)), b.none()],
                        {"right_transpose": True}, "box")
        return b.op("Mul", [r, b.weight("proj", proj)], {}, "box")

    shape = (1, n, 4, 5) if form.startswith("conv") else (1, 4, 5, n)
    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, 0)
    tm, report, _, _ = run_exact(model, inputs, table_for(model, inputs, 0))
    why = {d.name: d.reason for d in report.fallbacks}
    assert "DFL box expectation" in why["sm"] and "0..7" in why["sm"] and "by design" in why["sm"]
    assert "sm" in str(report) and why["sm"] in str(report)


def test_softmax_feeding_other_constants_runs_in_int8():
    """A classifier's softmax followed by a learned MatMul is not box decode: INT8."""
    rng = np.random.default_rng(5)

    def body(b, xs):
        sm = b.op("Softmax", [xs[0]], {"axis": -1}, "sm")
        return b.op("MatMul", [sm, b.weight("w", W(rng, 8, 3)), b.none()], {}, "fc")

    model = make_model({"x": (2, 8)}, body)
    inputs = feeds({"x": (2, 8)}, 5)
    tm, report, _, seen = run_exact(model, inputs, table_for(model, inputs, 5))
    assert not report.fallbacks and seen["tpu.Softmax"] == 1 and seen["tpu.MatMul"] == 1


def test_log_softmax_stays_float_with_its_reason():
    model = make_model({"x": (2, 5)}, lambda b, xs: b.op("Softmax", [xs[0]], {"axis": -1, "log": True}, "y"))
    inputs = feeds({"x": (2, 5)}, 1)
    _, report, _, _ = run_exact(model, inputs, table_for(model, inputs, 1))
    assert [d.name for d in report.fallbacks] == ["y"] and "log-softmax" in report.fallbacks[0].reason


# ---------------------------------------------------------------- through the backend

def test_deploy_runs_all_three_in_int8_and_the_simulator_is_bit_equal():
    """Conv -> Scale -> Deconv -> pool -> MatMul -> Softmax deployed in pure INT8: every op INT8,
    layer groups and codegen included, the simulator equal to TPU inference bit for bit."""
    from tftpu.pipelines.deploy import deploy

    rng = np.random.default_rng(11)

    def body(b, xs):
        c = b.op("Conv", [xs[0], b.weight("w", W(rng, 6, 3, 3, 3)), b.weight("cb", W(rng, 6))],
                 {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "c")
        s = b.op("Scale", [c, b.weight("sw", W(rng, 6, scale=1.0)), b.weight("sb", W(rng, 6))], {"do_relu": True},
                 "scaled")
        d = b.op("Deconv", [s, b.weight("wd", W(rng, 6, 4, 2, 2)), b.weight("bd", W(rng, 4))],
                 {"kernel_shape": [2, 2], "strides": [2, 2]}, "d")
        g = b.op("Flatten", [b.op("GlobalAvgPool", [d], {}, "g")], {}, "f")
        o = b.op("MatMul", [g, b.weight("wf", W(rng, 4, 5, scale=2.0)), b.none()], {}, "o")
        return b.op("Softmax", [o], {"axis": -1}, "prob")

    model = make_model({"x": (1, 3, 12, 12)}, body)
    samples = [feeds({"x": (1, 3, 12, 12)}, i) for i in range(3)]
    from tftpu import quant
    table = quant.calibrate(model, samples, "minmax")
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 mixed_precision="none")
    assert res.lowering.counts() == {"INT8": len(res.lowering.decisions)}, str(res.lowering)
    assert {"tpu.Scale", "tpu.Deconv", "tpu.Softmax"} <= {op.name for op in res.model.ops}
    assert res.simulator["passed"] and all(r["bit_exact"] for r in res.simulator["outputs"])
    assert res.outputs[0].cosine > 0.99

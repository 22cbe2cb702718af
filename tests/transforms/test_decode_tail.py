"""The decode tail: which ops a model's INT8 lowering keeps in float by design, and what it buys."""

from __future__ import annotations

import numpy as np
import pytest

from tftpu import quant
from tftpu.interp.similarity import sqnr
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.ir import TopBuilder
from tftpu.transforms.lowering import lower
from tftpu.transforms.lowering.decode_tail import decode_tail


def _conv(b, rng, x, cin, cout, k, name, relu=False):
    w = (rng.normal(size=(cout, cin, k, k)) * (1.5 / np.sqrt(cin * k * k))).astype(np.float32)
    return b.op("Conv", [x, b.weight(f"w_{name}", w), b.weight(f"b_{name}", rng.normal(size=cout).astype(np.float32))],
                {"kernel_shape": [k, k], "pads": [k // 2] * 4, "do_relu": relu}, name)


def yolo_head(seed=0, c=32, bins=8, classes=3, hw=16):
    """A YOLOv8-style model: a backbone, then box logits (4 x `bins` DFL bins) and class logits
    concatenated, split back, a softmax expectation for the boxes, sigmoid scores, box arithmetic,
    and one output concatenating boxes (up to ~hw) and scores (0..1)."""
    rng = np.random.default_rng(seed)
    b = TopBuilder("yolo")
    x = b.input("x", (1, 3, hw, hw))
    f = _conv(b, rng, x, 3, c, 3, "f1", relu=True)
    f = _conv(b, rng, f, c, c, 3, "f2", relu=True)
    f = _conv(b, rng, f, c, c, 3, "f3", relu=True)
    box = _conv(b, rng, f, c, 4 * bins, 1, "box")
    cls = b.op("Add", [_conv(b, rng, f, c, classes, 1, "cls"), b.weight("prior", np.array(-6.0, np.float32))], {},
               "cls_prior")
    cat = b.op("Concat", [box, cls], {"axis": 1}, "cat")
    flat = b.op("Reshape", [cat], {"shape": [1, 4 * bins + classes, hw * hw]}, "flat")
    dist, logits = b.op("Split", [flat], {"axis": 1, "split_size": [4 * bins, classes]}, ["dist", "logits"])
    dist = b.op("Permute", [b.op("Reshape", [dist], {"shape": [1, 4, bins, hw * hw]}, "dist4")],
                {"order": [0, 2, 1, 3]}, "dist_t")
    prob = b.op("Softmax", [dist], {"axis": 1}, "dist_prob")
    proj = np.arange(bins, dtype=np.float32).reshape(1, bins, 1, 1)
    ltrb = b.op("Conv", [prob, b.weight("proj", proj), b.none()], {"kernel_shape": [1, 1]}, "expect")
    ltrb = b.op("Reshape", [ltrb], {"shape": [1, 4, hw * hw]}, "ltrb")
    boxes = b.op("Mul", [ltrb, b.weight("stride", np.array(2.0, np.float32))], {}, "boxes")
    scores = b.op("Sigmoid", [logits], {}, "scores")
    return b.finish([b.op("Concat", [boxes, scores], {"axis": 1}, "output")])


def classifier(seed=0):
    rng = np.random.default_rng(seed)
    b = TopBuilder("cls")
    x = b.input("x", (1, 3, 8, 8))
    f = b.op("GlobalAvgPool", [_conv(b, rng, x, 3, 16, 3, "f", relu=True)], {}, "gap")
    fc = b.op("MatMul", [b.op("Reshape", [f], {"shape": [1, 16]}, "flat"),
                         b.weight("wfc", rng.normal(size=(16, 10)).astype(np.float32)), b.none()], {}, "fc")
    return b.finish([b.op("Softmax", [fc], {"axis": 1}, "prob")])


def regressor(seed=0, c=24, hw=8):
    """A landmark regressor's end: feature convs, a global average pool, two matmul heads; the
    coordinates are small differences of large pooled features (channel pairs 2% apart)."""
    rng = np.random.default_rng(seed)
    b = TopBuilder("reg")
    x = b.input("x", (1, 3, hw, hw))
    f0 = _conv(b, rng, x, 3, c, 3, "f0", relu=True)
    w = (rng.normal(size=(c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    bias = rng.uniform(0.5, 1.0, size=c).astype(np.float32)
    w[c // 2:], bias[c // 2:] = w[:c // 2] * 1.02, bias[:c // 2] * 1.02
    f = b.op("Conv", [f0, b.weight("w_f", w), b.weight("b_f", bias)],
             {"kernel_shape": [3, 3], "pads": [1] * 4, "do_relu": True}, "f")
    flat = b.op("Reshape", [b.op("GlobalAvgPool", [f], {}, "gap")], {"shape": [1, c]}, "flat")
    pairs = np.zeros((c, c // 2), np.float32)
    pairs[np.arange(c // 2), np.arange(c // 2)], pairs[np.arange(c // 2) + c // 2, np.arange(c // 2)] = 10.0, -10.0
    coords = b.op("MatMul", [flat, b.weight("wc", pairs), b.none()], {}, "coords")
    flag = b.op("MatMul", [flat, b.weight("wf", rng.normal(size=(c, 1)).astype(np.float32)), b.none()], {}, "flag")
    return b.finish([coords, b.op("Sigmoid", [flag], {}, "score")])


def _samples(model, n, seed=1):
    rng = np.random.default_rng(seed)
    shape = model.func.function_type.inputs.data[0].get_shape()
    return [{"x": rng.uniform(-1, 1, size=shape).astype(np.float32)} for _ in range(n)]


def test_the_tail_of_a_yolo_head_is_found():
    model = yolo_head()
    tail = decode_tail(model)
    assert set(tail) == {"cls_prior", "cat", "flat", "dist", "dist4", "dist_t", "dist_prob", "expect", "ltrb", "boxes",
                         "scores", "output"}, sorted(tail)


def test_no_tail_where_nothing_is_decoded():
    assert decode_tail(classifier()) == {}                    # a classifier's softmax stays INT8
    rng = np.random.default_rng(0)
    b = TopBuilder("heads")                                   # reshapes of head convs only
    x = b.input("x", (1, 3, 8, 8))
    f = _conv(b, rng, x, 3, 8, 3, "f", relu=True)
    model = b.finish([b.op("Reshape", [_conv(b, rng, f, 8, 4, 1, "h")], {"shape": [1, 4, 64]}, "out")])
    assert decode_tail(model) == {}
    b = TopBuilder("res")                                     # an output computed from a non-feature op
    x = b.input("x", (1, 3, 8, 8))
    f = _conv(b, rng, x, 3, 3, 3, "f")
    model = b.finish([b.op("Sigmoid", [b.op("Add", [f, x], {}, "res")], {}, "out")])
    assert decode_tail(model) == {}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_float_tail_keeps_the_scores_of_a_yolo_head(seed):
    """All INT8, the class logits share one 8-bit grid with the box logits and low scores are
    lost; with the tail in float the head convs write 16-bit logits into it."""
    model = yolo_head(seed)
    samples = _samples(model, 6, seed)
    table = quant.calibrate(model, samples, "mse", asymmetric=True)
    ref = TopInterpreter(model).run(samples[0], dump_all=True)
    got = {}
    for float_tail in (False, True):
        tm, report = lower(model, "npu1", "INT8", table, asymmetric="auto", float_tail=float_tail)
        tm.verify()
        run = TpuInterpreter(tm).run(samples[0], dump_all=True, dequantize=True)
        got[float_tail] = sqnr(ref["scores"], np.asarray(run["scores"], np.float32).reshape(ref["scores"].shape))
        modes = {d.name: d.mode for d in report.decisions}
        assert (modes["scores"] != "INT8") == float_tail and modes["box"] == modes["cls"] == "INT8"
        if float_tail:
            assert all("decode tail" in d.reason for d in report.decisions if d.mode != "INT8")
            assert report.flop_shares()["INT8"] > 0.95
    assert got[True] > got[False] + 2.0, got


def test_a_quantize_table_pins_tail_ops_back_to_int8():
    model = yolo_head()
    table = quant.calibrate(model, _samples(model, 4), "mse")
    _, report = lower(model, "npu1", "INT8", table, qtable={"scores": "INT8"})
    modes = {d.name: (d.mode, d.reason) for d in report.decisions}
    assert modes["scores"] == ("INT8", "") and modes["dist_prob"][0] == "F16"


def test_deploy_keeps_the_tail_out_of_weight_rounding_and_bias_correction():
    """The tail runs in float, so its expectation conv keeps its exact 0..N-1 projection: the
    INT8 weight corrections are fitted to the ops that run in INT8 only."""
    from tftpu.pipelines.deploy import _float_ops

    model = yolo_head()
    tail = decode_tail(model)
    assert _float_ops(model, None) == set(tail)
    assert _float_ops(model, {"scores": "INT8", "f1": "F16"}) == set(tail) - {"scores"} | {"f1"}


def test_a_pooled_head_runs_in_float_and_a_classifier_does_not():
    """The pool averages its input's rounding away, an 8-bit grid on its output puts it back and
    the matmul amplifies it: the pool, its moves and the matmuls reading it are the tail."""
    assert set(decode_tail(regressor())) == {"gap", "flat", "coords", "flag", "score"}
    assert decode_tail(classifier()) == {}                    # (its softmax: argmax is what counts)
    b = TopBuilder("shared")                                  # the pool read by a conv as well: not a head
    rng = np.random.default_rng(0)
    x = b.input("x", (1, 3, 8, 8))
    f = _conv(b, rng, x, 3, 8, 3, "f", relu=True)
    gap = b.op("GlobalAvgPool", [f], {}, "gap")
    fc = b.op("MatMul", [b.op("Reshape", [gap], {"shape": [1, 8]}, "flat"),
                         b.weight("w", rng.normal(size=(8, 4)).astype(np.float32)), b.none()], {}, "fc")
    model = b.finish([fc, _conv(b, rng, gap, 8, 8, 1, "se")])
    assert decode_tail(model) == {}


@pytest.mark.parametrize("seed", [0, 1])
def test_the_float_head_gains_over_int8(seed):
    model = regressor(seed)
    samples = _samples(model, 6, seed)
    table = quant.calibrate(model, samples, "mse", asymmetric=True)
    ref = TopInterpreter(model).run(samples[0])
    got = {}
    for float_tail in (False, True):
        tm, report = lower(model, "npu1", "INT8", table, asymmetric="auto", float_tail=float_tail)
        tm.verify()
        run = TpuInterpreter(tm).run(samples[0], dequantize=True)
        got[float_tail] = sqnr(ref["coords"], np.asarray(run["coords"], np.float32).reshape(ref["coords"].shape))
        assert {d.name for d in report.decisions if d.mode != "INT8"} == (
            {"gap", "flat", "coords", "flag", "score"} if float_tail else set())
    assert got[True] > got[False] + 3.0, got

"""The TOP space-to-depth pass: the rewritten module equals the original (float round-off) over
kernels, strides, pads, odd and even sizes, both layouts, bias and ReLU; it declines with a
reason where it does not apply, and on a chip only where the matrix unit gains."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.ir import TopBuilder
from tftpu.transforms.pipeline import run_pipeline


def stem_model(size, k, stride, pads, cin=3, cout=8, nhwc=False, bias=True, relu=True, permute=False, seed=0):
    rng = np.random.default_rng(seed)
    b = TopBuilder("stem")
    if permute:       # a Keras import: NHWC image, then a transpose to NCHW
        x = b.op("Permute", [b.input("image", (1, size[0], size[1], cin))], {"order": [0, 3, 1, 2]}, "to_nchw")
    else:
        x = b.input("image", (1, size[0], size[1], cin) if nhwc else (1, cin, size[0], size[1]))
    w = b.weight("w", rng.normal(size=(cout, cin, k, k)).astype(np.float32))
    bv = b.weight("b", rng.normal(size=(cout,)).astype(np.float32)) if bias else b.none()
    c = b.op("Conv", [x, w, bv], {"kernel_shape": [k, k], "strides": [stride, stride], "pads": pads,
                                  "do_relu": relu, "layout": "NHWC" if nhwc else "NCHW"}, "stem")
    out = b.op("Relu", [c], {}, "after")
    return b.finish([out])


def _inputs(model, seed):
    shape = model.func.function_type.inputs.data[0].get_shape()
    return {"image": np.random.default_rng(seed).normal(size=shape).astype(np.float32)}


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(8, 19), st.integers(8, 19), st.integers(1, 7), st.sampled_from([2, 4]),
       st.lists(st.integers(0, 3), min_size=4, max_size=4), st.booleans(), st.booleans(), st.booleans())
def test_rewrite_is_exact(h, w, k, stride, pads, nhwc, bias, permute):
    nhwc = nhwc and not permute
    model = stem_model((h, w), k, stride, pads, nhwc=nhwc, bias=bias, permute=permute)
    x = _inputs(model, h * w)
    want = TopInterpreter(model).run(x)["after"]
    result, = run_pipeline(model, "space-to-depth")
    assert result.changed, str(result)
    ops = [op.name for op in model.ops]
    assert "top.SpaceToDepth" in ops and ops.count("top.Conv") == 1
    conv = [op for op in model.ops if op.name == "top.Conv"][0]
    assert conv.attrs()["strides"] == [stride // 2] * 2 and conv.loc == "stem"
    got = TopInterpreter(model).run(x)["after"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max() + 1))


def test_declines_with_reasons():
    m = stem_model((16, 16), 3, 1, [1, 1, 1, 1])
    result, = run_pipeline(m, "space-to-depth")
    assert not result.changed and "not a multiple of block" in str(result.declined[0])
    rng = np.random.default_rng(0)
    b = TopBuilder("deep")
    x = b.input("x", (1, 3, 8, 8))
    r = b.op("Relu", [x], {}, "r")
    c = b.op("Conv", [r, b.weight("w", rng.normal(size=(4, 3, 3, 3)).astype(np.float32)), b.none()],
             {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "c")
    m2 = b.finish([c])
    result, = run_pipeline(m2, "space-to-depth")
    assert "does not read a model input" in str(result.declined[0])


@pytest.mark.parametrize("chip,cin,applied", [("npu1", 3, True), ("npu1", 64, False), ("cpu", 3, False)])
def test_chip_decides(chip, cin, applied):
    m = stem_model((32, 32), 7, 2, [3, 3, 3, 3], cin=cin, cout=64)
    result, = run_pipeline(m, f"space-to-depth{{chip={chip}}}")
    assert bool(result.changed) == applied, str(result)


@pytest.mark.parametrize("pads", [[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 2, 2]])
def test_padded_stem_of_a_tflite_import(pads):
    """A TFLite stem (NHWC image, an explicit zero PAD, the transpose to NCHW, a VALID strided conv):
    canonicalization folds the pad into the conv, then space-to-depth applies, exact."""
    rng = np.random.default_rng(1)
    b = TopBuilder("tflite_stem")
    x = b.input("image", (1, 15, 16, 3))
    p = b.op("Pad", [x], {"paddings": [0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0]}, "pad")
    t = b.op("Permute", [p], {"order": [0, 3, 1, 2]}, "to_nchw")
    c = b.op("Conv", [t, b.weight("w", rng.normal(size=(16, 3, 3, 3)).astype(np.float32)), b.none()],
             {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 0, 0]}, "stem")
    model = b.finish([b.op("Relu", [c], {}, "after")])
    x = _inputs(model, 3)
    want = TopInterpreter(model).run(x)["after"]
    canon, s2d = run_pipeline(model, "canonicalize,space-to-depth{chip=npu1}")
    assert s2d.changed, str(s2d)
    assert "top.Pad" not in [op.name for op in model.ops if op.loc == "pad"]
    got = TopInterpreter(model).run(x)["after"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max() + 1))

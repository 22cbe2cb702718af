"""Every single-op ONNX case of the importer's sweep (tests/frontend/test_onnx_ops.py), converted
to NHWC and to NCHW: TOP inference must still match onnxruntime, outputs keep their names."""

from __future__ import annotations

import numpy as np
import pytest

from tests.frontend.onnx_graphs import rand, run_ort
from tests.frontend.test_onnx_ops import CASES, single
from tests.layout.helpers import permutes
from tftpu.frontend.onnx_to_top import onnx_to_top
from tftpu.interp.top_interpreter import run
from tftpu.transforms.convert_layout import convert_layout


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("target", ["NHWC", "NCHW"])
def test_single_op_converted_matches_onnxruntime(case, target):
    _, op_type, inputs, consts, attrs = case
    attrs = dict(attrs)
    n_out = attrs.pop("_n", 1)
    opset = attrs.pop("_opset", 17)
    model = single(op_type, inputs, consts, attrs, n_out, opset)
    feeds = {n: rand(*s, seed=k + 1) for k, (n, s) in enumerate(inputs.items())}
    want = run_ort(model, feeds)
    top = onnx_to_top(model, "m")
    report = convert_layout(top, layout=target)
    got = run(top, feeds)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].shape == want[k].shape, k
        scale = max(float(np.abs(want[k]).max()), 1e-6)
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=2e-5 * scale, err_msg=k)
    if target == "NCHW":   # ONNX is NCHW already: nothing to add (a real Transpose stays itself)
        assert len(permutes(top)) == report.permutes_before
    else:                  # at most one transpose per model input and output
        assert report.inside == 0 and len(permutes(top)) <= len(inputs) + n_out

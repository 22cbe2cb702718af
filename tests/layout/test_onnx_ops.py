"""Every single-op ONNX case of the importer's sweep (tests/frontend/test_onnx_ops.py), converted
to NHWC and to NCHW: TOP inference must still match onnxruntime, outputs keep their names."""

from __future__ import annotations

import pytest

from tests.frontend.test_onnx_ops import CASES, assert_matches, case_model
from tests.layout.helpers import permutes
from tftpu.frontend.onnx_to_top import onnx_to_top
from tftpu.interp.top_interpreter import run
from tftpu.transforms.convert_layout import convert_layout


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("target", ["NHWC", "NCHW"])
def test_single_op_converted_matches_onnxruntime(case, target):
    model, feeds, want, n_out = case_model(case)
    top = onnx_to_top(model, "m")
    report = convert_layout(top, layout=target)
    assert_matches(run(top, feeds), want)
    if target == "NCHW":   # ONNX is NCHW already: nothing to add (a real Transpose stays itself)
        assert len(permutes(top)) == report.permutes_before
    else:                  # at most one transpose per model input and output
        assert len(permutes(top)) <= len(feeds) + n_out
        # LRN imports as element-wise ops around a 1x1 conv: transposing around the conv moves
        # exactly the bytes that transposing at the model's edges would (a tie either way)
        assert report.inside == 0 or case[1] == "LRN"

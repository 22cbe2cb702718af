"""ConvertLayout on real models: keras.applications (via tf2onnx), mediapipe TFLite models and
MTCNN R-Net/O-Net with their real weights.

Numerics are unchanged (TOP interpreter, cosine >= 0.99999 on every output) and the Permute
count after conversion to NHWC and to NCHW meets the goal: none inside the graph, at most one
per model input and output (BlazeFace's NCHW heads are the one measured exception: each head
flattens H,W,C in NHWC order, one transpose per head)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.layout.helpers import clone, cosine, inputs_for, permutes
from tftpu.interp.top_interpreter import run
from tftpu.transforms.convert_layout import convert_layout

KERAS = {"ResNet50": (32, 32), "MobileNetV2": (64, 64), "EfficientNetB0": (64, 64),
         "MobileNetV3Small": (64, 64),   # tf2onnx's optimizer leaves ~100 transposes in this one
         "ConvNeXtTiny": (64, 64)}       # LayerNorm over channels, Dense layers on NHWC data
TFLITE = ["selfie_segmentation.tflite", "face_detection_short_range.tflite"]
MTCNN = ["mtcnn_rnet", "mtcnn_onet"]   # real weights; Keras Permute + Flatten + Dense: tf2onnx's stuck case

# (permutes after NHWC, after NCHW) measured; the NCHW one is at the input for all but BlazeFace
EXPECTED = {"ResNet50": (0, 1), "MobileNetV2": (0, 1), "EfficientNetB0": (0, 1), "MobileNetV3Small": (0, 1),
            "ConvNeXtTiny": (0, 1), "selfie_segmentation.tflite": (0, 1), "face_detection_short_range.tflite": (0, 5),
            "mtcnn_rnet": (0, 1), "mtcnn_onet": (0, 1)}


@functools.lru_cache(maxsize=None)
def _top(name: str):
    from tftpu.frontend.onnx_to_top import onnx_to_top
    from tftpu.frontend.tf_export import keras_to_onnx, tflite_to_onnx
    from tftpu.transforms.canonicalize import canonicalize
    if name in KERAS:
        import keras
        keras.utils.set_random_seed(0)
        model = getattr(keras.applications, name)(weights=None, input_shape=(*KERAS[name], 3))
        proto = keras_to_onnx(model)
    elif name in MTCNN:
        from tests.models import mtcnn
        proto = keras_to_onnx(getattr(mtcnn, name[6:])())
    else:
        from tests import material
        proto = tflite_to_onnx(material.get(name))
    transposes = sum(n.op_type == "Transpose" for n in proto.graph.node)
    top_model = onnx_to_top(proto, name.split(".")[0])
    canonicalize(top_model)
    return top_model, transposes


@pytest.mark.slow
@pytest.mark.parametrize("name", [*KERAS, *TFLITE, *MTCNN])
def test_real_model(name):
    model, transposes = _top(name)
    feeds = inputs_for(model, seed=1)
    ref = run(model, feeds)
    n_io = len(model.input_names) + len(model.output_names)
    for target, expected in zip(("NHWC", "NCHW"), EXPECTED[name]):
        new = clone(model)
        report = convert_layout(new, layout=target)
        got = run(new, feeds)
        assert list(got) == list(ref)
        for k in ref:
            assert cosine(got[k], ref[k]) >= 0.99999, (name, target, k)
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-3, atol=1e-4)
        n = len(permutes(new))
        assert n == report.permutes_after == expected, (name, target, str(report))
        if name != "face_detection_short_range.tflite":
            assert report.inside == 0 and n <= n_io
        if name == "face_detection_short_range.tflite" and target == "NCHW":
            # each head's reshape merges H, W, C in NHWC order: the pass says where and why
            assert sum("top.Reshape" in note for note in report.notes) == 4
        if name in MTCNN:   # the transpose tf2onnx leaves before Flatten went into the Dense weights
            assert any("weight rows" in note for note in report.notes)
        heavy = sum(v for k, v in report.layouts.items() if k.endswith(target))
        assert heavy == sum(report.layouts.values()) > 0
    assert transposes >= EXPECTED[name][0]
    if name == "MobileNetV3Small":
        assert transposes > 50   # what tf2onnx's own transpose optimizer leaves

"""Real models through every front-end: each TOP tensor matches onnxruntime (cosine >= 0.99999)
and the TOP outputs match the source framework (Keras / TFLite / SavedModel)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests import material
from tftpu import frontend
from tftpu.frontend.check import onnx_tensors, tf_outputs
from tftpu.interp.similarity import compare_arrays, cosine_similarity, noise_floor, sqnr
from tftpu.interp.top_interpreter import run

COS = 0.99999


def check(proto, top, inputs, source=None, min_shared=10):
    """Every tensor TOP and onnxruntime share, then TOP outputs vs `source` outputs (in order)."""
    got = run(top, inputs, dump_all=True)
    ref = onnx_tensors(proto, inputs)
    shared = [k for k in got if k in ref]
    assert len(shared) >= min_shared, f"only {len(shared)} shared tensors"
    floor = noise_floor(ref[k] for k in shared)
    rows = [compare_arrays(k, ref[k], got[k], (COS, -math.inf), floor) for k in shared]
    assert all(r.passed for r in rows), [r for r in rows if not r.passed][:3]
    worst = min((r.cosine, r.name) for r in rows if "rounding noise" not in r.note)
    for name in top.output_names:
        assert name in ref
    if source is not None:
        for name, want in zip(top.output_names, source):
            want = np.asarray(want)
            assert got[name].shape == want.shape, name
            assert cosine_similarity(want, got[name]) >= COS, name
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()) + 1e-6)
    return worst


def photo(size):
    img = material.image("astronaut.png", (size, size)).astype(np.float32)
    return (img / 127.5 - 1.0)[None]


KERAS_APPS = [
    pytest.param("ResNet50", 64, marks=pytest.mark.slow),
    pytest.param("MobileNetV2", 96, marks=pytest.mark.slow),
    pytest.param("EfficientNetB0", 64, marks=pytest.mark.slow),
    pytest.param("MobileNetV3Small", 64, marks=pytest.mark.slow),
    # exact GELU (Erfc), LayerNorm, and grouped 7x7 convs that Keras 3 runs inside XLA functions
    pytest.param("ConvNeXtTiny", 64, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name,size", KERAS_APPS)
def test_keras_applications(name, size):
    import keras
    km = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3))
    proto = frontend.to_onnx(km)
    top = frontend.load(proto, name=name)
    x = photo(size)
    check(proto, top, {"x": x}, [np.asarray(km(x, training=False))], min_shared=50)
    names = {op.op_name for op in top.ops}
    assert "BatchNorm" not in names and "Clip" not in names
    fused = {"EfficientNetB0": {"SiLU"}, "MobileNetV3Small": {"HardSwish"},
             "ConvNeXtTiny": {"GELU", "LayerNorm"}}.get(name, set())
    assert fused <= names, fused - names
    if name == "ConvNeXtTiny":  # every LayerNorm and GELU fused: no Erf or moments left
        assert not names & {"Erf", "ReduceMean", "Sqrt"}


@pytest.mark.parametrize("net,size", [("rnet", 24), ("onet", 48)])
def test_mtcnn_with_real_weights(net, size):
    from tests.models import mtcnn
    km = getattr(mtcnn, net)(weights=True)
    proto = frontend.to_onnx(km, input_shapes=[[4, size, size, 3]])
    top = frontend.load(proto, name=net)
    faces, _ = mtcnn.lfw_inputs(size)
    x = np.concatenate([faces[:2], faces[-2:]]).astype(np.float32)   # 2 faces, 2 non-faces
    outs = km(x, training=False)
    check(proto, top, {"x": x}, [np.asarray(o) for o in outs])
    assert {op.op_name for op in top.ops} >= {"Conv", "PRelu", "MaxPool", "MatMul", "Softmax"}
    assert "Neg" not in {op.op_name for op in top.ops}


@pytest.mark.parametrize("name,size", [("selfie_segmentation.tflite", 256),
                                       ("face_detection_short_range.tflite", 128)])
def test_mediapipe_tflite(name, size):
    path = material.get(name)
    proto = frontend.to_onnx(path)
    top = frontend.load(path)
    x = photo(size)
    src = tf_outputs(path, "tflite", {"x": x}, [o.name for o in proto.graph.output])
    check(proto, top, {"x": x}, [src[n] for n in top.output_names], min_shared=50)
    if name.startswith("selfie"):
        assert "Deconv" in {op.op_name for op in top.ops}   # mediapipe's Convolution2DTransposeBias
    from tftpu import ir
    text = top.text()
    assert ir.TopModel(ir.parse_module(text), top.weights).text() == text



# the other image networks of the material's wheels (`benchmarks/model_zoo.py` compiles them all):
# name -> (input H, W, NCHW?, import input_shapes)
ZOO = {
    "pose_landmark_full.tflite": (256, 256, False, None),
    "hand_landmark_full.tflite": (224, 224, False, None),
    "hand_landmark_lite.tflite": (224, 224, False, None),
    "face_landmark.tflite": (192, 192, False, None),
    "iris_landmark.tflite": (64, 64, False, None),
    "hand_recrop.tflite": (256, 256, False, None),
    "selfie_segmentation_landscape.tflite": (144, 256, False, None),
    "PP-OCRv6_rec_small.onnx": (48, 320, True, [[1, 3, 48, 320]]),
    "ch_PP-OCRv4_rec_infer.onnx": (48, 320, True, [[1, 3, 48, 320]]),
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": (48, 192, True, [[1, 3, 48, 192]]),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_material_wheels_other_networks(name):
    """mediapipe's landmark, re-crop and segmentation networks and PaddleOCR's recognizers and
    direction classifier import, and on a real photo TOP matches onnxruntime tensor for tensor
    and the float source at the outputs."""
    h, w, nchw, shapes = ZOO[name]
    path = material.get(name)
    img = material.image("text.png" if nchw else "astronaut.png", (h, w)).astype(np.float32) / 255.0
    x = (img.transpose(2, 0, 1) * 2 - 1) if nchw else img
    proto = frontend.to_onnx(path, shapes)
    top = frontend.load(path, input_shapes=shapes)
    feeds = {top.input_names[0]: np.ascontiguousarray(x[None], np.float32)}
    if name.endswith(".onnx"):
        ref = onnx_tensors(proto, feeds, all_tensors=False)
    else:
        ref = tf_outputs(path, "tflite", feeds, [o.name for o in proto.graph.output])
    check(proto, top, feeds, min_shared=30)
    got = run(top, feeds)
    for n in top.output_names:       # deep float nets: logits in the hundreds differ in their last bits
        assert got[n].shape == ref[n].shape and sqnr(ref[n], got[n]) >= 60.0, n

def detector_input(name):
    """A real photo as each detector's own preprocessing makes it: the document models read
    BGR NCHW (layout: (x-127.5)/127.5 on `page.png`; text: ImageNet mean/std on `text.png`),
    mediapipe's palm detectors NHWC in 0..1 and its face and pose detectors NHWC in -1..1
    (`astronaut.png`)."""
    if name == "layout_cdla.onnx":
        img = material.image("page.png", (800, 608))[..., ::-1].astype(np.float32)
        return ((img / 127.5 - 1.0).transpose(2, 0, 1)[None]).astype(np.float32), None
    if name in ("PP-OCRv6_det_small.onnx", "ch_PP-OCRv4_det_infer.onnx"):
        img = material.image("text.png", (640, 640))[..., ::-1].astype(np.float32) / 255.0
        img = (img - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
        return img.transpose(2, 0, 1)[None].astype(np.float32), [[1, 3, 640, 640]]
    if name in ("palm_detection_lite.tflite", "palm_detection_full.tflite"):
        return (material.image("astronaut.png", (192, 192)).astype(np.float32) / 255.0)[None], None
    if name == "pose_detection.tflite":
        return photo(224), None
    if name == "face_detection_short_range.tflite":          # BlazeFace short range: NHWC -1..1
        return photo(128), None
    if name == "common_det.onnx":                             # ddddocr's YOLOX: BGR NCHW 0..255
        img = material.image("text.png", (416, 416))[..., ::-1].astype(np.float32)
        return img.transpose(2, 0, 1)[None].copy(), None
    if name == "320n.onnx":                                   # NudeNet's YOLOv8n: RGB NCHW 0..1
        img = material.image("astronaut.png", (320, 320)).astype(np.float32) / 255.0
        return img.transpose(2, 0, 1)[None].astype(np.float32), [[1, 3, 320, 320]]
    return photo(192), None


DETECTORS = [
    pytest.param("layout_cdla.onnx", 8, marks=pytest.mark.slow),
    pytest.param("PP-OCRv6_det_small.onnx", 1, marks=pytest.mark.slow),
    pytest.param("palm_detection_lite.tflite", 2),
    pytest.param("face_detection_full_range_sparse.tflite", 2, marks=pytest.mark.slow),  # densified on import
    pytest.param("pose_detection.tflite", 2),
    pytest.param("palm_detection_full.tflite", 2),
    pytest.param("320n.onnx", 1),
    pytest.param("ch_PP-OCRv4_det_infer.onnx", 1, marks=pytest.mark.slow),
    pytest.param("common_det.onnx", 1),
    pytest.param("face_detection_short_range.tflite", 2),
]


@pytest.mark.parametrize("name,outputs", DETECTORS)
def test_real_detectors(name, outputs):
    """The issue-22 detectors import to TOP, and on a real photo every tensor TOP shares with
    onnxruntime matches it and the outputs match the float source (onnxruntime / TFLite)."""
    from tftpu.frontend.check import onnx_tensors
    path = material.get(name)
    x, shapes = detector_input(name)
    proto = frontend.to_onnx(path)
    top = frontend.load(path, input_shapes=shapes)
    assert len(top.output_names) == outputs
    feeds = {top.input_names[0]: x}
    if name.endswith(".onnx"):
        ref = onnx_tensors(proto, feeds, all_tensors=False)
        src = [ref[n] for n in top.output_names]
    else:
        ref = tf_outputs(path, "tflite", feeds, [o.name for o in proto.graph.output])
        src = [ref[n] for n in top.output_names]
    check(proto, top, feeds, src, min_shared=50)
    assert all(np.count_nonzero(s) for s in src) and max(np.abs(s).max() for s in src) > 0.3   # a real run


def test_a_yolo_detectors_scores_survive_pure_int8():
    """NudeNet's YOLOv8n (one output: decoded boxes up to ~316 beside 18 sigmoid scores): with
    its decode tail in float by design, pure INT8 keeps every part of the output, where one
    8-bit grid shared by the box and class logits left the scores at 6.5 dB."""
    import tftpu
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.frontend.check import onnx_tensors
    path = material.get("320n.onnx")
    x, shapes = detector_input("320n.onnx")
    from tftpu import datasets                                # benchmarks/detectors.py's photos
    imgs = [material.image(n, (320, 320)) for n in datasets.PHOTOS if n != "astronaut.png"]
    calib = [{"images": (im.astype(np.float32) / 255.0).transpose(2, 0, 1)[None].copy()}
             for im in imgs + [im[:, ::-1] for im in imgs]]
    compiled = tftpu.compile(str(path), chip="npu1", calibration_data=calib, test_input={"images": x},
                             input_shapes=shapes, mixed_precision="none")
    tail = [d for d in compiled.deployed.lowering.decisions if d.mode != "INT8"]
    assert tail and all("decode tail" in d.reason or d.reason.startswith("input grid") for d in tail)
    assert compiled.deployed.lowering.flop_shares()["INT8"] > 0.99
    got = TpuInterpreter(compiled.deployed.model).run({"images": x})["output0"]
    want = onnx_tensors(frontend.to_onnx(path, shapes), {"images": x}, all_tensors=False)["output0"]
    from tftpu.interp.similarity import sqnr
    assert sqnr(want[:, :4], got[:, :4]) > 25 and sqnr(want[:, 4:], got[:, 4:]) > 15

def small_keras():
    import keras
    from keras import layers as L
    inp = keras.Input((16, 16, 3), name="image")
    x = L.Conv2D(8, 3, strides=2, padding="same")(inp)
    x = L.BatchNormalization()(x)
    x = L.ReLU(6.0)(x)
    x = L.DepthwiseConv2D(3, padding="same")(x)
    x = L.UpSampling2D(2, interpolation="bilinear")(x)
    x = L.GlobalAveragePooling2D()(x)
    out = L.Dense(5, activation="softmax")(x)
    model = keras.Model(inp, out)
    rng = np.random.default_rng(0)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.3 + (1.0 if "variance" in w.path else 0)
                       for w in model.weights])
    return model


def rendered_text(text: str, width: int = 96) -> np.ndarray:
    """`text` drawn black on white, 64 px high (Pillow's own font), as ddddocr feeds its
    recognizer: grey NCHW, (x / 255 - 0.5) / 0.5."""
    from PIL import Image, ImageDraw, ImageFont
    img = Image.new("L", (width, 64), 255)
    ImageDraw.Draw(img).text((4, 12), text, fill=0, font=ImageFont.load_default(size=24))
    return ((np.asarray(img, np.float32) / 255.0 - 0.5) / 0.5)[None, None]


def test_a_crnn_recognizers_bidirectional_lstm_imports():
    """ddddocr's recognizer (convs, then a bidirectional LSTM unrolled on import over its 12
    steps, then a Gemm to 8210 classes): every tensor TOP shares with onnxruntime matches it.
    Its graph output declares a stale shape ([1, seqlen]: it is [seqlen, 1, 8210]), which
    import infers again instead of stopping at it."""
    path = material.get("common.onnx")
    top = frontend.load(path, input_shapes=[[1, 1, 64, 96]])
    feeds = {"input1": rendered_text("abc123")}
    check(frontend.to_onnx(path), top, feeds, min_shared=20)
    got = run(top, feeds)[top.output_names[0]]
    assert got.shape == (12, 1, 8210) and np.count_nonzero(got.argmax(-1)) >= 6    # it reads characters


@pytest.mark.slow
def test_a_crnn_recognizer_reads_the_same_in_int8():
    """The unrolled LSTM quantizes with the ops' own INT8 lowerings (MatMul, Sigmoid / Tanh
    tables, Mul, Add): pure INT8 reads each rendered string as float does, and the simulator
    runs the program bit-exactly."""
    import tftpu
    from tftpu.interp.tpu import TpuInterpreter
    calib = [rendered_text(t) for t in ("q7Wm2", "x9pLa", "Z3k8r", "mn4Tb", "P2vQe", "h6Jy1")]
    compiled = tftpu.compile(str(material.get("common.onnx")), chip="npu1", calibration_data=calib,
                             test_input=rendered_text("abc123"), input_shapes=[[1, 1, 64, 96]],
                             mixed_precision="none")
    assert compiled.deployed.lowering.flop_shares()["INT8"] > 0.99
    assert all(r["bit_exact"] for r in compiled.deployed.simulator["outputs"])
    name = compiled.top_model.output_names[0]

    def reading(scores) -> list[int]:
        """CTC's greedy reading: the best class per step, repeats merged, blanks (0) dropped."""
        best = np.asarray(scores).argmax(-1).ravel()
        return [int(c) for k, c in enumerate(best) if c != 0 and (k == 0 or c != best[k - 1])]

    for text in ("abc123", "HELLO", "7x4k2"):
        feeds = {"input1": rendered_text(text)}
        want = reading(run(compiled.top_model, feeds)[name])
        got = reading(TpuInterpreter(compiled.deployed.model).run(feeds)[name])
        assert len(want) >= 4 and got == want, text


def test_keras_file_savedmodel_and_tf_function(tmp_path):
    import tensorflow as tf
    km = small_keras()
    x = np.random.default_rng(1).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
    want = np.asarray(km(x, training=False))

    km.save(tmp_path / "m.keras")
    top = frontend.load(tmp_path / "m.keras", input_shapes=[[2, 16, 16, 3]])
    assert top.input_names == ["image"]
    np.testing.assert_allclose(run(top, {"x": x})[top.output_names[0]], want, rtol=1e-5, atol=1e-6)
    src = tf_outputs(tmp_path / "m.keras", "keras", {"image": x}, top.output_names)
    np.testing.assert_allclose(src[top.output_names[0]], want, rtol=1e-6, atol=1e-7)

    export = tmp_path / "saved"
    km.export(str(export), verbose=False)
    top = frontend.load(export, input_shapes=[[2, 16, 16, 3]])
    np.testing.assert_allclose(run(top, {"x": x})[top.output_names[0]], want, rtol=1e-5, atol=1e-6)
    src = tf_outputs(export, "saved_model", {"x": x}, top.output_names)
    np.testing.assert_allclose(src[top.output_names[0]], want, rtol=1e-5, atol=1e-6)

    sig = [tf.TensorSpec([2, 16, 16, 3], tf.float32, name="image")]
    fn = tf.function(lambda t: km(t, training=False) * 2.0, input_signature=sig)
    top = frontend.load(fn)
    np.testing.assert_allclose(run(top, {"x": x})[top.output_names[0]], want * 2, rtol=1e-5, atol=1e-6)


def test_bad_tflite_and_savedmodel(tmp_path):
    from tftpu import errors
    p = tmp_path / "x.tflite"
    p.write_bytes(b"\0" * 64)
    with pytest.raises(errors.ModelFileError, match="TFL3"):
        frontend.load(p)
    d = tmp_path / "dir"
    d.mkdir()
    with pytest.raises(errors.ModelFileError, match="not a SavedModel"):
        frontend.load(d)


def test_tflite_import_is_byte_identical_across_exports():
    """tf2onnx numbers the tensors it makes with process-wide counters; the TOP output must not care."""
    from tftpu.ir import npz_bytes
    path = material.get("selfie_segmentation.tflite")
    a, b = frontend.load(path), frontend.load(path)
    assert a.text() == b.text()
    assert npz_bytes(a.used_weights()) == npz_bytes(b.used_weights())


def test_import_is_byte_identical_across_processes():
    """Other hash seeds give tf2onnx's optimizer other orders (it left a no-op Reshape in about a
    third of the runs); tensor names come from what a tensor is, so the TOP files agree."""
    import os
    import subprocess
    import sys
    code = ("import hashlib; from tests import material; from tftpu import frontend; from tftpu.ir import npz_bytes; "
            "m = frontend.load(material.get('selfie_segmentation.tflite')); "
            "print(hashlib.sha256(m.text().encode() + npz_bytes(m.used_weights())).hexdigest())")
    digests = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, TF_CPP_MIN_LOG_LEVEL="3")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        assert out.returncode == 0, out.stderr[-2000:]
        digests.add(out.stdout.split()[-1])
    assert len(digests) == 1


@pytest.mark.parametrize("opset", [13, 15, 17])
def test_keras_opsets(opset):
    km = small_keras()
    x = np.random.default_rng(2).uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)
    proto = frontend.to_onnx(km, opset=opset)
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    top = frontend.load(proto)
    check(proto, top, {"x": x}, [np.asarray(km(x, training=False))], min_shared=5)


def test_opset_out_of_range():
    from tftpu import errors
    with pytest.raises(errors.UsageError, match="opset 12"):
        frontend.to_onnx(small_keras(), opset=12)

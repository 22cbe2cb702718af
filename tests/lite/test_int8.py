"""INT8 through tftpu.lite on mtcnn with real weights (PEERS.md's protocol): tftpu's ranges go
into TF's calibrated model and TF's quantizer writes a normal full-integer `.tflite`."""

import numpy as np
import pytest

from tftpu import lite
from tftpu.lite import runtime
from tftpu.tac import tflite_io


def _convert(cls, km, calib, method=None):
    import tensorflow as tf

    conv = cls.from_keras_model(km)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([x[None]] for x in calib)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    if method:
        conv.calibration_method = method
    return conv.convert(), conv


def _scores(data, images):
    interp = runtime.interpreter(data)
    k = next(i for i, d in enumerate(runtime.output_details(interp)) if d["shape"][-1] == 2)
    return np.array([runtime.run(interp, [x[None]])[k][0, 1] for x in images])


@pytest.mark.parametrize("net, size, method", [("mtcnn_onet", 48, "mse"), ("mtcnn_rnet", 24, "auto")])
def test_int8_beats_tflite(keras_model, net, size, method):
    """Accuracy 1.00 and smaller worst face-score moves than TFLite's own INT8 (O-Net with
    `mse`; R-Net, whose worst cases `mse` does not lower, with `auto`): the five largest of the
    200 moves average less, and O-Net's largest is less. R-Net's single largest move is one
    image, which a shift of the calibration set or an equally good calibration grid moves either
    way (0.014 to 0.030 against TFLite's 0.024 as the set shifts by one to five images); the
    average of its five largest stays under TFLite's on each of those."""
    import tensorflow as tf

    from tests.models import mtcnn

    km = keras_model(net)
    images, labels = mtcnn.lfw_inputs(size)
    images = images.astype(np.float32)
    calib = images[np.concatenate([np.where(labels == 1)[0][:50], np.where(labels == 0)[0][:50]])]
    pf = km.predict(images, verbose=0)[-1][:, 1]
    peer, _ = _convert(tf.lite.TFLiteConverter, km, calib)
    ours, conv = _convert(lite.TFLiteConverter, km, calib, method)
    pt, pq = _scores(peer, images), _scores(ours, images)
    assert np.mean((pq > 0.5) == labels) == 1.0
    moves, peer_moves = np.sort(np.abs(pq - pf)), np.sort(np.abs(pt - pf))
    assert moves[-5:].mean() < peer_moves[-5:].mean()
    if net == "mtcnn_onet":
        assert moves[-1] < peer_moves[-1]
    assert conv.report["int8"]["clipped"] > 0
    if method == "auto":
        chosen = {r["chosen"] for r in conv.report["int8"]["ranges"]}
        assert chosen <= {"mse", "minmax", "percentile"} and "auto_score" in conv.report["int8"]
    model = tflite_io.read(ours)          # a normal full-integer model: int8 activations in and out
    sg = model.subgraphs[0]
    assert all(sg.tensors[i].type == 9 for i in list(sg.inputs) + list(sg.outputs))   # 9: INT8


def test_minmax_is_tflites_own_int8(keras_model):
    """With TFLite's own ranges written back, the hook gives TF's INT8 model byte for byte."""
    import tensorflow as tf

    from tests.models import mtcnn

    km = keras_model("mtcnn_rnet")
    images, labels = mtcnn.lfw_inputs(24)
    calib = images.astype(np.float32)[::20]
    peer, _ = _convert(tf.lite.TFLiteConverter, km, calib)
    ours, conv = _convert(lite.TFLiteConverter, km, calib, "minmax")
    assert conv.report["int8"]["clipped"] == 0
    assert ours == peer

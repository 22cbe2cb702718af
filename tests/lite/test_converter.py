"""tftpu.lite.TFLiteConverter on Keras MobileNetV2 / EfficientNetB0 (random weights) and mtcnn
R-Net / O-Net (real weights): TF's bytes without options, TAC outputs equal to TF's, S2D outputs
within 1e-5 relative of the original (Keras, SavedModel and concrete functions). (ResNet50's 7x7
stem, whose conversion alone took a minute here, is checked exact by tests/passes/test_s2d_stems.py.)"""

import numpy as np
import pytest

from tests.lite.conftest import sample_input
from tftpu import errors, lite, tac
from tftpu.lite import runtime
from tftpu.tac import export, tflite_io
from tftpu.tac.schema import builtin_names

BIG = ["MobileNetV2", "EfficientNetB0"]
MTCNN = ["mtcnn_rnet", "mtcnn_onet"]


def _ops(data):
    model = tflite_io.read(data)
    names = builtin_names()
    codes = model.operatorCodes
    return [names[max(codes[o.opcodeIndex].builtinCode, codes[o.opcodeIndex].deprecatedBuiltinCode)]
            for o in model.subgraphs[0].operators]


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _tac_outputs_equal(data, ref, x):
    meta = export.get_metadata(tflite_io.read(data))
    assert meta and meta["device_specs"] == ["GPU", "CPU"]
    for y, e in zip(runtime.run(data, [x]), runtime.run(ref, [x])):
        np.testing.assert_array_equal(y, e)


@pytest.mark.parametrize("name", MTCNN)
def test_mtcnn_same_bytes_tac_and_s2d_declined(name, keras_model, tf_bytes):
    """Each option through the converter; the device_specs output is TAC on TF's bytes, byte for byte."""
    model, ref = keras_model(name), tf_bytes(name)
    conv = lite.TFLiteConverter.from_keras_model(model)
    assert conv.convert() == ref and conv.report == {"interpreter": runtime.name()}   # no tftpu option: TF bytes
    conv = lite.TFLiteConverter.from_keras_model(model)
    conv.device_specs = ("GPU", "CPU")
    data = conv.convert()
    assert data == tac.run(ref, device_specs=("GPU", "CPU")).tflite()
    assert sum(conv.report["tac"]["ops_per_device"].values()) == len(_ops(data))
    _tac_outputs_equal(data, ref, sample_input(model))
    conv = lite.TFLiteConverter.from_keras_model(model)           # 3x3 stride-1 first conv: declined
    conv.space_to_depth = True
    assert conv.convert() == ref
    assert not conv.report["space_to_depth"]["applies"]
    assert "stride not divisible" in conv.report["space_to_depth"]["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("name", BIG)
def test_keras_apps_same_bytes_tac_and_s2d(name, keras_model, tf_bytes):
    """Three conversions a model: TF's, tftpu's without options (same bytes), S2D + TAC (within 1e-5);
    TAC alone is checked on TF's bytes (the converter's device_specs output is that, as tested above)."""
    model, ref = keras_model(name), tf_bytes(name)
    x = sample_input(model)
    assert lite.TFLiteConverter.from_keras_model(model).convert() == ref
    _tac_outputs_equal(tac.run(ref, device_specs=("GPU", "CPU")).tflite(), ref, x)
    conv = lite.TFLiteConverter.from_keras_model(model)
    conv.space_to_depth = 2
    conv.device_specs = ("GPU", "CPU")
    data = conv.convert()
    assert "SPACE_TO_DEPTH" in _ops(data) and conv.report["space_to_depth"]["applies"]
    assert export.get_metadata(tflite_io.read(data))["device_specs"] == ["GPU", "CPU"]
    for y, e in zip(runtime.run(data, [x]), runtime.run(ref, [x])):
        assert _rel(y, e) < 1e-5


def test_s2d_input_records_host_transform(keras_model, tf_bytes):
    import tftpu.data

    model = keras_model("MobileNetV2")
    x = sample_input(model, 1)
    conv = lite.TFLiteConverter.from_keras_model(model)
    conv.space_to_depth = 2
    conv.s2d_input = True
    data = conv.convert()
    meta = export.get_metadata(tflite_io.read(data), "tftpu.s2d")
    assert meta["block_size"] == 2 and meta["s2d_shape"] == [16, 16, 12] and meta["image_shape"] == [32, 32, 3]
    assert "SPACE_TO_DEPTH" not in _ops(data)
    [y] = runtime.run(data, [np.asarray(tftpu.data.transform(x, 2))])
    [e] = runtime.run(tf_bytes("MobileNetV2"), [x])
    assert _rel(y, e) < 1e-5


def test_cost_model_decides_by_default(keras_model, tf_bytes):
    conv = lite.TFLiteConverter.from_keras_model(keras_model("MobileNetV2"))
    conv.space_to_depth = True
    conv.s2d_target = "cpu"            # the S2D stem is slower on a CPU: declined, with numbers
    assert conv.convert() == tf_bytes("MobileNetV2")
    s2d = conv.report["space_to_depth"]
    assert not s2d["applies"] and s2d["speedup"] < s2d["min_speedup"] and "target cpu" in s2d["reason"]


@pytest.fixture(scope="module")
def stem_function():
    """A concrete function with a 7x7/2 stem (what S2D rewrites) over tf.Variables of a tf.Module
    (a Keras model closed over in a tf.function converts to NaN weights in TF 2.21), and TF's bytes."""
    import tensorflow as tf

    rng = np.random.default_rng(2)
    module = tf.Module()
    module.w1 = tf.Variable(rng.normal(0, 0.2, (7, 7, 3, 8)).astype(np.float32))
    module.w2 = tf.Variable(rng.normal(0, 0.2, (3, 3, 8, 8)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, 32, 32, 3], tf.float32)])
    def stem(x):
        y = tf.nn.relu(tf.nn.conv2d(x, module.w1, 2, "SAME"))
        return tf.reduce_mean(tf.nn.conv2d(y, module.w2, 1, "SAME"), [1, 2])

    fn = stem.get_concrete_function()
    return fn, module, bytes(tf.lite.TFLiteConverter.from_concrete_functions([fn], module).convert())


def test_s2d_from_concrete_functions(stem_function):
    """The graph pass rewrites the function's stem; outputs within 1e-5 of TF's conversion."""
    fn, module, ref = stem_function
    conv = lite.TFLiteConverter.from_concrete_functions([fn], module)
    assert conv.convert() == ref
    conv = lite.TFLiteConverter.from_concrete_functions([fn], module)
    conv.space_to_depth = 2
    conv.device_specs = ("GPU", "CPU")
    data = conv.convert()
    assert conv.report["space_to_depth"]["applies"] and conv.report["space_to_depth"]["functions"]
    assert "SPACE_TO_DEPTH" in _ops(data)
    for seed in range(3):
        x = np.random.default_rng(seed).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)
        [e] = runtime.run(ref, [x])
        assert _rel(e, fn(x).numpy()) < 1e-5              # TF's own conversion is right here
        for y in runtime.run(data, [x]):
            assert _rel(y, e) < 1e-5


def test_attributes_pass_through(keras_model):
    import tensorflow as tf

    conv = lite.TFLiteConverter.from_keras_model(keras_model("mtcnn_rnet"))
    assert isinstance(conv, type(tf.lite.TFLiteConverter.from_keras_model(keras_model("mtcnn_rnet"))))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.target_spec.supported_types = [tf.float16]
    ref = tf.lite.TFLiteConverter.from_keras_model(keras_model("mtcnn_rnet"))
    ref.optimizations = [tf.lite.Optimize.DEFAULT]
    ref.target_spec.supported_types = [tf.float16]
    assert conv.convert() == ref.convert()


def test_bad_options_are_one_line_errors(keras_model):
    conv = lite.TFLiteConverter.from_keras_model(keras_model("mtcnn_rnet"))
    conv.space_to_depth = 1
    with pytest.raises(errors.UsageError, match="space_to_depth=1"):
        conv.convert()
    conv.space_to_depth = None
    conv.calibration_method = "nope"
    with pytest.raises(errors.UsageError, match="calibration_method 'nope'"):
        conv.convert()
    conv.calibration_method = "mse"
    with pytest.raises(errors.UsageError, match="representative_dataset"):
        conv.convert()
    conv.calibration_method = None
    conv.s2d_input = True
    with pytest.raises(errors.UsageError, match="s2d_input"):
        conv.convert()
    conv.s2d_input = False
    conv.device_specs = ("NO_SUCH_DEVICE",)
    with pytest.raises(errors.TftpuError, match="NO_SUCH_DEVICE"):
        conv.convert()


def test_concrete_functions_and_saved_model_same_bytes(tmp_path, keras_model):
    import tensorflow as tf

    model = keras_model("mtcnn_rnet")
    fn = tf.function(lambda x: model(x)).get_concrete_function(tf.TensorSpec([1, 24, 24, 3], tf.float32))
    a = lite.TFLiteConverter.from_concrete_functions([fn], model).convert()
    assert a == tf.lite.TFLiteConverter.from_concrete_functions([fn], model).convert()
    model.export(str(tmp_path / "sm"), verbose=False)
    b = lite.TFLiteConverter.from_saved_model(str(tmp_path / "sm")).convert()
    assert b == tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "sm")).convert()
    # TensorFlow's own constructor, from concrete functions (its bytes differ from the classmethod's)
    direct = lite.TFLiteConverter([fn], model)
    assert isinstance(direct, tf.lite.TFLiteConverter) and hasattr(direct, "device_specs")
    assert direct.convert() == tf.lite.TFLiteConverter([fn], model).convert()
    assert direct.report == {"interpreter": runtime.name()}          # no tftpu option ran
    assert callable(lite.TFLiteConverter.experimental_from_jax)


def test_runtime_is_litert():
    assert runtime.name().startswith("LiteRT")

"""The numpy 2 / Keras 3 shims that tf2onnx 1.17 needs, checked on the code paths that need them."""

import numpy as np

from tftpu import compat


def test_numpy_aliases_restored():
    compat.install()
    compat.install()  # idempotent
    assert np.product([2, 3, 4]) == 24
    assert np.product is np.prod or np.product([1]) == 1


def test_tf2onnx_external_tensor_path_uses_product():
    """tf2onnx's Node.get_value_attr calls np.product to decide whether a constant goes external."""
    import tf2onnx

    compat.install()
    graph = tf2onnx.graph.Graph([], opset=13)
    value = np.arange(4096, dtype=np.float32).reshape(64, 64)
    const = graph.make_const("w", value)
    storage = tf2onnx.graph.ExternalTensorStorage()
    storage.external_tensor_size_threshold = 16
    attr = const.get_value_attr(storage)
    assert attr.t.external_data, "the constant should have moved to external storage"
    (data,) = storage.name_to_tensor_data.values()
    np.testing.assert_array_equal(np.frombuffer(data, np.float32).reshape(64, 64), value)


def test_from_keras_with_keras3_output_names():
    import keras
    import onnxruntime as ort
    import tensorflow as tf
    import tf2onnx

    compat.install()
    inp = keras.Input((8, 8, 3), name="x")
    a = keras.layers.Conv2D(4, 3, strides=2, padding="same", name="conv")(inp)
    model = keras.Model(inp, [keras.layers.Flatten(name="flat")(a), keras.layers.ReLU(name="relu")(a)])
    model.output_names = compat.keras_output_names(model)
    assert model.output_names == ["flat", "relu"]
    proto, _ = tf2onnx.convert.from_keras(
        model, input_signature=(tf.TensorSpec((1, 8, 8, 3), tf.float32, name="x"),), opset=13)
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 3)).astype(np.float32)
    got = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    for g, e in zip(got, model(x)):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-5, atol=1e-5)

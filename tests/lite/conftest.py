"""Models of the tftpu.lite tests: Keras applications (random weights, 32x32 inputs: the
conversion cost is the graph and weights, not the image size) and mtcnn with its real weights,
each built and converted by TensorFlow once per session."""

import numpy as np
import pytest


def _keras_app(name, size):
    import keras

    keras.utils.set_random_seed(0)
    cls = getattr(keras.applications, name)
    return cls(weights=None, input_shape=(size, size, 3), classes=10, classifier_activation=None)


BUILDERS = {
    "ResNet50": lambda: _keras_app("ResNet50", 32),
    "MobileNetV2": lambda: _keras_app("MobileNetV2", 32),
    "EfficientNetB0": lambda: _keras_app("EfficientNetB0", 32),
    "mtcnn_rnet": lambda: __import__("tests.models.mtcnn", fromlist=["rnet"]).rnet(weights=True),
    "mtcnn_onet": lambda: __import__("tests.models.mtcnn", fromlist=["onet"]).onet(weights=True),
}


@pytest.fixture(scope="session")
def keras_model():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = BUILDERS[name]()
        return cache[name]

    return get


@pytest.fixture(scope="session")
def tf_bytes(keras_model):
    """TensorFlow's own converter output per model (the reference)."""
    import tensorflow as tf

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = bytes(tf.lite.TFLiteConverter.from_keras_model(keras_model(name)).convert())
        return cache[name]

    return get


def sample_input(model, seed=0):
    shape = (1,) + tuple(model.inputs[0].shape[1:])
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)

"""MTCNN R-Net and O-Net as Keras functional models, with their real weights.

The layer structure follows the mtcnn 1.0.0 package (`mtcnn/network/rnet.py`, `onet.py`, MIT
licence); weights come from `tests.material.mtcnn_weights`. Inputs are `(x - 127.5) / 128`
normalized RGB crops: 24x24 for R-Net, 48x48 for O-Net.
"""

from __future__ import annotations

import keras
from keras import layers as L

from tests import material


def _conv_block(x, filters, kernel, name, pool=None):
    x = L.Conv2D(filters, kernel, padding="valid", name=f"conv{name}")(x)
    x = L.PReLU(shared_axes=[1, 2], name=f"prelu{name}")(x)
    if pool is not None:
        size, stride, padding = pool
        x = L.MaxPooling2D(size, stride, padding=padding, name=f"maxpooling{name}")(x)
    return x


def rnet(weights: bool = True) -> keras.Model:
    """R-Net: 24x24x3 -> (box regression [4], face probability [2])."""
    inp = keras.Input((24, 24, 3), name="input")
    x = _conv_block(inp, 28, 3, "1", (3, 2, "same"))
    x = _conv_block(x, 48, 3, "2", (3, 2, "valid"))
    x = _conv_block(x, 64, 2, "3")
    x = L.Flatten(name="flatten3")(L.Permute((2, 1, 3), name="permute")(x))
    x = L.PReLU(name="prelu4")(L.Dense(128, name="fc4")(x))
    model = keras.Model(inp, [L.Dense(4, name="fc5_1")(x), L.Dense(2, activation="softmax", name="fc5_2")(x)],
                        name="mtcnn_rnet")
    if weights:
        model.set_weights(material.mtcnn_weights("rnet"))
    return model


def onet(weights: bool = True) -> keras.Model:
    """O-Net: 48x48x3 -> (box regression [4], landmarks [10], face probability [2])."""
    inp = keras.Input((48, 48, 3), name="input")
    x = _conv_block(inp, 32, 3, "1", (3, 2, "same"))
    x = _conv_block(x, 64, 3, "2", (3, 2, "valid"))
    x = _conv_block(x, 64, 3, "3", (2, 2, "same"))
    x = _conv_block(x, 128, 2, "4")
    x = L.Flatten(name="flatten4")(L.Permute((2, 1, 3), name="permute")(x))
    x = L.PReLU(name="prelu5")(L.Dense(256, name="fc5")(x))
    outputs = [L.Dense(4, name="fc6_1")(x), L.Dense(10, name="fc6_2")(x),
               L.Dense(2, activation="softmax", name="fc6_3")(x)]
    model = keras.Model(inp, outputs, name="mtcnn_onet")
    if weights:
        model.set_weights(material.mtcnn_weights("onet"))
    return model


def preprocess(crops):
    """uint8 RGB crops -> the network's input scale."""
    return (crops.astype("float32") - 127.5) / 128.0


def lfw_inputs(size: int):
    """lfw_subset (100 faces then 100 non-faces) resized to `size`, as RGB network input."""
    import numpy as np
    import tensorflow as tf

    images, labels = material.lfw_subset()
    rgb = np.repeat(images[..., None].astype("float32") * 255.0, 3, axis=-1)
    return preprocess(tf.image.resize(rgb, (size, size)).numpy()), labels

"""Reference models built in code, with deterministic weights, for demos and benchmarks.

`resnet18_like` is the topology PEERS.md measures TPU-MLIR on: a 7x7/2 conv + BN + ReLU stem,
3x3/2 max pool, four stages of two basic blocks (64/128/256/512 channels, 1x1/2 conv + BN
downsample), global average pool and a 512 -> 1000 dense layer, He-normal weights.

>>> model = resnet18_like(input_shape=(64, 64, 3))  # doctest: +SKIP

Like the tools, these are quiet unless `TFTPU_VERBOSE=1`: TensorFlow is imported without its
start-up lines, and the model's `export()` prints no trace (Keras lists every captured
variable) unless asked with `verbose=True`.
"""

from __future__ import annotations

import contextlib
import types

from tftpu.utils import quiet


def _quiet_export(model, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
    """`keras.Model.export`, with `verbose` defaulting to `TFTPU_VERBOSE` instead of True and
    TensorFlow's native log lines kept off stderr when not verbose."""
    import keras

    verbose = quiet.verbose() if verbose is None else verbose
    with quiet.native_stderr_silenced() if not verbose else contextlib.nullcontext():
        return keras.Model.export(model, filepath, format=format, verbose=verbose,
                                  input_signature=input_signature, **kwargs)


def _block(x, filters, stride, name, layers):
    y = layers.Conv2D(filters, 3, stride, padding="same", use_bias=False, name=f"{name}_conv1")(x)
    y = layers.BatchNormalization(epsilon=1e-5, name=f"{name}_bn1")(y)
    y = layers.ReLU(name=f"{name}_relu1")(y)
    y = layers.Conv2D(filters, 3, 1, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    y = layers.BatchNormalization(epsilon=1e-5, name=f"{name}_bn2")(y)
    if stride != 1 or x.shape[-1] != filters:
        x = layers.Conv2D(filters, 1, stride, use_bias=False, name=f"{name}_down")(x)
        x = layers.BatchNormalization(epsilon=1e-5, name=f"{name}_down_bn")(x)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([x, y]))


def resnet18_like(input_shape=(224, 224, 3), classes: int = 1000, seed: int = 0):
    """ResNet-18 topology (NHWC Keras model) with He-normal weights drawn from `seed`.

    BatchNorm statistics are set to non-trivial deterministic values so that folding them is
    actually exercised.
    """
    quiet.import_tensorflow()
    import keras
    import numpy as np
    from keras import layers

    keras.utils.set_random_seed(seed)
    inp = keras.Input(input_shape, name="image")
    x = layers.ZeroPadding2D(3, name="stem_pad")(inp)
    x = layers.Conv2D(64, 7, 2, use_bias=False, kernel_initializer="he_normal", name="stem_conv")(x)
    x = layers.BatchNormalization(epsilon=1e-5, name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    x = layers.ZeroPadding2D(1, name="pool_pad")(x)
    x = layers.MaxPooling2D(3, 2, name="pool")(x)
    for stage, filters in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _block(x, filters, stride, f"s{stage + 1}b{block + 1}", layers)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    out = layers.Dense(classes, name="fc")(x)
    model = keras.Model(inp, out, name="resnet18_like")
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, layers.Conv2D):
            k = layer.kernel
            fan_in = int(np.prod(k.shape[:-1]))
            k.assign(rng.normal(0, np.sqrt(2.0 / fan_in), k.shape).astype("float32"))
        elif isinstance(layer, layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype("float32"))
            layer.beta.assign(rng.normal(0, 0.1, c).astype("float32"))
            layer.moving_mean.assign(rng.normal(0, 0.1, c).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.5, 1.5, c).astype("float32"))
        elif isinstance(layer, layers.Dense):
            fan_in = layer.kernel.shape[0]
            layer.kernel.assign(rng.normal(0, np.sqrt(1.0 / fan_in), layer.kernel.shape).astype("float32"))
            layer.bias.assign(np.zeros(layer.bias.shape, "float32"))
    model.export = types.MethodType(_quiet_export, model)
    return model


def sample_image(size: int = 224):
    """The bundled photo (scikit-image's `chelsea`, 224x224 RGB uint8), resized to `size`."""
    from importlib import resources

    import numpy as np
    import tensorflow as tf

    data = resources.files("tftpu.assets").joinpath("chelsea_224.jpg").read_bytes()
    img = tf.io.decode_jpeg(data, channels=3)
    if size != 224:
        img = tf.cast(tf.round(tf.image.resize(img, (size, size), antialias=True)), tf.uint8)
    return np.asarray(img)

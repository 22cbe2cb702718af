"""tftpu.keras.space_to_depth on whole models: equal outputs, preprocessing moved, declines."""

import keras
import numpy as np
import pytest

import tftpu.data
import tftpu.keras
from tftpu.errors import ShapeError, UnsupportedOpError, UsageError


def _images(shape, seed=0, high=255.0):
    return np.random.default_rng(seed).uniform(0, high, shape).astype(np.float32)


def _check(model, images, block=2, atol=1e-4, **kwargs):
    s2d = tftpu.keras.space_to_depth(model, block, **kwargs)
    ref = model(images)
    got = s2d(tftpu.data.transform(images, block))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=atol)
    return s2d


def _head(shape, *layers):
    inp = keras.Input(shape)
    x = inp
    for layer in layers:
        x = layer(x)
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, keras.layers.Dense(3)(x))


def _norm(channels, seed=0):
    layer = keras.layers.Normalization(axis=-1)
    layer.adapt(np.random.default_rng(seed).normal(0.3, 0.2, (64, channels)).astype(np.float32))
    return layer


@pytest.mark.parametrize("size", [(32, 32), (33, 31), (17, 24)])
@pytest.mark.parametrize("stem", ["plain", "rescale", "rescale_norm", "zeropad", "all", "perchannel", "activation"])
def test_model_outputs_equal(stem, size):
    keras.utils.set_random_seed(1)
    pre = {
        "plain": [],
        "rescale": [keras.layers.Rescaling(1 / 127.5, offset=-1)],
        "rescale_norm": [keras.layers.Rescaling(1 / 255), _norm(3)],
        "zeropad": [keras.layers.ZeroPadding2D(((3, 2), (1, 3)))],
        "all": [keras.layers.Rescaling(1 / 255), _norm(3), keras.layers.ZeroPadding2D(1)],
        "perchannel": [keras.layers.Rescaling([0.01, 0.02, 0.03], offset=[-1, 0, 1]),
                       keras.layers.Normalization(mean=[0.5, 1, 2], variance=[1, 4, 9], invert=True)],
        "activation": [keras.layers.Rescaling(1 / 255), keras.layers.Activation("sigmoid"), keras.layers.Identity()],
    }[stem]
    conv = keras.layers.Conv2D(8, 7, strides=2, padding="same" if stem != "zeropad" else "valid",
                               bias_initializer="random_normal")
    model = _head(size + (3,), *pre, conv)
    s2d = _check(model, _images((2,) + size + (3,)))
    assert [w.shape for w in s2d.weights] == [w.shape for w in model.weights]
    assert not [l for l in s2d.layers if isinstance(l, keras.layers.ZeroPadding2D)]


def test_cast_op_and_uint8_input():
    inp = keras.Input((20, 20, 3), dtype="uint8")
    x = keras.ops.cast(inp, "float32")
    x = keras.layers.Rescaling(1 / 255, offset=-0.5)(x)
    x = keras.layers.Conv2D(4, 3, strides=2)(x)
    model = keras.Model(inp, keras.layers.Flatten()(x))
    images = np.random.default_rng(0).integers(0, 256, (2, 20, 20, 3), dtype=np.uint8)
    _check(model, images, atol=1e-5)


@pytest.mark.parametrize("block,strides", [(2, 4), (4, 4), ((2, 4), (2, 4))])
def test_block_sizes(block, strides):
    model = _head((40, 36, 2), keras.layers.Conv2D(6, 5, strides=strides, padding="same"))
    got = tftpu.keras.space_to_depth(model, block)
    blocks = block if isinstance(block, tuple) else (block, block)
    assert got.input_shape == (None, 10 if blocks[0] == 4 else 20, 9 if blocks[1] == 4 else 18,
                               2 * blocks[0] * blocks[1])
    images = _images((1, 40, 36, 2))
    np.testing.assert_allclose(got(tftpu.data.transform(images, blocks)), model(images), rtol=1e-4, atol=1e-4)


def test_sequential_and_share_or_copy():
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Rescaling(2.0),
                              keras.layers.Conv2D(4, 3, strides=2), keras.layers.Flatten(), keras.layers.Dense(2)])
    shared = _check(model, _images((2, 16, 16, 3)), share_weights=True)
    copied = _check(model, _images((2, 16, 16, 3)), share_weights=False)
    assert {id(v) for v in shared.weights} == {id(v) for v in model.weights}
    assert not {id(v) for v in copied.weights} & {id(v) for v in model.weights}
    model.layers[1].kernel.assign(model.layers[1].kernel * 2)
    images = _images((1, 16, 16, 3), 5)
    x = tftpu.data.transform(images, 2)
    np.testing.assert_allclose(shared(x), model(images), rtol=1e-4, atol=1e-4)
    assert not np.allclose(copied(x), model(images))


def test_nchw_input_layout_takes_fused_host_layout():
    model = _head((30, 30, 3), keras.layers.Rescaling(1 / 255), keras.layers.Conv2D(4, 3, strides=2))
    s2d = tftpu.keras.space_to_depth(model, 2, input_layout="NCHW")
    images = _images((2, 30, 30, 3))
    assert s2d.input_shape == (None, 12, 15, 15)
    np.testing.assert_allclose(s2d(tftpu.data.transform(images, 2, layout="NCHW")), model(images),
                               rtol=1e-4, atol=1e-4)


def test_second_input_passes_through():
    img, meta = keras.Input((16, 16, 3), name="img"), keras.Input((2,), name="meta")
    x = keras.layers.Flatten()(keras.layers.Conv2D(2, 3, strides=2, padding="same")(img))
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([x, meta]))
    model = keras.Model({"img": img, "meta": meta}, out)
    s2d = tftpu.keras.space_to_depth(model, 2, input_name="img")
    images, extra = _images((2, 16, 16, 3)), np.ones((2, 2), np.float32)
    np.testing.assert_allclose(s2d({"img": tftpu.data.transform(images, 2).numpy(), "meta": extra}),
                               model({"img": images, "meta": extra}), rtol=1e-4, atol=1e-4)
    with pytest.raises(UsageError, match="2 inputs"):
        tftpu.keras.space_to_depth(model, 2)


def test_conv3d_model():
    inp = keras.Input((4, 10, 11, 2))
    x = keras.layers.Conv3D(3, (3, 5, 5), strides=(1, 2, 2), padding="same")(inp)
    model = keras.Model(inp, keras.layers.Flatten()(x))
    s2d = tftpu.keras.space_to_depth(model, 2)
    images = _images((2, 4, 10, 11, 2))
    np.testing.assert_allclose(s2d(tftpu.data.transform(images, (1, 2, 2))), model(images), rtol=1e-4, atol=1e-4)


def _declined(model, error, match, **kwargs):
    with pytest.raises(error, match=match):
        tftpu.keras.space_to_depth(model, **kwargs)


def test_declines_with_reasons():
    _declined(_head((16, 16, 3), keras.layers.Conv2D(4, 3, strides=3)), ShapeError, "not divisible by block")
    _declined(_head((16, 16, 3), keras.layers.Conv2D(4, 3, strides=2)), ShapeError, "not divisible", block_size=4)
    _declined(_head((16, 16, 3), keras.layers.Conv2D(4, 3, dilation_rate=2)), ShapeError, "dilation")
    _declined(_head((16, 16, 3), keras.layers.Conv2D(6, 3, strides=2, groups=3)), UnsupportedOpError, "groups")
    _declined(_head((16, 16, 3), keras.layers.DepthwiseConv2D(3, strides=2)), UnsupportedOpError,
              "must be a Conv2D")
    _declined(_head((16, 16, 3), keras.layers.MaxPooling2D(), keras.layers.Conv2D(4, 3, strides=2)),
              UnsupportedOpError, "MaxPooling2D 'max_pooling2d.*not per-channel")
    _declined(_head((16, 16, 3), keras.layers.ZeroPadding2D(1), _norm(3), keras.layers.Conv2D(4, 3, strides=2)),
              UnsupportedOpError, "does not keep the padding zero")
    _declined(_head((16, 16, 3), keras.layers.Normalization(axis=(1, 2, 3), mean=0.5, variance=2.0),
                    keras.layers.Conv2D(4, 3, strides=2)), UnsupportedOpError, "not the channel axis")
    _declined(_head((None, None, 3), keras.layers.Conv2D(4, 3, strides=2)), ShapeError, "unknown dimensions")
    _declined(_head((16, 16, 3), keras.layers.Conv2D(4, 3, strides=2)), UsageError, "block_size", block_size=1)
    _declined(_head((16, 16, 3), keras.layers.Conv2D(4, 3, strides=2)), UsageError, "input_layout",
              input_layout="HWCN")
    inp = keras.Input((16, 16, 3))
    a = keras.layers.Conv2D(2, 3, strides=2)(inp)
    b = keras.layers.Conv2D(2, 3, strides=2)(inp)
    _declined(keras.Model(inp, keras.layers.Add()([a, b])), UnsupportedOpError, "feeds")

    class Sub(keras.Model):
        def call(self, x):
            return x

    _declined(Sub(), UsageError, "subclassed")


@pytest.mark.slow
@pytest.mark.parametrize("name,size", [("ResNet50", 64), ("MobileNetV2", 64), ("EfficientNetB0", 65)])
def test_keras_applications(name, size):
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10)
    for layer in model.layers:
        if isinstance(layer, keras.layers.Normalization):
            rng = np.random.default_rng(1)
            layer.adapt_mean.assign(rng.uniform(0.3, 0.6, 3).astype(np.float32))
            layer.adapt_variance.assign(rng.uniform(0.05, 0.1, 3).astype(np.float32))
            layer.finalize_state()
    s2d = tftpu.keras.space_to_depth(model, 2)
    images = _images((2, size, size, 3))
    ref = model(images, training=False)
    got = s2d(tftpu.data.transform(images, 2), training=False)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    stem = [l for l in s2d.layers if isinstance(l, tftpu.keras.Conv2D)]
    assert len(stem) == 1 and stem[0].strides == (2, 2) and tuple(stem[0].s2d_kernel().shape[:2]) in {(4, 4), (2, 2)}


@pytest.mark.slow
def test_nested_keras_application_backbone():
    keras.utils.set_random_seed(0)
    backbone = keras.applications.MobileNetV2(weights=None, include_top=False, input_shape=(63, 63, 3))
    model = keras.Sequential([keras.Input((63, 63, 3)), keras.layers.Rescaling(1 / 127.5, offset=-1), backbone,
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5)])
    s2d = tftpu.keras.space_to_depth(model, 2)
    images = _images((2, 63, 63, 3))
    np.testing.assert_allclose(s2d(tftpu.data.transform(images, 2), training=False), model(images, training=False),
                               rtol=1e-4, atol=1e-5)
    assert [w.shape for w in s2d.weights] == [w.shape for w in model.weights]

"""Checkpoints load both ways between a model and its S2D twin; training gives the same losses."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tftpu.data
import tftpu.keras


def _build(seed, size=15):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((size, size, 3))
    x = keras.layers.Rescaling(1 / 255)(inp)
    x = keras.layers.Normalization(mean=[0.4, 0.5, 0.6], variance=[0.05, 0.06, 0.07])(x)
    x = keras.layers.ZeroPadding2D(2)(x)
    x = keras.layers.Conv2D(8, 5, strides=2, use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(8, 3, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, keras.layers.Dense(3)(x))


def _data(n=32, size=15):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, size, size, 3)).astype(np.float32)
    images[np.arange(n), :, :, np.arange(n) % 3] *= 0.5  # the darkest channel is the label
    return images, np.arange(n) % 3


def _fit(model, x, y, steps=6):
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()
    model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)


def _save(model, tmp_path, fmt):
    tmp_path.mkdir(parents=True, exist_ok=True)
    if fmt == "weights.h5":
        model.save_weights(str(tmp_path / "w.weights.h5"))
        return str(tmp_path / "w.weights.h5")
    return tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))


def _load(model, path, fmt):
    if fmt == "weights.h5":
        model.load_weights(path)
    else:
        tf.train.Checkpoint(model=model).restore(path).assert_existing_objects_matched()


@pytest.mark.parametrize("fmt", ["weights.h5", "tf.train.Checkpoint"])
@pytest.mark.parametrize("direction", ["s2d_to_original", "original_to_s2d"])
def test_checkpoints_load_both_ways(tmp_path, direction, fmt):
    images, labels = _data()
    s2d_images = tftpu.data.transform(images, 2).numpy()
    original = _build(0)
    s2d = tftpu.keras.space_to_depth(_build(1), 2, share_weights=False)
    if direction == "s2d_to_original":
        _fit(s2d, s2d_images, labels)
        _load(original, _save(s2d, tmp_path, fmt), fmt)
    else:
        _fit(original, images, labels)
        _load(s2d, _save(original, tmp_path, fmt), fmt)
    for a, b in zip(original.weights, s2d.weights):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(s2d(s2d_images), original(images), rtol=1e-5, atol=1e-5)


def test_full_model_file_round_trip(tmp_path):
    images, _ = _data(4)
    s2d = tftpu.keras.space_to_depth(_build(0), 2)
    s2d.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded, tftpu.keras.SpaceToDepthModel)
    assert isinstance(loaded.get_layer(s2d.layers[5].name), tftpu.keras.Conv2D)
    x = tftpu.data.transform(images, 2).numpy()
    np.testing.assert_array_equal(loaded(x), s2d(x))


def test_fit_losses_match():
    images, labels = _data(64)
    original = _build(0)
    s2d = tftpu.keras.space_to_depth(_build(0), 2, share_weights=False)
    losses = {}
    for name, model, x in [("original", original, images), ("s2d", s2d, tftpu.data.transform(images, 2).numpy())]:
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        losses[name] = [float(model.train_on_batch(x[i:i + 8], labels[i:i + 8]))
                        for _ in range(3) for i in range(0, 64, 8)]
    assert len(losses["s2d"]) == 24
    np.testing.assert_allclose(losses["s2d"], losses["original"], rtol=1e-4, atol=1e-5)
    assert np.mean(losses["original"][-8:]) < 0.8 * np.mean(losses["original"][:8])


def test_export_saved_model_serves_s2d_input(tmp_path):
    images, _ = _data(4)
    s2d = tftpu.keras.space_to_depth(_build(0), 2)
    s2d.export(str(tmp_path / "sm"), verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    x = tftpu.data.transform(images, 2)
    np.testing.assert_allclose(loaded.serve(x), s2d(x), rtol=1e-6, atol=1e-6)


def test_mixed_precision_policy():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = _build(0, size=17)
        s2d = tftpu.keras.space_to_depth(model, 2)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    images, _ = _data(4, size=17)
    ref, got = model(images), s2d(tftpu.data.transform(images, 2))
    assert got.dtype == ref.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(got, tf.float32), tf.cast(ref, tf.float32), rtol=0.05, atol=0.05)


def test_tf_checkpoint_of_the_original_object_holds_the_shared_s2d_training(tmp_path):
    images, labels = _data(16)
    original = _build(0)
    s2d = tftpu.keras.space_to_depth(original, 2)  # shares every variable with `original`
    _fit(s2d, tftpu.data.transform(images, 2).numpy(), labels, steps=3)
    path = tf.train.Checkpoint(model=original).save(str(tmp_path / "ckpt"))
    fresh = _build(1)
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
    np.testing.assert_allclose(fresh(images), s2d(tftpu.data.transform(images, 2)), rtol=1e-5, atol=1e-5)


def _nested(seed, kind):
    keras.utils.set_random_seed(seed)
    if kind == "sequential":
        backbone = keras.Sequential([keras.Input((15, 15, 3)), keras.layers.Normalization(mean=0.5, variance=0.1),
                                     keras.layers.Conv2D(6, 3, strides=2, padding="same"),
                                     keras.layers.BatchNormalization(), keras.layers.ReLU()])
    else:
        inner = keras.Input((15, 15, 3))
        x = keras.layers.ZeroPadding2D(1)(inner)
        x = keras.layers.Conv2D(6, 3, strides=2)(x)
        backbone = keras.Model(inner, keras.layers.BatchNormalization()(x))
    inp = keras.Input((15, 15, 3))
    x = backbone(keras.layers.Rescaling(1 / 255, offset=-0.5)(inp))
    return keras.Model(inp, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x)))


@pytest.mark.parametrize("kind", ["functional", "sequential"])
@pytest.mark.parametrize("fmt", ["weights.h5", "tf.train.Checkpoint"])
def test_nested_backbone_outputs_and_checkpoints(tmp_path, kind, fmt):
    images, labels = _data(16)
    original = _nested(0, kind)
    s2d = tftpu.keras.space_to_depth(_nested(1, kind), 2, share_weights=False)
    assert isinstance(s2d.layers[-3], tftpu.keras.SpaceToDepthModel)
    _fit(s2d, tftpu.data.transform(images, 2).numpy(), labels, steps=3)
    _load(original, _save(s2d, tmp_path / "a", fmt), fmt)
    for a, b in zip(original.weights, s2d.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(s2d(tftpu.data.transform(images, 2)), original(images), rtol=1e-5, atol=1e-5)
    _fit(original, images, labels, steps=2)  # and back
    _load(s2d, _save(original, tmp_path / "b", fmt), fmt)
    x = tftpu.data.transform(images, 2)
    np.testing.assert_allclose(s2d(x), original(images), rtol=1e-5, atol=1e-5)
    s2d.save(tmp_path / "m.keras")
    np.testing.assert_array_equal(keras.models.load_model(tmp_path / "m.keras")(x), s2d(x))

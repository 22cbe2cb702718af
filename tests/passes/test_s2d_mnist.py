"""A model trained for real: a stride-2 CNN on the 5000 MNIST digits (tests/material), a custom
training loop over tf.data, original vs `tftpu.optimize` (S2D on the tpu target): same loss
curve, same weights at the end, and both learn (held-out accuracy).

The two are compared in float64, a set-up where two different programs computing the same
math agree. S2D sums the stem's products in another order; in float32 that moves a sum by
about 2^-24 of its size, and a ReLU whose pre-activation lies that close to zero flips, a finite
jump in its weight gradient that the optimiser carries on: on this model the original alone,
trained on each batch in reversed order (the same math) or from weights one ulp away, follows
one of two curves up to 1.3% apart, and which one S2D follows depends on the CPU and its thread
count (oneDNN or Eigen, and how they split a sum). In float64 the same reorderings move sums
by about 2^-53 of their size; the original, reversed-batch and S2D curves agree within about
1e-15 relative, measured, and are held within 1e-9."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tftpu
from tests import material

BATCH = 50
TRAIN = 4000
EPOCHS = 2


@pytest.fixture
def float64():
    """Keras layers built in float64 for the test, float32 again after it.
    The global dtype policy is set too: an earlier test that set one would override floatx."""
    before, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield "float64"
    keras.config.set_floatx(before)
    keras.config.set_dtype_policy(policy)


def _model(dtype):
    keras.utils.set_random_seed(11)
    inp = keras.Input((28, 28, 1), dtype="uint8")
    x = keras.layers.Rescaling(1 / 255.0)(keras.ops.cast(inp, dtype))
    x = keras.layers.Conv2D(16, 5, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.Flatten()(x)
    model = keras.Model(inp, keras.layers.Dense(10)(x))
    opt = keras.optimizers.Adam(3e-3)
    opt.build(model.trainable_variables)
    return model, opt


def _step(model, opt):
    @tf.function
    def step(it):
        x, y = next(it)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=True), from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def test_mnist_same_loss_curve(float64):
    images, labels = material.mnist()
    order = np.random.default_rng(0).permutation(len(labels))  # the file is sorted by label
    images, labels = images[order][..., None], labels[order]
    ds = tf.data.Dataset.from_tensor_slices((images[:TRAIN], labels[:TRAIN])).repeat(EPOCHS).batch(BATCH)
    curves, accs = [], []
    for optimized in (False, True):
        model, opt = _model(float64)
        it = iter(ds)
        step = _step(model, opt)
        if optimized:
            step = tftpu.optimize(step, it, target="tpu")
            assert step.report.applied("space_to_depth"), str(step.report)
            assert "moved Cast+Mul+AddV2 after S2D" in str(step.report)
        curves.append([float(step(it)) for _ in range(EPOCHS * TRAIN // BATCH)])
        pred = model.predict(images[TRAIN:], verbose=0).argmax(-1)
        accs.append(float((pred == labels[TRAIN:]).mean()))
        stem = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)][0]
        assert stem.kernel.shape == (5, 5, 1, 16) and stem.kernel.dtype == float64
        if not optimized:
            kernel0 = stem.kernel.numpy()
        else:
            kernel1 = stem.kernel.numpy()
    a, b = np.array(curves[0]), np.array(curves[1])
    print(f"mnist: loss {a[0]:.3f} -> {a[-1]:.3f}, max |loss diff| {np.abs(a - b).max():.2e}, "
          f"held-out accuracy {accs[0]:.3f} / {accs[1]:.3f}")
    np.testing.assert_allclose(b, a, rtol=1e-9, atol=0)
    assert a[-20:].mean() < 0.3 * a[:10].mean()
    assert min(accs) > 0.9 and accs[0] == accs[1]
    np.testing.assert_allclose(kernel1, kernel0, rtol=0, atol=1e-9)

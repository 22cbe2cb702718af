"""A stride-2 CNN trained for real on the 5000 MNIST digits: the S2D twin follows the same loss curve.

The two train in float64, a set-up where two different programs computing the same math agree:
in float32 S2D's other order of the stem's sums flips the odd ReLU whose pre-activation lies
within 2^-24 of zero, and the curves part by up to 1% (so do the original's own curves on
batches in reversed order, or from weights one ulp away), on whichever side the CPU's kernels
(oneDNN or Eigen, and their split of a sum among threads) put them. In float64 those reorderings
move sums by about 2^-53 of their size; the curves (per-step losses recovered from Keras's
running means, which cost a few more digits) agree within about 1e-13 relative, measured, so do
the original's on reversed batches, and are held within 1e-9."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tftpu.data
import tftpu.keras
from tests import material

STEPS, BATCH = 240, 64


@pytest.fixture
def float64():
    """Keras layers, optimizer and metrics built in float64 for the test, float32 again after it.
    The global dtype policy is set too: an earlier test that set one would override floatx."""
    before, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield "float64"
    keras.config.set_floatx(before)
    keras.config.set_dtype_policy(policy)


def _cnn():
    keras.utils.set_random_seed(42)
    inp = keras.Input((28, 28, 1), dtype="uint8")
    x = keras.layers.Rescaling(1 / 255)(inp)
    x = keras.layers.Conv2D(16, 5, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(32, 3, strides=2, activation="relu")(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inp, keras.layers.Dense(10)(x))


class _StepLosses(keras.callbacks.Callback):
    """Per-step losses, recovered from the running epoch mean Keras logs after each batch."""

    def on_epoch_begin(self, epoch, logs=None):
        self.means = []

    def on_train_batch_end(self, batch, logs=None):
        self.means.append(float(logs["loss"]))
        self.losses.append(len(self.means) * self.means[-1] - (len(self.means) - 1) * (
            self.means[-2] if len(self.means) > 1 else 0.0))


def _curve(model, train, test):
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    steps = _StepLosses()
    steps.losses = []
    model.fit(train, epochs=STEPS // 40, steps_per_epoch=40, verbose=0, callbacks=[steps])
    return np.array(steps.losses), model.evaluate(test, verbose=0)[1]


@pytest.mark.slow
def test_mnist_loss_curves_match(float64):
    images, labels = material.mnist()
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order][..., None], labels[order]
    train = tf.data.Dataset.from_tensor_slices((images[:4000], labels[:4000])).batch(BATCH).repeat()
    test = tf.data.Dataset.from_tensor_slices((images[4000:], labels[4000:])).batch(500)
    model, twin = _cnn(), tftpu.keras.space_to_depth(_cnn(), 2)
    assert all(v.dtype == float64 for v in model.weights + twin.weights)
    loss, acc = _curve(model, train, test)
    s2d_loss, s2d_acc = _curve(twin, tftpu.data.space_to_depth(train, 2), tftpu.data.space_to_depth(test, 2))
    assert len(loss) == STEPS and loss[-20:].mean() < 0.2 * loss[:20].mean() and acc > 0.9
    np.testing.assert_allclose(s2d_loss, loss, rtol=1e-9, atol=0)
    assert s2d_acc == acc

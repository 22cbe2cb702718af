"""keras.applications stems (weights=None) rewritten exactly by S2D on the tpu target:
ResNet50 (ZeroPadding + 7x7/2 VALID), MobileNetV2 (3x3/2 SAME), EfficientNetB0 (Rescaling +
Normalization moved after S2D, ZeroPadding + 3x3/2 VALID). Forward outputs and kernel gradient."""

import numpy as np
import pytest
import tensorflow as tf

from tftpu.pipelines.optimize import optimize


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / (np.abs(a).max() + 1e-30))


@pytest.mark.slow
@pytest.mark.parametrize("name,size,moved", [("ResNet50", 64, ""), ("MobileNetV2", 64, ""),
                                             ("EfficientNetB0", 65, "Mul+AddV2+Sub+RealDiv")])
def test_application_stem_exact(name, size, moved):
    import keras

    keras.utils.set_random_seed(3)
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10,
                                              classifier_activation=None)
    conv = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)][0]
    both = keras.Model(model.inputs, [conv.output, model.outputs[0]])
    x = tf.constant(np.random.default_rng(0).uniform(0, 255, (2, size, size, 3)).astype(np.float32))
    weights = tf.constant(np.random.default_rng(1).standard_normal((2, 10)).astype(np.float32))

    @tf.function
    def f(images):
        with tf.GradientTape() as tape:
            stem, logits = both(images, training=False)
            loss = tf.reduce_sum(logits * weights) + tf.reduce_sum(tf.reduce_mean(stem, [0, 1, 2]))
        return stem, logits, tape.gradient(loss, conv.kernel)

    ref = f(x)
    fast = optimize(f, x, target="tpu")
    result = fast.report["space_to_depth"]
    assert len(result.changed) == 1 and not result.declined, str(result)
    assert (f"moved {moved} after S2D" in result.changed[0].reason) if moved else "; moved" not in result.changed[0].reason
    assert "removed its Conv2DBackpropInput" in result.changed[0].reason
    got = fast(x)
    assert _rel(ref[0], got[0]) < 1e-5     # stem output
    assert _rel(ref[1], got[1]) < 1e-4     # logits after the whole network
    assert _rel(ref[2], got[2]) < 1e-4     # kernel gradient
    assert ref[2].shape == got[2].shape == conv.kernel.shape
    s2d = [n for n in fast.graph_def.node if n.op == "SpaceToDepth"]
    assert len(s2d) == 1 and s2d[0].input[0].startswith("images")
    declined = optimize(f, x, target="cpu").report["space_to_depth"]
    assert not declined.changed and "estimated" in declined.declined[0].reason

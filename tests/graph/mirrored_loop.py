"""Custom `strategy.run` training loop under MirroredStrategy (two logical CPUs), original vs
`tftpu.optimize` for the tpu target. Prints one JSON line.

Run in its own process: logical devices must be configured before TensorFlow starts.
"""

import json
import sys

import numpy as np
import tensorflow as tf

STEPS = 24
GLOBAL_BATCH = 8


def main(target="tpu"):
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    from tftpu.pipelines.optimize import optimize

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (64, 23, 23, 3)).astype(np.uint8)
    labels = rng.integers(0, 5, (64,)).astype(np.int32)

    def build():
        keras.utils.set_random_seed(7)
        with strategy.scope():
            inp = keras.Input((23, 23, 3), dtype="uint8")
            x = keras.layers.Rescaling(1 / 127.5, offset=-1.0)(keras.ops.cast(inp, "float32"))
            x = keras.layers.ZeroPadding2D(3)(x)
            x = keras.layers.Conv2D(8, 7, strides=2, use_bias=False)(x)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.ReLU()(x)
            x = keras.layers.Conv2D(8, 3, strides=2, padding="same")(x)
            x = keras.layers.GlobalAveragePooling2D()(x)
            out = keras.layers.Dense(5)(x)
            model = keras.Model(inp, out)
            opt = keras.optimizers.SGD(0.05, momentum=0.9)
            opt.build(model.trainable_variables)
        return model, opt

    def make_step(model, opt, it):
        def replica(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                per = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
                loss = tf.nn.compute_average_loss(per, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def step():
            x, y = next(it)
            return strategy.reduce("SUM", strategy.run(replica, (x, y)), axis=None)

        return step

    def dataset():
        ds = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(GLOBAL_BATCH, drop_remainder=True)
        return iter(strategy.experimental_distribute_dataset(ds))

    m0, o0 = build()
    it0 = dataset()
    s0 = make_step(m0, o0, it0)
    m1, o1 = build()
    it1 = dataset()
    s1 = make_step(m1, o1, it1)
    before = [v.numpy().copy() for v in m1.trainable_variables]
    fast = optimize(s1, target=target)
    l0 = [float(s0()) for _ in range(STEPS)]
    l1 = [float(fast()) for _ in range(STEPS)]
    gd = fast.graph_def
    s2d_devices = sorted({n.device for n in gd.node if n.op == "SpaceToDepth"})
    moved = max(float(np.abs(a - v.numpy()).max()) for a, v in zip(before, m1.trainable_variables))
    weights = max(float(np.abs(a.numpy() - b.numpy()).max())
                  for a, b in zip(m0.trainable_variables, m1.trainable_variables))
    print(json.dumps({
        "losses_original": l0, "losses_optimized": l1, "s2d_devices": s2d_devices,
        "rewrites": len(fast.report["space_to_depth"].changed),
        "report": str(fast.report), "variables_moved": moved, "weights_diff": weights,
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])

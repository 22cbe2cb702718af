"""Train a small CNN and its S2D twin under a tf.distribute strategy; print per-step losses as JSON.

Run in a subprocess (it configures devices before TensorFlow touches them):
    python -m tests.keras.distribute_job mirrored            # model.fit, two logical CPU devices
    TF_CONFIG=... python -m tests.keras.distribute_job multiworker
The multi-worker job trains with a custom `strategy.run` loop: Keras 3's `fit` does not run under
MultiWorkerMirroredStrategy (keras-team/keras#20585).
"""

import json
import sys

STEPS = 20


def _model(keras, size=20):
    keras.utils.set_random_seed(7)
    inp = keras.Input((size, size, 3))
    x = keras.layers.Rescaling(1 / 255)(inp)
    x = keras.layers.Conv2D(8, 7, strides=2, padding="same")(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, keras.layers.Dense(4)(x))


def _dataset(tf, np, size=20, batch=16):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (batch * 4, size, size, 3)).astype(np.uint8)
    labels = (images.reshape(len(images), -1, 3).mean(1).argmax(1) + (images[:, 0, 0, 0] > 127)).astype(np.int64)
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch, drop_remainder=True).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def _custom_loop(tf, strategy, model, optimizer, ds, global_batch=16):
    iterator = iter(strategy.experimental_distribute_dataset(ds))

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function
    def step():
        per_replica = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return [float(step()) for _ in range(STEPS)]


def main(mode: str) -> None:
    import tensorflow as tf

    if mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras
    import numpy as np

    import tftpu.data
    import tftpu.keras

    losses = {}
    for variant in ("original", "s2d"):
        with strategy.scope():
            model = _model(keras)
            ds = _dataset(tf, np)
            if variant == "s2d":
                model = tftpu.keras.space_to_depth(model, 2)
                ds = tftpu.data.space_to_depth(ds, 2)
            optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if mode == "mirrored":
            model.compile(optimizer=optimizer, loss=loss_fn)
            history = model.fit(ds, epochs=STEPS, steps_per_epoch=1, verbose=0)
            losses[variant] = [float(v) for v in history.history["loss"]]
        else:
            losses[variant] = _custom_loop(tf, strategy, model, optimizer, ds)
    print("RESULT " + json.dumps({"replicas": strategy.num_replicas_in_sync, **losses}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

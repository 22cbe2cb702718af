"""The two-step host S2D that tftpu.data's fused paths are checked against."""

import tensorflow as tf


def two_step_s2d(images, block, dtype=None, scale=None, offset=None):
    """TensorFlow without XLA: convert, zero-pad to a multiple of the block, tf.nn.space_to_depth."""
    x = tf.convert_to_tensor(images)
    if dtype is not None:
        x = tf.cast(x, dtype)
    if scale is not None:
        x = x * tf.constant(scale, x.dtype)
    if offset is not None:
        x = x + tf.constant(offset, x.dtype)
    h, w = x.shape[1:3]
    x = tf.pad(x, [[0, 0], [0, -h % block], [0, -w % block], [0, 0]])
    return tf.nn.space_to_depth(x, block)

"""The S2D conv layer against keras.layers.Conv2D/Conv3D: outputs and kernel gradients, swept."""

import itertools
import random

import keras
import numpy as np
import pytest
import tensorflow as tf

import tftpu.data
from tftpu.keras import layers as s2d_layers
from tftpu.keras.space_to_depth import _conv_plan


def _cases():
    rng = random.Random(3)
    cases = []
    for k, (s, b), odd in itertools.product(range(1, 9), [(2, 2), (4, 2), (4, 4)], (0, 1)):
        padding = ["valid", "same", "zeropad"][(k + s + odd) % 3]
        size = (rng.choice([12, 16, 20]) + odd, rng.choice([12, 16]) + (1 - odd))
        cases.append((k, s, b, padding, size, rng.randint(1, 3), rng.randint(1, 4)))
    return cases


def _pair(conv_cls, s2d_cls, k, s, b, padding, sizes, channels, zeropad=()):
    rank = len(sizes)
    conv = conv_cls(5, k, strides=s, padding="valid" if padding == "zeropad" else padding,
                    bias_initializer="random_normal")
    conv.build((None,) + tuple(sizes[i] + sum(zeropad[i]) if zeropad else sizes[i]
                               for i in range(rank)) + (channels,))
    pad_layers = [type("ZP", (), {"padding": zeropad})()] if zeropad else []
    blocks = (1,) * (rank - 2) + (b, b)
    explicit = _conv_plan(conv, sizes, pad_layers, blocks)
    s2d = s2d_cls(input_size=sizes, block_size=blocks, explicit_padding=explicit,
                  original_channels=channels, **conv.get_config())
    s2d.share_variables(conv)
    return conv, s2d, blocks


@pytest.mark.parametrize("k,s,b,padding,sizes,batch,channels", _cases())
def test_conv2d_outputs_and_kernel_gradients(k, s, b, padding, sizes, batch, channels):
    zeropad = ((k // 2, (k + 1) // 3), (1, k % 3)) if padding == "zeropad" else ()
    conv, s2d, blocks = _pair(keras.layers.Conv2D, s2d_layers.Conv2D, k, s, b, padding, sizes, channels, zeropad)
    x = tf.random.stateless_normal((batch,) + sizes + (channels,), seed=(k, s))
    with tf.GradientTape(persistent=True) as tape:
        ref = conv(keras.layers.ZeroPadding2D(zeropad)(x) if zeropad else x)
        got = s2d(tftpu.data.transform(x, b))
        up = tf.random.stateless_normal(ref.shape, seed=(1, 2))
        loss_ref, loss_got = tf.reduce_sum(ref * up), tf.reduce_sum(got * up)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    for v in (conv.kernel, conv.bias):
        g_ref, g_got = tape.gradient(loss_ref, v), tape.gradient(loss_got, v)
        np.testing.assert_allclose(g_got, g_ref, rtol=1e-4, atol=1e-4)
    assert s2d.trainable_weights[0] is conv.trainable_weights[0]


@pytest.mark.parametrize("k,padding,sizes", [(3, "same", (4, 9, 10)), (4, "valid", (5, 11, 8)), (7, "same", (3, 13, 13))])
def test_conv3d_blocks_height_and_width(k, padding, sizes):
    conv, s2d, blocks = _pair(keras.layers.Conv3D, s2d_layers.Conv3D, k, (1, 2, 2), 2, padding, sizes, 2)
    x = tf.random.stateless_normal((2,) + sizes + (2,), seed=(k, 0))
    np.testing.assert_allclose(s2d(tftpu.data.transform(x, blocks)), conv(x), rtol=1e-5, atol=1e-5)


def test_padding_mask_marks_host_padding():
    mask = s2d_layers.padding_mask((3, 5), (2, 2), 1)[0]
    image = np.pad(np.ones((3, 5, 1), np.float32), ((0, 1), (0, 1), (0, 0)))
    np.testing.assert_array_equal(mask, tf.nn.space_to_depth(image[None], 2)[0])

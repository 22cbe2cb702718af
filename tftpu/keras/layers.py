"""Keras layers that run the first convolution of a model on space-to-depth (S2D) input.

The kernel variable keeps the original `[*k, C, O]` shape and is turned into the S2D kernel
`[*ceil(k/b), C*b*b, O]` inside `call` (`s2d_geometry.transform_kernel`), so the S2D model and
the original model read and write the same checkpoints. Keras names weight paths in
`.weights.h5` files after each layer's class, which is why the classes are called `Conv2D` and
`Conv3D` (registered for serialization as `tftpu>SpaceToDepthConv2D` / `...Conv3D`).

The S2D input convention: the original `[N, *sizes, C]` image, zero-padded at the end of every
blocked axis up to a multiple of its block (`s2d_geometry.pad_input`), then blocked with the
channel order `(r_1, ..., r_n, c)` of `tf.nn.space_to_depth`.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from tftpu.passes import s2d_geometry

__all__ = ["Conv2D", "Conv3D", "padding_mask"]


def padding_mask(sizes, blocks, channels: int) -> np.ndarray:
    """1 where an S2D input element holds a real pixel, 0 where it holds host padding.

    Shape `[1, *ceil(sizes/blocks), prod(blocks) * channels]`, channel order `(r_1..r_n, c)`.
    """
    mask = np.ones([1] * (2 * len(sizes)) + [channels], np.float32)
    n = len(sizes)
    for axis, (size, block) in enumerate(zip(sizes, blocks)):
        blocked = -(-size // block)
        valid = (np.arange(blocked)[:, None] * block + np.arange(block)[None, :]) < size
        shape = [1] * (2 * n) + [1]
        shape[axis], shape[n + axis] = blocked, block
        mask = mask * valid.reshape(shape).astype(np.float32)
    blocked_sizes = [-(-s // b) for s, b in zip(sizes, blocks)]
    return mask.reshape([1] + blocked_sizes + [math.prod(blocks) * channels])


class _SpaceToDepthConv:
    """Mixin: an N-D channels-last Conv whose input is the S2D image (see the module doc)."""

    def __init__(self, *, input_size, block_size, explicit_padding, original_channels,
                 mask_padding=False, **conv_kwargs):
        super().__init__(**conv_kwargs)
        self.input_size = tuple(int(s) for s in input_size)
        self.block_size = tuple(int(b) for b in block_size)
        self.explicit_padding = tuple((int(b), int(e)) for b, e in explicit_padding)
        self.original_channels = int(original_channels)
        self.mask_padding = bool(mask_padding)
        self.plans = tuple(
            s2d_geometry.AxisPlan(size, k, s, b, pads)
            for size, k, s, b, pads in zip(self.input_size, self.kernel_size, self.strides,
                                           self.block_size, self.explicit_padding))

    @property
    def s2d_input_shape(self):
        """The input shape (batch excluded) this layer takes."""
        return tuple(p.blocked_size for p in self.plans) + (
            self.original_channels * math.prod(self.block_size),)

    def build(self, input_shape):
        expected = self.s2d_input_shape
        if tuple(input_shape[1:]) != expected:
            raise ValueError(f"{self.name}: S2D input shape {tuple(input_shape[1:])}, expected {expected}")
        # The kernel keeps the shape of the original conv over `original_channels` channels.
        super().build((input_shape[0],) + self.input_size + (self.original_channels,))
        self.input_spec = keras.layers.InputSpec(ndim=self.rank + 2, axes={-1: expected[-1]})

    def share_variables(self, conv) -> None:
        """Use `conv`'s kernel and bias variables (the original layer keeps owning them)."""
        self._kernel = conv._kernel
        self.bias = conv.bias
        self.built = True
        self._build_shapes_dict = {"input_shape": (None,) + self.s2d_input_shape}
        self.input_spec = keras.layers.InputSpec(ndim=self.rank + 2,
                                                 axes={-1: self.s2d_input_shape[-1]})

    def s2d_kernel(self):
        """The kernel of the S2D conv, computed from the original-shaped variable."""
        kernel = ops.cast(self.kernel, self.compute_dtype)
        return s2d_geometry.transform_kernel(kernel, self.plans)

    def call(self, inputs):
        x = ops.cast(inputs, self.compute_dtype)
        if self.mask_padding and any(p.size_pad for p in self.plans):
            mask = padding_mask(self.input_size, self.block_size, self.original_channels)
            x = x * ops.cast(mask, self.compute_dtype)
        x = s2d_geometry.pad_blocked(x, self.plans)
        outputs = ops.conv(x, self.s2d_kernel(), strides=[p.new_stride for p in self.plans],
                           padding="valid", data_format="channels_last")
        if self.use_bias:
            outputs = ops.add(outputs, ops.reshape(ops.cast(self.bias, self.compute_dtype),
                                                   (1,) * (self.rank + 1) + (self.filters,)))
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def compute_output_shape(self, input_shape):
        return (input_shape[0],) + tuple(p.out for p in self.plans) + (self.filters,)

    def get_config(self):
        config = super().get_config()
        config.update(input_size=list(self.input_size), block_size=list(self.block_size),
                      explicit_padding=[list(p) for p in self.explicit_padding],
                      original_channels=self.original_channels, mask_padding=self.mask_padding)
        return config


@keras.saving.register_keras_serializable(package="tftpu", name="SpaceToDepthConv2D")
class Conv2D(_SpaceToDepthConv, keras.layers.Conv2D):
    """`keras.layers.Conv2D` over S2D input `[N, ceil(H/b), ceil(W/b), C*b*b]`; kernel `[k, k, C, O]`."""


@keras.saving.register_keras_serializable(package="tftpu", name="SpaceToDepthConv3D")
class Conv3D(_SpaceToDepthConv, keras.layers.Conv3D):
    """`keras.layers.Conv3D` over S2D input `[N, D/bd, H/b, W/b, C*bd*b*b]`; kernel `[kd, k, k, C, O]`."""

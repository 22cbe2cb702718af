"""Keras adapters of tftpu: space-to-depth for a model's first convolution.

>>> import tftpu.keras
>>> s2d_model = tftpu.keras.space_to_depth(model, block_size=2)   # doctest: +SKIP
"""

from tftpu.keras.layers import Conv2D, Conv3D, padding_mask
from tftpu.keras.space_to_depth import SpaceToDepthModel, find_first_conv, space_to_depth

__all__ = ["space_to_depth", "find_first_conv", "SpaceToDepthModel", "Conv2D", "Conv3D", "padding_mask"]

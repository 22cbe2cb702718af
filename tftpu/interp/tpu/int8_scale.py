"""The INT8 kernel of `tpu.Scale`: `(x - zp) * s + b` per channel in integers (INT8 multiplier,
INT32 bias, saturated to int32 as a conv's sum), then the per-channel requantization."""

from __future__ import annotations

import numpy as np

from tftpu.interp.kernels._registry import channel_axis
from tftpu.interp.tpu.int8_kernels import _per_channel, _requant
from tftpu.interp.tpu.registry import int8


@int8("tpu.Scale")
def scale(operands, attrs, info):
    x, s, b = operands
    axis = channel_axis(x.ndim, attrs)
    acc = (x.astype(np.int64) - info.ins[0].zp) * _per_channel(np.ravel(s), x.ndim, axis)
    if b is not None:
        acc += _per_channel(np.ravel(b), x.ndim, axis)
    return [_requant(acc, attrs, info.outs[0], axis)]

"""The INT8 kernel of `tpu.Softmax`: per row along `axis`, e = table[max - x] (the exp on the
input grid, INT32), S = sum(e), and y = round(e * steps / S) (half up: every term is >= 0) on
the output grid of 1/steps, plus its zero point, saturated. Integers only."""

from __future__ import annotations

import numpy as np

from tftpu.interp.tpu.int8_kernels import _clamp
from tftpu.interp.tpu.registry import int8


@int8("tpu.Softmax")
def softmax(operands, attrs, info):
    x, table = operands
    out = info.outs[0]
    steps = int(round(1.0 / out.scale))          # 256: the lowering puts the output on 1/256
    axis = int(attrs["axis"]) % x.ndim
    xi = x.astype(np.int32)
    e = np.asarray(table, np.int64)[xi.max(axis=axis, keepdims=True) - xi]
    s = e.sum(axis=axis, keepdims=True)
    y = (e * (2 * steps) + s) // (2 * s) + out.zp
    return [_clamp(y, {}, out)]

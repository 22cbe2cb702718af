"""INT8 `top.Scale` (y = x * s + b per channel) as a per-channel INT8 multiply: each s is +-127
(or fewer steps) on its own scale `|s| / 127`, b an INT32 on the grid `scale_in * |s| / 127`,
then `top.Conv`'s per-channel requantization: one integer multiplier and shift per channel."""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import TensorType

from tftpu import rounding
from tftpu.errors import UsageError
from tftpu.ir import quant
from tftpu.quant import params as P
from tftpu.transforms.lowering.int8_conv import _calibrated
from tftpu.transforms.lowering.registry import int8

BIAS_LIMIT = float(1 << 30)     # |bias| on its grid at most this: the sum with |x * s| stays in int32


def scale_weights(s: np.ndarray, b: np.ndarray, scale_in: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int8 multipliers, their scales, int32 biases) of per-channel `s` and `b`: `s` exact at
    +-127 steps of `|s| / 127`, unless the bias on that grid would pass BIAS_LIMIT (a scale
    negligible beside its bias): then the grid widens until it fits and `s` takes fewer steps."""
    s, b = np.asarray(s, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    scales = np.where(s != 0, np.abs(s) / P.QMAX, 1.0)
    scales = np.maximum(scales, np.abs(b) / (scale_in * BIAS_LIMIT))
    q = np.clip(rounding.round_half_away(s / scales), -P.QMAX, P.QMAX).astype(np.int8)
    return q, scales, P.bias(b, scale_in * scales)


@int8("top.Scale")
def scale(ctx, op):
    x, s, b = op.operands
    if not ctx.is_weight(s):
        return "its scale is not a constant"
    if hasattr(b.type, "get_shape") and not ctx.is_weight(b):
        return "its bias is not a constant"
    if len(x.type.get_shape()) < 2:
        return "a Scale of a 1-D tensor runs in float"
    grids, why = _calibrated(ctx, op, x, op.results[0])
    if why:
        return why
    xq, oq = grids
    sv = ctx.weight_array(s)
    bv = ctx.weight_array(b) if ctx.is_weight(b) else np.zeros(sv.size)
    sq, scales, bq = scale_weights(sv, bv, xq.scale)
    try:
        ms, rs = P.requant(xq.scale * scales / oq.scale)
    except UsageError as e:
        return str(e)
    operands = [ctx.quantized(x, xq), ctx.weight(s.owner.key, sq, quant.per_axis("i8", 0, scales)),
                ctx.weight(b.owner.key if ctx.is_weight(b) else f"{op.loc}_bias", bq,
                           quant.per_axis("i32", 0, xq.scale * scales))]
    out = TensorType(ctx.qtype(oq), op.results[0].type.get_shape())
    new = ctx.emit("tpu.Scale", operands, ctx.attributes(op, "tpu.Scale", multiplier=ms, rshift=rs), op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None

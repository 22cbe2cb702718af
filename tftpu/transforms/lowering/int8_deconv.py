"""INT8 transposed convolutions (`top.Deconv`): the requantization of `top.Conv` (symmetric INT8
weights per output channel, an INT32 bias at `scale_in * scale_w`, INT32 sums, per-channel
multiplier and right shift); the kernel scatters each input pixel's products exactly."""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType

from tftpu.ir import quant
from tftpu.quant import params as P
from tftpu.quant.params import deconv_weights
from tftpu.transforms.lowering.int8_conv import _calibrated, constant_filter
from tftpu.transforms.lowering.registry import int8


@int8("top.Deconv")
def deconv(ctx, op):
    why = constant_filter(ctx, op, "transposed convolutions")
    if why:
        return why
    x, w, b = op.operands
    grids, why = _calibrated(ctx, op, x, op.results[0])
    if why:
        return why
    xq, oq = grids
    group = op.attrs()["group"]
    wq, axis, wscales, out_scales = deconv_weights(ctx.weight_array(w), group)
    acc_scales = xq.scale * out_scales
    ms, rs = P.requant(acc_scales / oq.scale)
    operands = [ctx.quantized(x, xq), ctx.weight(w.owner.key, wq, quant.per_axis("i8", axis, wscales))]
    if ctx.is_weight(b):
        bq = P.bias(ctx.weight_array(b), acc_scales)
        operands.append(ctx.weight(b.owner.key, bq, quant.per_axis("i32", 0, acc_scales)))
    else:
        operands.append(ctx.none())
    out = TensorType(ctx.qtype(oq), op.results[0].type.get_shape())
    new = ctx.emit("tpu.Deconv", operands, ctx.attributes(op, "tpu.Deconv", multiplier=ms, rshift=rs), op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None

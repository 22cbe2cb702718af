"""INT8 pools: max pools keep their input's grid (a max of INT8 values is exact); average
pools sum in INT32 and requantize once by `scale_in / (count * scale_out)`, for windows that
always count the same number of elements."""

from __future__ import annotations

import math

from xdsl.dialects.builtin import TensorType

from tftpu.ir.base import value_name
from tftpu.quant import params as P
from tftpu.transforms.lowering.registry import int8


def same_grid(ctx, op, data_index: int = 0):
    """Lower `op` onto its input's INT8 grid (its result keeps the input's scale)."""
    x = op.operands[data_index]
    p = ctx.grid(x)
    if p is None:
        return f"no calibration entry for {value_name(x)!r}"
    operands = [ctx.quantized(v, p) if i == data_index else ctx.as_is(v) for i, v in enumerate(op.operands)]
    tpu_name = "tpu." + op.name[4:]
    outs = [TensorType(ctx.qtype(p), r.type.get_shape()) for r in op.results]
    new = ctx.emit(tpu_name, operands, ctx.attributes(op, tpu_name), _names(op), outs)
    for old, r in zip(op.results, new.results):
        ctx.values[old] = r
    return None


def _names(op):
    from tftpu.ir.base import loc_names
    return loc_names(op) or [op.loc]


@int8("top.MaxPool", "top.GlobalMaxPool")
def max_pool(ctx, op):
    return same_grid(ctx, op)


def _requantized_sum(ctx, op, count: int):
    x = op.operands[0]
    pin, pout = ctx.grid(x), ctx.qparams(op.results[0])
    if pin is None or pout is None:
        return f"no calibration entry for {value_name(x if pin is None else op.results[0])!r}"
    ms, rs = P.requant([pin.scale / (count * pout.scale)])
    tpu_name = "tpu." + op.name[4:]
    out = TensorType(ctx.qtype(pout), op.results[0].type.get_shape())
    new = ctx.emit(tpu_name, [ctx.quantized(x, pin)], ctx.attributes(op, tpu_name, multiplier=ms, rshift=rs),
                   op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None


@int8("top.AvgPool")
def avg_pool(ctx, op):
    a = op.attrs()
    if len(a["kernel_shape"]) != 2:
        return "only 2-D average pools run in INT8"
    if a.get("ceil_mode") or (any(a["pads"]) and not a.get("count_include_pad")):
        return "its windows count different numbers of elements (padding or ceil mode)"
    return _requantized_sum(ctx, op, math.prod(a["kernel_shape"]))


@int8("top.GlobalAvgPool")
def global_avg_pool(ctx, op):
    shape = op.operands[0].type.get_shape()
    spatial = shape[1:-1] if op.attrs()["layout"] == "NHWC" else shape[2:]
    return _requantized_sum(ctx, op, math.prod(spatial))

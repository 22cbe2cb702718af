"""INT8 convolutions and matmuls: per-output-channel symmetric INT8 weights, an INT32 bias at
`scale_in * scale_w`, INT32 accumulation, per-channel multiplier and right shift."""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import TensorType

from tftpu.ir import quant
from tftpu.quant import params as P
from tftpu.transforms.lowering.registry import int8


def _calibrated(ctx, op, *values):
    ps = [ctx.grid(v) for v in values]
    missing = [v for v, p in zip(values, ps) if p is None]
    if missing:
        from tftpu.ir.base import value_name
        return None, f"no calibration entry for {value_name(missing[0])!r}"
    return ps, None


def _weighted(ctx, op, data, w, b, axis: int, tpu_name: str, wide: bool = False):
    """The shared INT8 lowering of an op with constant weights quantized along `axis` (`wide`:
    on 16 bits, two INT8 passes, where the bias still fits int32 at the finer scale)."""
    grids, why = _calibrated(ctx, op, data, op.results[0])
    if why:
        return why
    xq, oq = grids
    wq, ws = P.weights_per_channel(ctx.weight_array(w), axis, wide)
    if wide and ctx.is_weight(b) and not P.wide_bias_fits(ctx.weight_array(b), xq.scale, ws):
        wide = False
        wq, ws = P.weights_per_channel(ctx.weight_array(w), axis)
    acc_scales = xq.scale * ws
    ms, rs = P.requant(acc_scales / oq.scale)
    operands = [ctx.quantized(data, xq),
                ctx.weight(w.owner.key, wq, quant.per_axis("i16" if wide else "i8", axis % wq.ndim, ws))]
    if ctx.is_weight(b):
        bq = P.bias(ctx.weight_array(b), acc_scales)
        operands.append(ctx.weight(b.owner.key, bq, quant.per_axis("i32", 0, acc_scales)))
    else:
        operands.append(ctx.none())
    out = TensorType(ctx.qtype(oq), op.results[0].type.get_shape())
    new = ctx.emit(tpu_name, operands, ctx.attributes(op, tpu_name, multiplier=ms, rshift=rs), op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None


def constant_filter(ctx, op, what: str) -> str | None:
    """Why a conv-like op (data, filter, bias) has no INT8 form here: a filter or bias that is
    not a constant, or 3-D data; None when it has one."""
    x, w, b = op.operands
    if not ctx.is_weight(w):
        return "its filter is not a constant"
    if b is not None and not ctx.is_weight(b) and hasattr(b.type, "get_shape"):
        return "its bias is not a constant"
    if len(x.type.get_shape()) not in (3, 4):
        return f"3-D {what} run in float"
    return None


@int8("top.Conv")
def conv(ctx, op):
    why = constant_filter(ctx, op, "convolutions")
    if why:
        return why
    x, w, b = op.operands
    axis = 0 if op.attrs()["kernel_layout"] == "OIHW" else -1
    return _weighted(ctx, op, x, w, b, axis, "tpu.Conv", wide=op.loc in ctx.weights16)


@int8("top.MatMul")
def matmul(ctx, op):
    x, w, b = op.operands
    if b is not None and hasattr(b.type, "get_shape") and not ctx.is_weight(b):
        return "its bias is not a constant"
    if ctx.is_weight(w) and len(w.type.get_shape()) >= 2:
        axis = -2 if op.attrs()["right_transpose"] else -1
        return _weighted(ctx, op, x, w, b, axis, "tpu.MatMul")
    # two activations: per-tensor grids, one multiplier
    ps, why = _calibrated(ctx, op, x, w, op.results[0])
    if why:
        return why
    xq, wq, oq = ps
    if ctx.is_weight(b):
        return "a bias on a product of two activations runs in float"
    ms, rs = P.requant([xq.scale * wq.scale / oq.scale])
    out = TensorType(ctx.qtype(oq), op.results[0].type.get_shape())
    new = ctx.emit("tpu.MatMul", [ctx.quantized(x, xq), ctx.quantized(w, wq), ctx.none()],
                   ctx.attributes(op, "tpu.MatMul", multiplier=ms, rshift=rs), op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None


__all__ = ["conv", "matmul", "np"]

"""INT8 element-wise ops: Add/Sub with one int16 multiplier per input and a shared right shift
(TPU-MLIR's rule), Mul with one requantization (Div by a constant: a Mul by its reciprocal),
and every unary activation as a 256-entry table computed from the TOP kernel on the input grid
(exact whatever the function); one that reads a 16-bit link, a smooth one, as 513 knots of its
function that `tpu.Lut` interpolates (so a conv's accumulator reaches the activation without an
8-bit rounding between them, as in a fused conv + activation kernel)."""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import StringAttr, TensorType

from tftpu import rounding
from tftpu.errors import UsageError
from tftpu.interp.kernels import KERNELS
from tftpu.ir import quant
from tftpu.ir.base import value_name
from tftpu.ir.tpu import Lut
from tftpu.quant import params as P
from tftpu.quant.links import LOOKUP_TABLES
from tftpu.transforms.lowering.registry import int8


def _grid(ctx, v):
    """The INT8 grid of an operand: its calibration entry, or for a constant its own range."""
    if ctx.is_weight(v):
        arr = ctx.weight_array(v)
        if arr.dtype.kind != "f":
            return None
        _, scale = P.weights_per_tensor(arr)
        return P.QParams(scale)
    return ctx.grid(v)


def _binary(ctx, op, rule):
    x0, x1 = op.operands
    ps = [_grid(ctx, x0), _grid(ctx, x1), ctx.qparams(op.results[0])]
    if any(p is None for p in ps):
        missing = [value_name(v) for v, p in zip((x0, x1, op.results[0]), ps) if p is None]
        return f"no calibration entry for {missing[0]!r}"
    p0, p1, po = ps
    extra = rule(p0, p1, po)
    if isinstance(extra, str):
        return extra
    _emit(ctx, op, "tpu." + op.name[4:], [ctx.quantized(x0, p0), ctx.quantized(x1, p1)], po, extra)
    return None


def _emit(ctx, op, tpu_name: str, operands: list, po, extra: dict) -> None:
    out = TensorType(ctx.qtype(po), op.results[0].type.get_shape())
    new = ctx.emit(tpu_name, operands, ctx.attributes(op, tpu_name, **extra), op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]


def _add_rule(p0, p1, po):
    try:
        ms, r = P.add_multipliers([p0.scale / po.scale, p1.scale / po.scale])
    except Exception as e:          # a ratio too large for int16 multipliers
        return str(e)
    return {"multiplier": ms, "rshift": [r]}


@int8("top.Add", "top.Sub")
def add_sub(ctx, op):
    return _binary(ctx, op, _add_rule)


def _mul_rule(p0, p1, po):
    try:
        ms, rs = P.requant([p0.scale * p1.scale / po.scale])
    except UsageError as e:         # a product scale too large for one multiplier
        return str(e)
    return {"multiplier": ms, "rshift": rs}


@int8("top.Mul")
def mul(ctx, op):
    return _binary(ctx, op, _mul_rule)


@int8("top.Div")
def div(ctx, op):
    """x / c, c a constant: an INT8 Mul by 1/c, the reciprocal on its own per-tensor grid
    (exact for a scalar: 1/c is +-127 levels of |1/c| / 127)."""
    x, c = op.operands
    if not ctx.is_weight(c):
        return "its divisor is not a constant (only division by a constant runs in INT8, as a Mul)"
    if ctx.weight_array(c).dtype.kind != "f" and ctx.weight_array(c).dtype.name != "bfloat16":
        return "its divisor is an integer constant"
    arr = np.asarray(ctx.weight_array(c), np.float64)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or (arr == 0).any():
        return "its constant divisor has a zero or a non-finite element"
    px, po = _grid(ctx, x), ctx.qparams(op.results[0])
    if px is None or po is None:
        return f"no calibration entry for {value_name(x if px is None else op.results[0])!r}"
    q, scale = P.weights_per_tensor(1.0 / arr)
    pr = P.QParams(scale)
    extra = _mul_rule(px, pr, po)
    if isinstance(extra, str):
        return extra
    recip = ctx.weight(f"{c.owner.key}_reciprocal", q, ctx.qtype(pr))
    _emit(ctx, op, "tpu.Mul", [ctx.quantized(x, px), recip], po, extra)
    return None


ACTIVATIONS = LOOKUP_TABLES        # each lowered to a 256-entry table (`tftpu.quant.links` lists them)


# [0, 1] activations whose values only leave the model (a detector's score maps, alone or as a
# part of a concatenated output): written on a fixed 16-bit grid, not the calibrated 8-bit one,
# which would erase the many low scores and clip the high ones an image scores above the
# calibration photos
SCORES = ("top.Sigmoid", "top.HardSigmoid")
SCORE_GRID = P.QParams(1.0 / 65536, -32768, "i16")
_MOVES = ("top.Reshape", "top.Flatten", "top.Permute", "top.Squeeze", "top.Unsqueeze")


def only_output(op) -> bool:
    """Whether `op`'s results reach nothing but the model's outputs, through reshapes, transposes
    and Concats (a part of a concatenated output, which then keeps each part's grid)."""
    todo = list(op.results)
    while todo:
        for use in todo.pop().uses:
            user = use.operation
            if user.name in _MOVES or user.name == "top.Concat":
                todo.extend(user.results)
            elif user.name != "func.return":
                return False
    return True


def _function(op, xs: np.ndarray) -> np.ndarray:
    """The float function of activation `op` at `xs` (float64, finite: a log or square root of a
    negative, which no real input reaches, is 0)."""
    with np.errstate(all="ignore"):
        ys = np.asarray(KERNELS[op.name]([xs], op.attrs())[0], np.float64)
    return np.clip(np.where(np.isnan(ys), 0.0, ys), -3.0e38, 3.0e38)


@int8(*ACTIVATIONS)
def activation(ctx, op):
    x = op.operands[0]
    pin, pout = ctx.grid(x), ctx.qparams(op.results[0])
    if pin is not None and op.name in SCORES and only_output(op):
        pout = SCORE_GRID
    if pin is None or pout is None:
        return f"no calibration entry for {value_name(x if pin is None else op.results[0])!r}"
    if pin.storage == "i16":              # a link (`tftpu.quant.links`): knots to interpolate
        lo, hi = quant.qrange(pout.storage)
        fine = 1 << Lut.FRACTION_BITS
        levels = (np.arange(Lut.KNOTS, dtype=np.int64) << Lut.KNOT_BITS) + quant.qrange("i16")[0]
        ys = _function(op, pin.dequantize(levels))
        knots = rounding.quantize(ys, pout.scale / fine, pout.zero_point * fine, np.int32)
        table = ctx.weight(f"{op.loc}_lut", np.clip(knots, lo * fine, hi * fine).astype(np.int32))
    else:
        ys = _function(op, pin.dequantize(np.arange(-128, 128, dtype=np.int32)))
        table = ctx.weight(f"{op.loc}_lut", pout.quantize(ys), ctx.qtype(pout))
    out = TensorType(ctx.qtype(pout), op.results[0].type.get_shape())
    new = ctx.emit("tpu.Lut", [ctx.quantized(x, pin), table], {"function": StringAttr(op.name)}, op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None


@int8("top.PRelu")
def prelu(ctx, op):
    """x >= 0: one requantization; x < 0: times the INT8 slope (each slope element at its own
    scale |slope| / 127), requantized per slope element."""
    x, slope = op.operands
    if not ctx.is_weight(slope):
        return "its slope is not a constant"
    pin, pout = ctx.grid(x), ctx.qparams(op.results[0])
    if pin is None or pout is None:
        return f"no calibration entry for {value_name(x if pin is None else op.results[0])!r}"
    s = np.asarray(ctx.weight_array(slope), np.float64)
    varying = [i for i, d in enumerate(s.shape) if d > 1]
    if len(varying) > 1:
        return "its slope varies along more than one axis"
    scales = np.where(s != 0, np.abs(s) / 127.0, 1.0).ravel()
    sq = np.clip(np.rint(s.ravel() / scales), -127, 127).astype(np.int8).reshape(s.shape)
    m_pos, r_pos = P.requant([pin.scale / pout.scale])
    m_neg, r_neg = P.requant(pin.scale * scales / pout.scale)
    if varying:
        stype = quant.per_axis("i8", varying[0], scales)
    else:
        stype = quant.uniform("i8", float(scales[0]))
    out = TensorType(ctx.qtype(pout), op.results[0].type.get_shape())
    new = ctx.emit("tpu.PRelu", [ctx.quantized(x, pin), ctx.weight(slope.owner.key, sq, stype)],
                   ctx.attributes(op, "tpu.PRelu", multiplier=m_pos + m_neg, rshift=r_pos + r_neg), op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None

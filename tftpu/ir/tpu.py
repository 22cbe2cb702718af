"""The TPU dialect: the ops a chip runs, each in one arithmetic mode (F32, BF16, F16, INT8).

A TPU op mirrors the TOP op it lowers (`tpu.Conv` from `top.Conv`): the same operands and
attributes, shape function and FLOPs (taken from the TOP class, so shape arithmetic lives in one
place), plus how it requantizes. Its mode is in its types: float tensors (`f32`, `bf16`, `f16`)
or quantized ones (`!quant.uniform<i8:f32, scale:zp>`, weights per axis). Two ops are the
TPU's own: `tpu.Cast`, wherever precision changes (model inputs/outputs, mode boundaries,
one INT8 scale to another), and `tpu.Lut`, an INT8 activation as a table (256 entries, or 513
knots interpolated from a 16-bit input).

Requantization (INT8): `multiplier` and `rshift`, per output channel or one for the tensor,
mean `y = RoundingRightShift(SaturatingRoundingDoublingHighMul(acc, multiplier), rshift)`,
TFLite's `MultiplyByQuantizedMultiplier` (`tftpu.rounding`); a negative `rshift` is a
left shift before the multiply.

>>> Conv.name, Conv.TOP.name, "multiplier" in Conv.ATTRS
('tpu.Conv', 'top.Conv', True)
"""

from __future__ import annotations

import math
from typing import ClassVar

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Dialect
from xdsl.irdl import (VarOperandDef, VarResultDef, operand_def, opt_operand_def, result_def, var_operand_def,
                        var_result_def)

from tftpu.ir import attrs as A
from tftpu.ir import quant, top
from tftpu.ir.base import Elementwise, Ints, Pure, Str, TensorOp, define_op, numel

__all__ = ["TpuOp", "Cast", "Lut", "TPU_OPS", "OPS_BY_NAME", "FROM_TOP", "Tpu", "MODES", "is_quantized",
           "has_wide_weights"]

MODES = ("F32", "BF16", "F16", "INT8")
FLOAT_DTYPES = ("f32", "bf16", "f16")
_REQUANT = {"multiplier": Ints(()), "rshift": Ints(())}


def is_quantized(value) -> bool:
    """Whether an SSA value holds quantized (integer-stored) data."""
    return isinstance(value.type, TensorType) and quant.is_quant(value.type.element_type)


def has_wide_weights(op) -> bool:
    """Whether `op` is a `tpu.Conv` multiplying 16-bit weights (two INT8 passes over their byte
    planes: `tftpu.quant.links.WideWeights`)."""
    return op.name == "tpu.Conv" and len(op.operands) > 1 and is_quantized(op.operands[1]) \
        and op.operands[1].type.element_type.storage == "i16"


_PROBES: dict = {}


def _probe(cls):
    """An empty instance of a TOP op class, to call its instance-level shape checks with."""
    if cls not in _PROBES:
        _PROBES[cls] = cls.__new__(cls)
    return _PROBES[cls]


class TpuOp(TensorOp):
    """Base of every TPU op: the shape rules of its TOP op, and mode-consistent types."""

    TRAITS: ClassVar[tuple] = (Pure(),)
    TOP: ClassVar[type | None] = None

    @property
    def op_name(self) -> str:
        return self.name[4:]

    @property
    def quantized(self) -> bool:
        """Whether the op computes in integers (its first result is quantized)."""
        return is_quantized(self.results[0])

    def fill_defaults(self, attrs, shapes):
        return self.TOP.fill_defaults(_probe(self.TOP), attrs, shapes) if self.TOP else attrs

    def check(self, shapes, attrs):
        if self.TOP is not None:
            self.TOP.check(_probe(self.TOP), shapes, attrs)
        self.check_types()
        check_quant_axes(self)
        check_requant(self, attrs)

    def requant_channels(self, attrs) -> int:
        """How many per-channel (multiplier, rshift) pairs the op may carry besides one."""
        return 1

    def check_types(self) -> None:
        """Float ops compute in one float type; an INT8 op's activations are all quantized."""
        data = [v for v in (*self.operands, *self.results) if isinstance(v.type, TensorType)]
        if self.quantized:
            bad = [A.dtype_name(v.type.element_type) for v in data
                   if not quant.is_quant(v.type.element_type) and not _is_weight(v)]
            if bad:
                raise ValueError(f"an INT8 op's tensors must all be quantized, found {', '.join(bad)}")
        else:
            kinds = {A.dtype_name(v.type.element_type) for v in data if A.is_float(v.type)}
            if len(kinds) > 1:
                raise ValueError(f"a float op computes in one type, found {', '.join(sorted(kinds))}")

    @classmethod
    def infer(cls, shapes, attrs):
        return cls.TOP.infer(shapes, attrs) if cls.TOP else [shapes[0]]

    def infer_dtypes(self, dtypes, attrs):
        # the lowering chooses result types (the mode); `check_types` keeps them consistent
        return [A.dtype_name(r.type.element_type) for r in self.results]

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        return cls.TOP.count_flops(ins, outs, attrs) if cls.TOP else 0


def _is_weight(v) -> bool:
    return isinstance(v.owner, top.Weight)


# ops whose INT8 kernel requantizes an accumulator with `multiplier` / `rshift`
_REQUANTIZING = ("tpu.Conv", "tpu.Deconv", "tpu.Scale", "tpu.MatMul", "tpu.Mul", "tpu.AvgPool", "tpu.GlobalAvgPool")
_ADD_LIKE = ("tpu.Add", "tpu.Sub")     # one int16 multiplier per input, one shared rshift


def check_quant_axes(op) -> None:
    """A per-axis quantized type names an axis of its tensor and has one scale per channel."""
    for v in (*op.operands, *op.results):
        if not isinstance(v.type, TensorType) or not quant.is_quant(v.type.element_type):
            continue
        et, shape = v.type.element_type, v.type.get_shape()
        axis = et.quant_axis
        if axis is not None and (axis >= len(shape) or len(et.scales) != shape[axis]):
            raise ValueError(f"per-axis type of a {list(shape)} tensor has axis {axis} and "
                             f"{len(et.scales)} scales: needs one scale per channel of an axis it has")


def check_requant(op, attrs) -> None:
    """`multiplier` / `rshift` of an INT8 op are what its kernel can run: present where it
    requantizes, one pair per tensor or per output channel, multipliers in [0, 2**31) (Add/Sub:
    int16, one per input, one rshift), shifts in [-31, 31] (a negative one shifts left)."""
    ms, rs = list(attrs.get("multiplier", ())), list(attrs.get("rshift", ()))
    quantized = op.quantized
    if op.name == "tpu.Cast":
        quantized = quantized and is_quantized(op.operands[0])
    elif op.name in _ADD_LIKE:
        if quantized and (len(ms) != len(op.operands) or len(rs) != 1 or not 0 <= rs[0] <= 31
                          or any(abs(m) >= 1 << 15 for m in ms)):
            raise ValueError(f"INT8 {op.name[4:]} needs one int16 multiplier per input and one rshift in "
                             f"0..31, got multiplier {ms}, rshift {rs}")
        return
    elif op.name == "tpu.PRelu":
        n = 1 + int(math.prod(op.operands[1].type.get_shape()))
        if quantized and (len(ms) != n or len(rs) != n):
            raise ValueError(f"INT8 PRelu needs {n} multipliers and rshifts (one for x >= 0, one per slope "
                             f"element), got {len(ms)} and {len(rs)}")
        if quantized and (any(not 0 <= m_ < 1 << 31 for m_ in ms) or any(not -31 <= r <= 31 for r in rs)):
            raise ValueError(f"multipliers must lie in [0, 2**31) and rshifts in [-31, 31], got {ms}, {rs}")
        return
    elif op.name not in _REQUANTIZING:
        quantized = False
    if not quantized:
        return
    if not ms or len(ms) != len(rs):
        raise ValueError(f"INT8 {op.name[4:]} needs as many multipliers as rshifts (at least one), "
                         f"got multiplier {ms}, rshift {rs}")
    channels = op.requant_channels(attrs)
    if len(ms) not in (1, channels):
        raise ValueError(f"{len(ms)} multipliers: expected 1 or one per output channel ({channels})")
    if any(not 0 <= m < 1 << 31 for m in ms) or any(not -31 <= r <= 31 for r in rs):
        raise ValueError(f"multipliers must lie in [0, 2**31) and rshifts in [-31, 31], got {ms}, {rs}")


# ---------------------------------------------------------------- the TPU's own ops

@define_op
class Cast(TpuOp):
    """A precision change: float <-> float (round to nearest even), float -> INT8 (quantize:
    round half away from zero, saturate), INT8 -> float (dequantize), or one INT8 scale to
    another (`multiplier`/`rshift` on the zero-point-free value)."""

    name = "tpu.Cast"
    input = operand_def(TensorType)
    output = result_def(TensorType)
    TRAITS: ClassVar[tuple] = (Pure(), Elementwise())
    ATTRS: ClassVar[dict] = dict(_REQUANT)

    def check_types(self) -> None:
        pass

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        return numel(outs[0])


@define_op
class Lut(TpuOp):
    """An INT8 element-wise function as a table, computed once at lowering from the float
    function and both tensors' scales. An 8-bit input indexes 256 entries: `y = table[x - min]`.
    A 16-bit input (a link, `tftpu.quant.links`) reads 513 int32 knots, one every 2**KNOT_BITS
    input steps, on a grid FRACTION_BITS finer than the output's (zero point included): with
    `u = x + 32768`, `i = u >> KNOT_BITS`, `f = u & (2**KNOT_BITS - 1)`,
    `y = (table[i] * 2**KNOT_BITS + (table[i + 1] - table[i]) * f + half) >> (KNOT_BITS + FRACTION_BITS)`,
    saturated to the output type, as TFLite's int16 activations interpolate their table."""

    name = "tpu.Lut"
    input = operand_def(TensorType)
    table = operand_def(TensorType)
    output = result_def(TensorType)
    TRAITS: ClassVar[tuple] = (Pure(), Elementwise())
    ATTRS: ClassVar[dict] = {"function": Str("")}    # the TOP op it replaces, for reports
    KNOT_BITS: ClassVar[int] = 7
    FRACTION_BITS: ClassVar[int] = 6
    KNOTS: ClassVar[int] = (1 << (16 - KNOT_BITS)) + 1      # 513: both ends of every span

    def check(self, shapes, attrs):
        wide = quant.is_quant(self.input.type.element_type) and self.input.type.element_type.storage == "i16"
        want = (self.KNOTS,) if wide else (256,)
        if shapes[1] != want:
            raise ValueError(f"table must have {want[0]} entries for a {'16' if wide else '8'}-bit input, "
                             f"got {list(shapes[1])}")
        self.check_types()

    @classmethod
    def infer(cls, shapes, attrs):
        return [shapes[0]]


# ---------------------------------------------------------------- ops mirrored from TOP

def _mirror(top_cls) -> type[TpuOp]:
    """`tpu.<Name>`: the operands, attributes and shape rules of `top.<Name>`, plus requantization."""
    op_def = top_cls.get_irdl_definition()
    ns: dict = {"name": "tpu." + top_cls.name[4:], "TOP": top_cls, "__module__": __name__,
                "__doc__": f"{top_cls.name} on the chip, in one mode. " + (top_cls.__doc__ or "").strip(),
                "ATTRS": {**top_cls.ATTRS, **_REQUANT}, "OPTIONAL_OPERANDS": top_cls.OPTIONAL_OPERANDS,
                "TRAITS": tuple(top_cls.TRAITS) if top_cls.TRAITS else (Pure(),),
                "__annotations__": {"ATTRS": ClassVar[dict], "TRAITS": ClassVar[tuple],
                                    "TOP": ClassVar[type], "OPTIONAL_OPERANDS": ClassVar[tuple]}}
    for name, d in op_def.operands:
        ns[name] = var_operand_def() if isinstance(d, VarOperandDef) else operand_def()
    for name, d in op_def.results:
        ns[name] = var_result_def(TensorType) if isinstance(d, VarResultDef) else result_def(TensorType)
    return define_op(type(top_cls.__name__, (TpuOp,), ns))


# TOP ops with no TPU counterpart: graph plumbing stays `top.*` (as in TPU-MLIR), and `top.Cast`
# (a dtype change) lowers to `tpu.Cast`
_NOT_MIRRORED = ("top.Input", "top.Weight", "top.None", "top.Cast")
_WRITTEN_OUT = ("top.Softmax",)      # TPU ops with operands of their own (below)
MIRRORED = [_mirror(cls) for cls in top.TOP_OPS if cls.name not in _NOT_MIRRORED + _WRITTEN_OUT]


@define_op
class Softmax(TpuOp):
    """top.Softmax on the chip, in one mode. INT8 (`tftpu.transforms.lowering.int8_softmax`):
    `table` holds exp(-d * scale_in) in units of 2**-16 for d = row max - x in 0..255 (the exp
    on the input grid), the sum and the normalisation are integers and the result lies on a
    fixed grid (1/256 in i8, 1/65536 in i16); the float modes have no table."""

    name = "tpu.Softmax"
    TOP: ClassVar[type] = top.Softmax
    input = operand_def()
    table = opt_operand_def()
    output = result_def(TensorType)
    ATTRS: ClassVar[dict] = {**top.Softmax.ATTRS, **_REQUANT}
    OPTIONAL_OPERANDS: ClassVar[tuple] = top.Softmax.OPTIONAL_OPERANDS
    TRAITS: ClassVar[tuple] = tuple(top.Softmax.TRAITS) if top.Softmax.TRAITS else (Pure(),)


MIRRORED.append(Softmax)


def _conv_channels(self, attrs) -> int:
    shape = self.results[0].type.get_shape()
    return shape[-1] if attrs.get("layout") == "NHWC" else shape[1]


def _last_channels(self, attrs) -> int:
    return self.results[0].type.get_shape()[-1]


for _cls in MIRRORED:                # per-channel requantization: Conv's channels, MatMul's last axis
    if _cls.name in ("tpu.Conv", "tpu.Deconv", "tpu.Scale"):
        _cls.requant_channels = _conv_channels
    elif _cls.name == "tpu.MatMul":
        _cls.requant_channels = _last_channels
globals().update({cls.name[4:]: cls for cls in MIRRORED})   # tpu.Conv as `tpu.Conv` in Python too
FROM_TOP: dict[str, type[TpuOp]] = {cls.TOP.name: cls for cls in MIRRORED}   # "top.Conv" -> tpu.Conv

TPU_OPS = [Cast, Lut, *MIRRORED]
OPS_BY_NAME: dict[str, type[TpuOp]] = {cls.name: cls for cls in TPU_OPS}
FLOPS = {cls.name: cls.flops_of for cls in TPU_OPS}

from tftpu.ir.group import GROUP_OPS  # noqa: E402  (the layer-group region ops: text form only)

Tpu = Dialect("tpu", [*TPU_OPS, *GROUP_OPS], [])


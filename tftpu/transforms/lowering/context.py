"""The state of one TOP -> TPU lowering: the TPU module being built, which TPU value stands for
each TOP value, the casts inserted between modes, the new weights, and every decision.

A lowering asks for an operand in the form it needs (`ctx.quantized(v, params)`,
`ctx.floating(v, "f16")`); the context inserts the `tpu.Cast` that converts it, once per value
and form, so precision changes appear exactly where the modes of producer and consumer differ.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, NoneType, StringAttr, TensorType, i1
from xdsl.ir import Block, Region, SSAValue

from tftpu.chip import MODES
from tftpu.ir import attrs as A
from tftpu.ir import quant, top, tpu
from tftpu.ir.base import make_attributes, set_loc, value_name
from tftpu.ir.module import TpuModel, default_weight_file
from tftpu.quant import params as P
from tftpu.quant.links import reads_link
from tftpu.utils.names import unique_name

__all__ = ["Lowering", "Decision", "float_dtype"]


def float_dtype(mode: str) -> str:
    """The element type a float mode computes in (F32 -> f32, ...)."""
    return MODES[mode]


@dataclasses.dataclass(frozen=True)
class Decision:
    """How one TOP op was lowered: its mode and why."""

    name: str
    op: str
    mode: str
    reason: str = ""
    flops: int = 0


class _TypeKey:
    """An element type as part of a dictionary key: its hash taken once, equal where the types are."""

    __slots__ = ("type", "hash")

    def __init__(self, t):
        self.type, self.hash = t, hash(t)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _TypeKey) and (self.type is other.type or self.type == other.type)


_TYPE_KEYS: OrderedDict = OrderedDict()      # id(element type) -> its _TypeKey, the latest last
_TYPE_KEYS_SIZE = 1 << 13


class Lowering:
    """Builds the TPU module of `model` for `chip` in `mode` (see `tftpu.transforms.lowering.lower`)."""

    def __init__(self, model, chip, mode: str, table=None, asymmetric: bool | str = False,
                 wide: dict | None = None, tables: bool = False, convs: bool | frozenset = False,
                 weights16: frozenset = frozenset()):
        self.src = model
        self.wide = dict(wide or {})        # tensor name -> its 16-bit grid (`tftpu.quant.links`)
        self.tables = tables                # smooth activation tables read links (`wide_links="tables"`)
        self.convs = convs                  # every conv (True) or those named read links (`links.reach`)
        self.weights16 = weights16          # the convs with 16-bit weights (`links.wide_weights`)
        self.reading = None                 # the TOP op being lowered (which operands it reads wide)
        self.chip = chip
        self.mode = mode
        self.table = table
        self.asymmetric = asymmetric
        self.block = Block()
        self.values: dict[SSAValue, SSAValue] = {}
        self.casts: dict[tuple, SSAValue] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.weight_values: dict[tuple, SSAValue] = {}
        self.decisions: list[Decision] = []
        self.input_types: list = []
        self._none: SSAValue | None = None
        self._names: set[str] = {value_name(r) for op in model.ops for r in op.results}

    # ------------------------------------------------------------ names and values

    def fresh_name(self, base: str) -> str:
        name = unique_name(base, self._names)
        self._names.add(name)
        return name

    def none(self) -> SSAValue:
        if self._none is None:
            op = top.NoneOp.create(result_types=[NoneType()])
            self.block.add_op(op)
            self._none = op.results[0]
        return self._none

    def is_weight(self, v: SSAValue) -> bool:
        return isinstance(v.owner, top.Weight)

    def weight_array(self, v: SSAValue) -> np.ndarray:
        return np.asarray(self.src.weights[v.owner.key])

    def weight(self, name: str, array: np.ndarray, element_type=None) -> SSAValue:
        """A `top.Weight` of the TPU module holding `array` (its type: `element_type`, or the
        array's dtype), reused for the same name, array and type."""
        array = np.asarray(array, order="C")          # (ascontiguousarray makes a scalar 1-D)
        et = element_type or A.DTYPES[A.dtype_of_numpy(array.dtype)]
        key = (name, self._type_key(et), array.dtype.str, array.shape, array.tobytes())
        if key in self.weight_values:
            return self.weight_values[key]
        wname = unique_name(name, self.weights)
        self.weights[wname] = array
        op = top.Weight.create(result_types=[TensorType(et, list(array.shape))])
        set_loc(op, wname)
        self.block.add_op(op)
        self.weight_values[key] = op.results[0]
        return op.results[0]

    @staticmethod
    def _type_key(et) -> "_TypeKey":
        """`et` as a dictionary key whose hash is taken once per type object: hashing a per-channel
        quantized type hashes each of its scales' attributes, and a search lowers program after
        program asking for the same weights on the same types (`quant.per_axis` shares them).
        Each key holds its type, so an id remembered stays that type's."""
        got = _TYPE_KEYS.get(id(et))
        if got is None or got.type is not et:
            got = _TYPE_KEYS[id(et)] = _TypeKey(et)
            if len(_TYPE_KEYS) > _TYPE_KEYS_SIZE:
                _TYPE_KEYS.popitem(last=False)
        return got

    def emit(self, op_name: str, operands: list, attributes: dict, loc, result_types: list):
        """Append a TPU op (`tpu.Conv`) with builtin `attributes` and the given result types."""
        cls = tpu.OPS_BY_NAME[op_name]
        op = cls.create(operands=list(operands), result_types=list(result_types), attributes=dict(attributes))
        set_loc(op, loc)
        self.block.add_op(op)
        return op

    def attributes(self, top_op, tpu_name: str, **extra) -> dict:
        """The TOP op's own attributes, plus TPU ones given as plain values."""
        attributes = dict(top_op.attributes)
        attributes.update(make_attributes(tpu.OPS_BY_NAME[tpu_name], {k: v for k, v in extra.items()}))
        return attributes

    def record(self, top_op, mode: str, reason: str = "") -> None:
        self.decisions.append(Decision(top_op.loc, top_op.name, mode, reason, int(top_op.flops())))

    # ------------------------------------------------------------ quantization parameters

    def qparams(self, v: SSAValue) -> P.QParams | None:
        """The INT8 grid of a TOP tensor from the calibration table (None if it has no entry),
        or the 16-bit one of a link that only INT8 element-wise ops read."""
        if self.table is None:
            return None
        if value_name(v) in self.wide:
            return self.wide[value_name(v)]
        return self._calibrated(v)

    def _calibrated(self, v: SSAValue) -> P.QParams | None:
        """The 8-bit grid of TOP value `v`'s calibration entry (None if it has none)."""
        entry = self.table.entries.get(value_name(v))
        return None if entry is None else P.activation(*entry[:3], asymmetric=self.asymmetric)

    def grid(self, v: SSAValue) -> P.QParams | None:
        """The INT8 grid the op being lowered reads TOP value `v` on: the one its producer
        already wrote it on, else its calibration entry's (so no requantization is inserted
        without need); a 16-bit link's 8-bit grid for an op that reads 8 bits only."""
        if self.reading is not None and v.owner is not self.reading and value_name(v) in self.wide and \
                not reads_link(self.reading, v, self.wide, self.tables, self.convs):
            return self._calibrated(v)
        if not isinstance(v.type, NoneType) and not self.is_weight(v) and v in self.values:
            have = self.params_of(self.values[v])
            if have is not None:
                return have
        return self.qparams(v)

    @staticmethod
    def qtype(p: P.QParams):
        return quant.uniform(p.storage, p.scale, p.zero_point)

    @staticmethod
    def params_of(v: SSAValue) -> P.QParams | None:
        """The per-tensor INT8 grid a TPU value is stored on (None if float or per-axis)."""
        et = v.type.element_type
        if quant.is_quant(et) and et.quant_axis is None:
            return P.QParams(et.scale, et.zero_point, et.storage)
        return None

    # ------------------------------------------------------------ operands in the form a lowering needs

    def current(self, v: SSAValue) -> SSAValue:
        """The TPU value standing for the TOP value `v` as its producer made it."""
        if isinstance(v.type, NoneType):
            return self.none()
        return self.values[v]

    def as_is(self, v: SSAValue) -> SSAValue:
        """TOP value `v` unconverted: a constant copied into the TPU module, an activation as
        its producer made it (integer indices, for example)."""
        if isinstance(v.type, NoneType):
            return self.none()
        if self.is_weight(v):
            return self.weight(v.owner.key, self.weight_array(v))
        return self.values[v]

    def floating(self, v: SSAValue, dtype: str) -> SSAValue:
        """TOP value `v` as a float tensor of `dtype` (weights converted, activations cast)."""
        if isinstance(v.type, NoneType):
            return self.none()
        if self.is_weight(v):
            arr = self.weight_array(v)
            if arr.dtype.kind == "f" or arr.dtype.name == "bfloat16":
                from tftpu import rounding
                return self.weight(v.owner.key, rounding.to_float(arr.astype(np.float32), dtype))
            return self.weight(v.owner.key, arr)
        cur = self.values[v]
        et = cur.type.element_type
        if not quant.is_quant(et) and not A.is_float(cur.type):
            return cur                                        # integer data (indices) stay as they are
        if not quant.is_quant(et) and A.dtype_name(et) == dtype:
            return cur
        return self._cast(v, cur, A.DTYPES[dtype], dtype)

    def quantized(self, v: SSAValue, p: P.QParams) -> SSAValue:
        """TOP value `v` on the INT8 grid `p` (a constant is quantized, an activation cast)."""
        if self.is_weight(v):
            return self.weight(v.owner.key, p.quantize(self.weight_array(v)), self.qtype(p))
        cur = self.values[v]
        have = self.params_of(cur)
        if have == p:
            return cur
        want = self.qtype(p)
        extra = {}
        if have is not None:                                   # INT8 -> INT8: requantize
            ms, rs = P.requant([have.scale / p.scale])
            extra = {"multiplier": ms, "rshift": rs}
        return self._cast(v, cur, want, p.storage, extra)

    def _cast(self, v, cur, element_type, suffix: str, extra: dict | None = None) -> SSAValue:
        key = (cur, element_type)
        if key not in self.casts:
            t = TensorType(element_type, cur.type.get_shape())
            attributes = make_attributes(tpu.Cast, extra or {})
            op = self.emit("tpu.Cast", [cur], attributes, self.fresh_name(f"{value_name(v)}_{suffix}"), [t])
            self.casts[key] = op.results[0]
        return self.casts[key]

    # ------------------------------------------------------------ finishing

    def finish(self, outputs: list[SSAValue], output_names: list[str]) -> TpuModel:
        self.block.add_op(func.ReturnOp(*outputs))
        fn = func.FuncOp("main", (self.input_types, [o.type for o in outputs]), Region(self.block))
        name = self.src.name
        module = ModuleOp([fn], attributes={
            "module.name": StringAttr(name),
            "module.weight_file": StringAttr(default_weight_file(name, f"tpu_{self.mode.lower()}")),
            "module.state": StringAttr("TPU_LOWERED"),
            "module.chip": StringAttr(self.chip.name),
            "module.mode": StringAttr(self.mode),
            "module.asymmetric": IntegerAttr(1 if self.asymmetric and self.mode == "INT8" else 0, i1)})
        return TpuModel(module, self.weights)

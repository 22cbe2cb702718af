"""Shared op machinery of tftpu's tensor dialects (TOP today, TPU next), on xDSL's IRDL.

An op declares everything known about it on its class: operands and results (IRDL), typed
attributes with their defaults (`ATTRS = {"group": Int(1), ...}`, each also a typed Python
accessor: `conv.group -> 1`), traits (`Pure`, `Elementwise`, `Commutative`,
`LayoutSensitive`), a shape function `infer`, extra checks `check`, and its FLOPs
`count_flops`. `define_op` turns such a class into an xDSL op whose verifier checks operand
kinds, attribute values and that every result type equals the inferred one.

>>> Int(1).decode(Int(1).encode(3))
3
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    FloatAttr,
    FusedLoc,
    IntegerAttr,
    NameLoc,
    NoneAttr,
    NoneType,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute
from xdsl.irdl import IRDLOperation, attr_def, irdl_op_definition, opt_attr_def, traits_def
from xdsl.traits import Commutative, OpTrait, Pure
from xdsl.utils.exceptions import VerifyException

from tftpu.ir import attrs as A

__all__ = ["REQUIRED", "AttrSpec", "Int", "Float", "Bool", "Str", "Ints", "Floats", "TensorOp", "LookupTable", "define_op",
           "Pure", "Commutative", "Elementwise", "LayoutSensitive", "loc_names", "loc_name", "set_loc",
           "value_name", "numel"]

REQUIRED: Any = object()   # an attribute with no default: it must be given


# ---------------------------------------------------------------- typed attributes

@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: its kind (the builtin attribute it is stored as), its default
    (`REQUIRED` for none) and, for strings, the values it may take."""

    default: Any = REQUIRED
    choices: tuple = ()
    kind: ClassVar[str] = ""
    constraint: ClassVar[type] = Attribute

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def encode(self, value) -> Attribute:
        """The builtin attribute holding the plain Python `value`."""
        return A.to_attr(self.kind, value)

    def decode(self, attr: Attribute):
        """The plain Python value of `attr`; ValueError if it is not of this kind or choice."""
        value = A.from_attr(self.kind, attr)
        if self.choices and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(map(str, self.choices))}, got {value!r}")
        return value

    def fresh_default(self):
        """The default as a new plain value (lists are copied, so callers may edit them)."""
        return list(self.default) if isinstance(self.default, (list, tuple)) else self.default


class Int(AttrSpec):
    kind = "int"
    constraint = IntegerAttr


class Float(AttrSpec):
    kind = "float"
    constraint = FloatAttr


class Bool(AttrSpec):
    kind = "bool"
    constraint = IntegerAttr


class Str(AttrSpec):
    kind = "str"
    constraint = StringAttr


class Ints(AttrSpec):
    kind = "ints"
    constraint = ArrayAttr


class Floats(AttrSpec):
    kind = "floats"
    constraint = ArrayAttr


# ---------------------------------------------------------------- traits

class Elementwise(OpTrait):
    """The op maps each element (of broadcast operands) to one result element."""


class LookupTable(OpTrait):
    """A one-input element-wise function: in INT8 a 256-entry table of its own kernel over the
    input grid, exact whatever the function."""


class Interpolable(OpTrait):
    """A lookup-table function continuous and of bounded slope, so that a 16-bit input may read
    it by linear interpolation between its table's knots (`tpu.Lut`)."""


class LayoutSensitive(OpTrait):
    """The op's meaning depends on its `layout` attribute (NCHW / NHWC data)."""


# ---------------------------------------------------------------- locations

def loc_names(op) -> list[str]:
    """Names of an op's results from its location: `loc("a")` or `loc(fused["a", "b"])`."""
    loc = op.location
    if isinstance(loc, NameLoc):
        return [loc.desc.data]
    if isinstance(loc, FusedLoc):
        return [sub.desc.data for sub in loc.locations.data if isinstance(sub, NameLoc)]
    return []


def loc_name(op) -> str:
    """The location name of an op (its first result's name), or "" when it has none."""
    names = loc_names(op)
    return names[0] if names else ""


def set_loc(op, name: str | list[str]) -> None:
    """Name an op by location, as TPU-MLIR does: by its output tensor name(s)."""
    if isinstance(name, str):
        op.location = NameLoc(StringAttr(name), NoneAttr())
    elif len(name) == 1:
        op.location = NameLoc(StringAttr(name[0]), NoneAttr())
    else:
        op.location = FusedLoc(ArrayAttr([NameLoc(StringAttr(n), NoneAttr()) for n in name]), NoneAttr())


def value_name(v) -> str:
    """Location name of the tensor `v` (the i-th name of its op's location for result i)."""
    names = loc_names(v.owner) if hasattr(v.owner, "location") else []
    idx = v.index if hasattr(v, "index") else 0
    if idx < len(names):
        return names[idx]
    base = names[0] if names else "?"
    return f"{base}_{idx}" if idx else base


def numel(shape) -> int:
    """Number of elements of a shape."""
    return int(math.prod(shape))


# ---------------------------------------------------------------- the op base

class TensorOp(IRDLOperation):
    """Base of every tensor op: typed attributes, shape function, verifier, FLOPs."""

    ATTRS: ClassVar[dict[str, AttrSpec]] = {}
    TRAITS: ClassVar[tuple[OpTrait, ...]] = ()
    # operands that may be a `none` value (e.g. a missing bias)
    OPTIONAL_OPERANDS: ClassVar[tuple[int, ...]] = ()

    @property
    def loc(self) -> str:
        return loc_name(self)

    def attr_value(self, key: str):
        """The plain value of attribute `key`, its default when absent."""
        spec = self.ATTRS[key]
        attr = self.attributes.get(key)
        if attr is None:
            if spec.required:
                raise VerifyException(f"{self.name} at {self.loc!r}: missing attribute {key!r}")
            return spec.fresh_default()
        try:
            return spec.decode(attr)
        except ValueError as e:
            raise VerifyException(f"{self.name} at {self.loc!r}: attribute {key!r}: {e}") from None

    def attrs(self) -> dict:
        """Every attribute as a plain Python value, defaults (rank-dependent ones too) filled in."""
        out = {key: self.attr_value(key) for key in self.ATTRS}
        extra = set(self.attributes) - set(self.ATTRS) - set(ANNOTATIONS)
        if extra:
            raise VerifyException(f"{self.name} at {self.loc!r}: unknown attribute(s) {sorted(extra)}")
        return self.fill_defaults(out, self.operand_shapes())

    def operand_shapes(self) -> list:
        return [A.shape_of(v.type) for v in self.operands]

    def result_shapes(self) -> list:
        return [A.shape_of(r.type) for r in self.results]

    def fill_defaults(self, attrs: dict, shapes: list) -> dict:
        """Hook for defaults that depend on operand ranks (strides, pads, ...)."""
        return attrs

    @classmethod
    def infer(cls, shapes: list, attrs: dict) -> list:
        """Result shapes from operand shapes and attributes (default: like operand 0)."""
        return [shapes[0]]

    @classmethod
    def infer_dtypes(cls, dtypes: list, attrs: dict) -> list:
        """Result element types (default: that of operand 0)."""
        return [dtypes[0]]

    @classmethod
    def count_flops(cls, ins: list, outs: list, attrs: dict) -> int:
        """FLOPs from operand shapes, result shapes and attributes (default: none)."""
        return 0

    @classmethod
    def defaults(cls) -> dict:
        """The plain default of every attribute that has one."""
        return {key: spec.fresh_default() for key, spec in cls.ATTRS.items() if not spec.required}

    @classmethod
    def flops_of(cls, ins: list, outs: list, attrs: dict) -> int:
        """`count_flops` with the attributes not given taken at their defaults."""
        return int(cls.count_flops(ins, outs, {**cls.defaults(), **attrs}))

    def check(self, shapes: list, attrs: dict) -> None:
        """Extra attribute/operand checks; raise ValueError with a message."""

    def verify_(self) -> None:
        where = f"{self.name} at {self.loc!r}"
        for i, v in enumerate(self.operands):
            if isinstance(v.type, NoneType):
                if i not in self.OPTIONAL_OPERANDS:
                    raise VerifyException(f"{where}: operand {i} must be a tensor, not none")
            elif not isinstance(v.type, TensorType):
                raise VerifyException(f"{where}: operand {i} has non-tensor type {v.type}")
        for r in self.results:
            if not isinstance(r.type, TensorType):
                raise VerifyException(f"{where}: result has non-tensor type {r.type}")
        attrs = self.attrs()
        shapes = self.operand_shapes()
        try:
            self.check(shapes, attrs)
            want = self.infer(shapes, attrs)
        except (ValueError, IndexError, ZeroDivisionError, TypeError) as e:
            raise VerifyException(f"{where}: {e}") from None
        got = self.result_shapes()
        if [tuple(s) for s in want] != got:
            raise VerifyException(f"{where}: result shape(s) {got} do not match inferred {[tuple(s) for s in want]}")
        dtypes = [None if s is None else A.dtype_name(v.type.element_type)
                  for v, s in zip(self.operands, shapes)]
        want_dt = self.infer_dtypes(dtypes, attrs)
        got_dt = [A.dtype_name(r.type.element_type) for r in self.results]
        if want_dt != got_dt:
            raise VerifyException(f"{where}: result element type(s) {got_dt}, expected {want_dt}")

    def flops(self) -> int:
        """FLOPs of this op."""
        return int(self.count_flops(self.operand_shapes(), self.result_shapes(), self.attrs()))


def _accessor(key: str, spec: AttrSpec) -> property:
    def get(self):
        return self.attr_value(key)

    def put(self, value):
        self.attributes[key] = spec.encode(value)

    return property(get, put, doc=f"`{key}` ({spec.kind}{'' if spec.required else f', default {spec.default!r}'})")


def define_op(cls):
    """Declare `cls`'s IRDL attribute fields and traits from `ATTRS` / `TRAITS`, define the op,
    then give it a typed Python accessor per attribute."""
    custom = {key: cls.__dict__[key] for key in cls.ATTRS if isinstance(cls.__dict__.get(key), property)}
    for key, spec in cls.ATTRS.items():
        if not isinstance(spec, AttrSpec):
            raise TypeError(f"{cls.name}: attribute {key!r} must be declared with an AttrSpec, not {spec!r}")
        setattr(cls, key, (attr_def if spec.required else opt_attr_def)(spec.constraint))
    traits = list(cls.TRAITS)
    if "layout" in cls.ATTRS and not any(isinstance(t, LayoutSensitive) for t in traits):
        traits.append(LayoutSensitive())
    cls.traits = traits_def(*traits)
    op = irdl_op_definition(cls)
    for key, spec in cls.ATTRS.items():
        setattr(op, key, custom.get(key) or _accessor(key, spec))   # an op's own property wins
    return op


# Attributes any op may carry besides its own: notes the backend writes for people and tools
# (`group_info`: the layer group an op runs in, its slices and local memory, as TPU-MLIR's ginfo).
ANNOTATIONS = ("group_info",)


def make_attributes(cls, attrs: dict) -> dict[str, Attribute]:
    """Builtin attributes of `cls` from plain values, in declaration order (None = absent)."""
    unknown = set(attrs) - set(cls.ATTRS)
    if unknown:
        raise ValueError(f"{cls.name}: unknown attribute(s) {sorted(unknown)}")
    return {key: spec.encode(attrs[key]) for key, spec in cls.ATTRS.items()
            if key in attrs and attrs[key] is not None}

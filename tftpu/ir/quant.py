"""MLIR's quant dialect types, as the TPU dialect prints them: quantized element types that
carry their scale and zero point, so a `.tpu.mlir` reads like TPU-MLIR's listings and parses back.

    !quant.uniform<i8:f32, 0.0235:0>                 per tensor: storage:expressed, scale:zero_point
    !quant.uniform<i8:f32:0, {0.01:0,0.02:0}>        per axis (here axis 0), one scale per channel
    !quant.calibrated<f32<-3.5:4.25>>                a float tensor with its calibrated range

A quantized value is `real = scale * (stored - zero_point)`. Scales are printed with Python's
shortest round-trip form, so print -> parse gives the same float64 bits.

>>> t = uniform("i8", 0.5, 0)
>>> t.scales, t.zero_points, t.storage
((0.5,), (0,), 'i8')
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from xdsl.dialects.builtin import ArrayAttr, FloatData, IntAttr, StringAttr
from xdsl.ir import Dialect, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

__all__ = ["UniformQuantType", "CalibratedQuantType", "Quant", "uniform", "per_axis", "STORAGE",
           "is_quant", "qrange"]

# storage type -> (numpy dtype name, min, max)
STORAGE = {"i8": ("int8", -128, 127), "u8": ("uint8", 0, 255), "i16": ("int16", -32768, 32767),
           "i32": ("int32", -(1 << 31), (1 << 31) - 1)}
_EXPRESSED = ("f32", "f16", "bf16")


def _fmt(x: float) -> str:
    """A float literal MLIR and xDSL both read back to the same bits (always with a '.')."""
    text = repr(float(x))
    if "e" in text:
        mant, exp = text.split("e")
        return (mant if "." in mant else mant + ".0") + "e" + exp
    return text if "." in text else text + ".0"


def _parse_real(parser: AttrParser) -> float:
    value = parser.parse_number()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        parser.raise_error("expected a number")
    return float(value)


def _checked(parser: AttrParser, cls, params: tuple) -> tuple:
    """`params` if they make a valid `cls`, else a parse error at the type (so a bad scale or
    zero point in a file is reported like any other syntax error, naming file and line)."""
    try:
        cls(*params)
    except VerifyException as e:
        parser.raise_error(str(e))
    return params


@irdl_attr_definition
class UniformQuantType(ParametrizedAttribute, TypeAttribute):
    """`!quant.uniform<storage:expressed[:axis], scale:zp | {scale:zp,...}>`."""

    name = "quant.uniform"

    storage_type: StringAttr
    expressed_type: StringAttr
    axis: IntAttr                       # -1: per tensor
    scale_values: ArrayAttr[FloatData]
    zp_values: ArrayAttr[IntAttr]

    @property
    def storage(self) -> str:
        return self.storage_type.data

    @property
    def expressed(self) -> str:
        return self.expressed_type.data

    @property
    def quant_axis(self) -> int | None:
        """The channel axis of a per-axis type, None per tensor."""
        return None if self.axis.data < 0 else self.axis.data

    @property
    def scales(self) -> tuple[float, ...]:
        return tuple(f.data for f in self.scale_values.data)

    @property
    def zero_points(self) -> tuple[int, ...]:
        return tuple(z.data for z in self.zp_values.data)

    @property
    def scale(self) -> float:
        """The one scale of a per-tensor type."""
        if self.quant_axis is not None:
            raise ValueError(f"{self} is per-axis: it has no single scale")
        return self.scales[0]

    @property
    def zero_point(self) -> int:
        if self.quant_axis is not None:
            raise ValueError(f"{self} is per-axis: it has no single zero point")
        return self.zero_points[0]

    def verify(self) -> None:
        if self.storage not in STORAGE:
            raise VerifyException(f"quant.uniform: storage type {self.storage!r} is not one of {', '.join(STORAGE)}")
        if self.expressed not in _EXPRESSED:
            raise VerifyException(f"quant.uniform: expressed type {self.expressed!r} is not one of "
                                  f"{', '.join(_EXPRESSED)}")
        scales, zps = self.scales, self.zero_points
        if not scales or len(scales) != len(zps):
            raise VerifyException("quant.uniform: needs one zero point per scale")
        if self.quant_axis is None and len(scales) != 1:
            raise VerifyException("quant.uniform: a per-tensor type has one scale")
        if any(not (math.isfinite(s) and s > 0) for s in scales):
            raise VerifyException("quant.uniform: scales must be finite and positive")
        _, lo, hi = STORAGE[self.storage]
        if any(not lo <= z <= hi for z in zps):
            raise VerifyException(f"quant.uniform: zero points must lie in [{lo}, {hi}]")

    def print_parameters(self, printer: Printer) -> None:
        head = f"{self.storage}:{self.expressed}"
        if self.quant_axis is None:
            printer.print_string(f"<{head}, {_fmt(self.scale)}:{self.zero_point}>")
        else:
            pairs = ",".join(f"{_fmt(s)}:{z}" for s, z in zip(self.scales, self.zero_points))
            printer.print_string(f"<{head}:{self.quant_axis}, {{{pairs}}}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple:
        parser.parse_punctuation("<")
        storage = parser.parse_identifier("storage type")
        parser.parse_punctuation(":")
        expressed = parser.parse_identifier("expressed type")
        axis = -1
        if parser.parse_optional_punctuation(":") is not None:
            axis = parser.parse_integer(allow_boolean=False, allow_negative=False)
        parser.parse_punctuation(",")

        def pair() -> tuple[float, int]:
            s = _parse_real(parser)
            z = 0
            if parser.parse_optional_punctuation(":") is not None:
                z = parser.parse_integer(allow_boolean=False)
            return s, z

        if axis < 0:
            pairs = [pair()]
        else:
            pairs = parser.parse_comma_separated_list(parser.Delimiter.BRACES, pair, "per-axis scales")
        parser.parse_punctuation(">")
        return _checked(parser, cls, (StringAttr(storage), StringAttr(expressed), IntAttr(axis),
                                      ArrayAttr([FloatData(s) for s, _ in pairs]),
                                      ArrayAttr([IntAttr(z) for _, z in pairs])))


@irdl_attr_definition
class CalibratedQuantType(ParametrizedAttribute, TypeAttribute):
    """`!quant.calibrated<f32<min:max>>`: a float tensor with its calibrated range."""

    name = "quant.calibrated"

    expressed_type: StringAttr
    lo: FloatData
    hi: FloatData

    @property
    def expressed(self) -> str:
        return self.expressed_type.data

    def verify(self) -> None:
        if self.expressed not in _EXPRESSED:
            raise VerifyException(f"quant.calibrated: expressed type {self.expressed!r} is not a float type")
        if not (math.isfinite(self.lo.data) and math.isfinite(self.hi.data) and self.lo.data <= self.hi.data):
            raise VerifyException("quant.calibrated: needs a finite range min <= max")

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.expressed}<{_fmt(self.lo.data)}:{_fmt(self.hi.data)}>>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple:
        parser.parse_punctuation("<")
        expressed = parser.parse_identifier("expressed type")
        parser.parse_punctuation("<")
        lo = _parse_real(parser)
        parser.parse_punctuation(":")
        hi = _parse_real(parser)
        parser.parse_punctuation(">")
        parser.parse_punctuation(">")
        return _checked(parser, cls, (StringAttr(expressed), FloatData(lo), FloatData(hi)))


Quant = Dialect("quant", [], [UniformQuantType, CalibratedQuantType])


def uniform(storage: str, scale: float, zero_point: int = 0, expressed: str = "f32") -> UniformQuantType:
    """A per-tensor quantized element type."""
    t = UniformQuantType(StringAttr(storage), StringAttr(expressed), IntAttr(-1),
                         ArrayAttr([FloatData(float(scale))]), ArrayAttr([IntAttr(int(zero_point))]))
    t.verify()
    return t


def per_axis(storage: str, axis: int, scales, zero_points=None, expressed: str = "f32") -> UniformQuantType:
    """A per-axis (per-channel) quantized element type."""
    scales = tuple(float(s) for s in np.asarray(scales, np.float64).ravel())
    zps = (0,) * len(scales) if zero_points is None else tuple(int(z) for z in np.asarray(zero_points).ravel())
    return _per_axis(storage, int(axis), scales, zps, expressed)


@lru_cache(maxsize=1 << 12)
def _per_axis(storage: str, axis: int, scales: tuple, zps: tuple, expressed: str) -> UniformQuantType:
    """Shared, as types are immutable: the precision search lowers the same convs again and again."""
    t = UniformQuantType(StringAttr(storage), StringAttr(expressed), IntAttr(axis),
                         ArrayAttr([FloatData(s) for s in scales]), ArrayAttr([IntAttr(z) for z in zps]))
    t.verify()
    return t


def is_quant(t) -> bool:
    """Whether an element type is a quantized (integer-stored) type."""
    return isinstance(t, UniformQuantType)


def qrange(storage: str) -> tuple[int, int]:
    """The integer range of a storage type."""
    return STORAGE[storage][1], STORAGE[storage][2]

"""What a TPU kernel knows of each tensor beyond its array: its element type and, when
quantized, its scales and zero points (from the `!quant.uniform` type)."""

from __future__ import annotations

import dataclasses

import numpy as np
from xdsl.dialects.builtin import TensorType

from tftpu.ir import attrs as A
from tftpu.ir import quant


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A tensor's element type: `dtype` ("f32", "i8", ...), and for quantized tensors the
    scales and zero points (one each per tensor, or per channel of `axis`)."""

    dtype: str
    scales: tuple = ()
    zero_points: tuple = ()
    axis: int | None = None

    @property
    def quantized(self) -> bool:
        return bool(self.scales)

    @property
    def scale(self) -> float:
        return self.scales[0]

    @property
    def zp(self) -> int:
        """The zero point of a per-tensor type."""
        return self.zero_points[0]

    @property
    def qmin(self) -> int:
        return quant.qrange(self.dtype)[0]

    @property
    def qmax(self) -> int:
        return quant.qrange(self.dtype)[1]

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """float32 values of a quantized array (per-axis types broadcast along `axis`)."""
        if not self.quantized:
            return q
        scales = np.asarray(self.scales, np.float32)
        zps = np.asarray(self.zero_points, np.int32)
        if self.axis is not None:
            shape = [1] * q.ndim
            shape[self.axis] = -1
            scales, zps = scales.reshape(shape), zps.reshape(shape)
        return (q.astype(np.int32) - zps).astype(np.float32) * scales


def info_of(t) -> TensorInfo | None:
    """TensorInfo of a tensor type (None for `none`)."""
    if not isinstance(t, TensorType):
        return None
    et = t.element_type
    if quant.is_quant(et):
        return TensorInfo(et.storage, et.scales, et.zero_points, et.quant_axis)
    return TensorInfo(A.dtype_name(et))


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """Per operand and per result, its TensorInfo (None for an absent operand); `memo` keeps
    what a kernel prepares once for its op (packed weights, requantization tables)."""

    ins: tuple
    outs: tuple
    memo: dict = dataclasses.field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def of(cls, op) -> "OpInfo":
        return cls(tuple(info_of(v.type) for v in op.operands), tuple(info_of(r.type) for r in op.results))

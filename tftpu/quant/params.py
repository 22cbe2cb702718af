"""INT8 quantization parameters: activation scales and zero points from a calibration table,
per-channel weights, INT32 biases and the integer requantization of each op.

Symmetric activations (TPU-MLIR's default): `scale = threshold / 127`, zero point 0.
Asymmetric (TFLite's scheme): the calibrated [min, max], widened to hold 0, over 255 steps,
`zero_point = round(-128 - min / scale)`. Weights are symmetric per output channel,
`scale = max|w| / 127`; a bias is INT32 at `scale_in * scale_w`. Every rounding is
`tftpu.rounding`'s.

>>> act = activation(4.0, -1.0, 3.0)
>>> round(act.scale, 6), act.zero_point
(0.031496, 0)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tftpu import rounding
from tftpu.ir.quant import STORAGE
from tftpu.errors import UsageError

__all__ = ["QParams", "activation", "weights_per_channel", "deconv_weights", "weights_per_tensor", "bias", "requant",
           "add_multipliers", "ADD_MULTIPLIER_BITS", "QMAX16", "wide_bias_fits"]

QMAX = 127
# 16-bit weights' largest level: 127 * 256 + 127, so both byte planes of every level are signed
# INT8 (`tftpu.interp.tpu.int8_kernels.weight_planes`)
QMAX16 = 32639
ADD_MULTIPLIER_BITS = 15     # an Add's input multipliers fit int16, as TPU-MLIR's


@dataclasses.dataclass(frozen=True)
class QParams:
    """One tensor's INT8 quantization: real = scale * (q - zero_point)."""

    scale: float
    zero_point: int = 0
    storage: str = "i8"

    def quantize(self, x) -> np.ndarray:
        """Float values to this grid (round half away from zero, saturate to the storage type)."""
        return rounding.quantize(x, self.scale, self.zero_point, np.dtype(STORAGE[self.storage][0]).type)

    def dequantize(self, q) -> np.ndarray:
        return (self.scale * (np.asarray(q, np.float64) - self.zero_point)).astype(np.float32)


def _positive(v: float, fallback: float) -> float:
    return v if math.isfinite(v) and v > 0 else fallback


# asymmetric="auto" gives a tensor a zero point where that makes its step at most this share of
# the symmetric one (a one-sided range: ReLU, sigmoid, SiLU and HardSwish outputs get ~2x finer)
ONE_SIDED_STEP = 0.75


def one_sided(threshold: float, lo: float, hi: float) -> bool:
    """Whether a zero point buys a tensor a clearly finer grid than symmetric INT8."""
    span = max(float(hi), 0.0) - min(float(lo), 0.0)
    return math.isfinite(span) and threshold > 0 and span / 255.0 <= ONE_SIDED_STEP * threshold / QMAX


def activation(threshold: float, lo: float, hi: float, asymmetric: bool | str = False) -> QParams:
    """The INT8 grid of one activation from its calibration entry (threshold, min, max).
    `asymmetric`: False, True, or "auto" (a zero point only where the range is `one_sided`).
    A tensor that was always zero gets scale 1/127 (any scale represents it exactly)."""
    if asymmetric == "auto":
        asymmetric = one_sided(threshold, lo, hi)
    if not asymmetric:
        return QParams(_positive(threshold / QMAX, 1.0 / QMAX))
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = _positive((hi - lo) / 255.0, 1.0 / 255.0)
    zp = int(np.clip(rounding.round_half_away_scalar(-128.0 - lo / scale), -128, 127))
    return QParams(scale, zp)


def wide_bias_fits(bias, in_scale, scales) -> bool:
    """Whether int32 holds `bias` at the accumulator scale of 16-bit weights (the input's scale
    times their per-channel `scales`): where it does not, the conv keeps 8-bit weights."""
    acc = np.asarray(in_scale, np.float64) * np.asarray(scales, np.float64)
    return not np.any(np.abs(np.asarray(bias, np.float64).ravel()) / acc >= 2.0 ** 31)


def weights_per_channel(w: np.ndarray, axis: int, wide: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weights, float64 scale per channel of `axis`): symmetric, max|w| / 127 each
    (an all-zero channel gets scale 1). `wide`: int16 weights, max|w| / `QMAX16` each."""
    w = np.asarray(w, np.float64)
    axis %= w.ndim
    qmax = QMAX16 if wide else QMAX
    reduce = tuple(a for a in range(w.ndim) if a != axis)
    amax = np.abs(w).max(axis=reduce) if w.size else np.zeros(w.shape[axis])
    scales = np.where(amax > 0, amax / qmax, 1.0)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(rounding.round_half_away(w / scales.reshape(shape)), -qmax, qmax)
    return q.astype(np.int16 if wide else np.int8), scales


def deconv_weights(w: np.ndarray, group: int) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """(int8 weights, quantized axis, that axis's scales, scale per output channel) of a Deconv
    filter [I, O/g, *k]. Output channel `g * O/g + j` reads the filter's column j of group g's
    rows, so one scale per output channel is per-axis along axis 1 without groups, along axis 0
    (constant within a group) with one output channel per group, and otherwise per column j,
    shared by the groups."""
    w = np.asarray(w, np.float64)
    cg, og = w.shape[0] // group, w.shape[1]
    if group > 1 and og == 1:
        amax = np.abs(w.reshape(group, -1)).max(axis=1)
        per_group = np.where(amax > 0, amax / QMAX, 1.0)
        scales = np.repeat(per_group, cg)
        shape = (-1,) + (1,) * (w.ndim - 1)
        q = np.clip(rounding.round_half_away(w / scales.reshape(shape)), -QMAX, QMAX).astype(np.int8)
        return q, 0, scales, per_group
    q, scales = weights_per_channel(w, 1)
    return q, 1, scales, np.tile(scales, group)


def weights_per_tensor(w: np.ndarray) -> tuple[np.ndarray, float]:
    """(int8 weights, scale): one symmetric scale for the whole tensor."""
    w = np.asarray(w, np.float64)
    amax = float(np.abs(w).max()) if w.size else 0.0
    scale = amax / QMAX if amax > 0 else 1.0
    return np.clip(rounding.round_half_away(w / scale), -QMAX, QMAX).astype(np.int8), scale


def bias(b: np.ndarray, scales) -> np.ndarray:
    """An INT32 bias at `scales` (per channel: scale_in * scale_w), saturated."""
    q = rounding.round_half_away(np.asarray(b, np.float64).ravel() / np.asarray(scales, np.float64))
    return np.clip(q, rounding.INT32_MIN, rounding.INT32_MAX).astype(np.int32)


def requant(real_scales) -> tuple[list[int], list[int]]:
    """(multipliers, rshifts) of real requantization scales (TFLite's QuantizeMultiplier;
    rshift = -shift). A scale too large for the integer path is a UsageError naming it."""
    try:
        ms, shifts = rounding.quantize_multipliers(real_scales)
    except UsageError as e:
        raise UsageError(f"cannot requantize in INT8: {e}") from None
    return [int(m) for m in ms], [int(-s) for s in shifts]


def add_multipliers(ratios) -> tuple[list[int], int]:
    """Integer multipliers (< 2**15) and one right shift with `m_i / 2**rshift ~= ratio_i`,
    the largest multiplier as large as fits (TPU-MLIR's INT8 Add)."""
    ratios = [float(r) for r in ratios]
    top = max(abs(r) for r in ratios)
    if top == 0:
        return [0] * len(ratios), 0
    # the largest shift that keeps every multiplier under 2**15, at most 31
    rshift = min(31, ADD_MULTIPLIER_BITS - 1 - math.frexp(top)[1] + 1)
    while rshift > 0 and max(abs(rounding.round_half_away_scalar(r * 2 ** rshift)) for r in ratios) >= 1 << ADD_MULTIPLIER_BITS:
        rshift -= 1
    if rshift < 0:
        raise UsageError(f"cannot requantize in INT8: input/output scale ratio {top:g} is too large")
    return [rounding.round_half_away_scalar(r * 2 ** rshift) for r in ratios], rshift

"""The rounding rules of integer inference, in one place, each exact and named for the rule it
matches (the TPU lowering and its integer kernels will use only these).

- Requantization: a real scale becomes an int32 multiplier and a shift (TFLite's
  `QuantizeMultiplier`); an int32 accumulator is scaled with gemmlowp's
  `SaturatingRoundingDoublingHighMul` then `RoundingDivideByPOT` (TFLite's
  `MultiplyByQuantizedMultiplier`): the high multiply rounds ties up (toward +inf: -3.5 -> -3),
  the shift rounds ties away from zero (-1.5 -> -2), exactly as gemmlowp does.
- Float to int: `round_half_away` (TFLite's `Quantize`, C's `round`) and `round_half_even`
  (numpy's `rint`, IEEE's default), then saturation to the integer type.
- Float to BF16 / F16: round to nearest, ties to even (ml_dtypes, as the hardware does).
- Quantize (`tpu.Cast` float -> INT8): `x / scale` in float64, round half away from zero (TFLite's
  `Quantize`), add the zero point, saturate. Dequantize (INT8 -> float): `(q - zp) * scale` in
  float32 (TPU-MLIR's and TFLite's `Dequantize`), then rounded to the float type of the mode.
- INT8 Add/Sub (TPU-MLIR's BM1684X rule): `sum_i m_i * (x_i - zp_i)` with int16 multipliers,
  one `rounding_divide_by_pot` (ties away from zero), plus the output zero point, saturated.

>>> m, s = quantize_multiplier(0.5)
>>> [int(v) for v in multiply_by_quantized_multiplier(np.array([7, -7], np.int32), m, s)]   # ties up
[4, -3]
"""

from __future__ import annotations

import math

import numpy as np

from tftpu.errors import UsageError

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def quantize_multiplier(real: float) -> tuple[int, int]:
    """(multiplier, shift) with `real ~= multiplier * 2**(shift - 31)`, multiplier in
    [2**30, 2**31) (0 for a zero scale): TFLite's `QuantizeMultiplier`."""
    if not math.isfinite(real) or real < 0:
        raise UsageError(f"requantization scale {real!r}: must be finite and >= 0")
    if real == 0.0:
        return 0, 0
    frac, shift = math.frexp(real)                       # real = frac * 2**shift, frac in [0.5, 1)
    q = round_half_away_scalar(frac * (1 << 31))
    if q == 1 << 31:
        q //= 2
        shift += 1
    if shift < -31:                                     # too small to represent: it scales to zero
        return 0, 0
    if shift > 30:
        raise UsageError(f"requantization scale {real!r}: too large (more than 2**30)")
    return int(q), int(shift)


def quantize_multipliers(reals) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_multiplier` of each of `reals` at once: (multipliers, shifts) as int64 arrays,
    the same integers (a lowering asks for one per output channel of every conv)."""
    reals = np.asarray(reals, np.float64).ravel()
    invalid = ~np.isfinite(reals) | (reals < 0)
    frac, shift = np.frexp(np.where(invalid, 0.0, reals))
    a = frac * float(1 << 31)                           # exact: frac has 53 bits
    q = np.floor(a)
    q = (q + (a - q >= 0.5)).astype(np.int64)
    shift = shift.astype(np.int64)
    full = q == 1 << 31
    q = np.where(full, q // 2, q)
    shift = shift + full
    bad = invalid | (shift > 30)
    if bad.any():                                       # the scalar form says what is wrong with the first
        quantize_multiplier(float(reals[np.argmax(bad)]))
    gone = (reals == 0.0) | (shift < -31)
    return np.where(gone, 0, q), np.where(gone, 0, shift)


def round_half_away_scalar(x: float) -> int:
    """Round half away from zero (C's `round`)."""
    a = abs(x)
    r = math.floor(a)
    r += a - r >= 0.5                     # exact; floor(a + 0.5) rounds 0.49999999999999994 up
    return int(r) * (1 if x >= 0 else -1)


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul: a * b / 2**31 rounded to nearest, ties up
    (toward +inf), saturated to int32 (only INT32_MIN * INT32_MIN overflows). `b` may be an
    array broadcasting against `a` (one multiplier per channel)."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    ab = a * b
    nudge = np.where(ab >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    total = ab + nudge
    # C++ integer division truncates toward zero
    q = np.where(total >= 0, total >> 31, -((-total) >> 31))
    overflow = (a == INT32_MIN) & (b == INT32_MIN)
    return np.where(overflow, INT32_MAX, q).astype(np.int32)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT: x / 2**exponent, rounded half away from zero (`exponent`
    may be an array broadcasting against `x`): `(x + 2**(e-1) - [x < 0]) >> e` for e > 0,
    which equals gemmlowp's mask-and-threshold form (tested against it)."""
    exponent = np.asarray(exponent, np.int64)
    if exponent.size and (exponent.min() < 0 or exponent.max() > 31):
        raise ValueError(f"exponent {exponent.tolist()} outside 0..31")
    t = np.array(x, np.int64)
    if exponent.any():
        half = (np.int64(1) << exponent) >> 1
        t += half
        t -= (t < half) & (exponent > 0)                # t < half after the add <=> x < 0
        t >>= exponent
    return t.astype(np.int32)


def multiply_by_quantized_multiplier(x, multiplier, shift) -> np.ndarray:
    """int32 `x` scaled by `multiplier * 2**(shift - 31)`, as TFLite's reference kernels do:
    a left shift for a positive `shift`, the doubling high multiply, then a rounding right
    shift for a negative one. Exact integer arithmetic, int32 result. `multiplier` and `shift`
    may be arrays broadcasting against `x` (per channel).

    Computed in a few int64 passes with two identities (proved in the module tests against the
    definitions above): for a non-overflowing product, the high multiply's truncating division
    of `a*b + nudge` equals the floor `(a*b + 2**30) >> 31`, and the rounding shift (ties away
    from zero) equals `(t + 2**(r-1) - [t < 0]) >> r` for r > 0."""
    x = np.asarray(x, np.int64)
    multiplier = np.asarray(multiplier, np.int64)
    shift = np.asarray(shift, np.int64)
    if (multiplier == INT32_MIN).any():                 # the one product that saturates
        left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
        scaled = np.clip(x * (np.int64(1) << left), INT32_MIN, INT32_MAX)
        return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(scaled, multiplier), right)
    right = np.maximum(-shift, 0)
    if right.size and right.max() > 31:
        raise ValueError(f"exponent {right.tolist()} outside 0..31")
    if (shift > 0).any():
        t = np.clip(x << np.maximum(shift, 0), INT32_MIN, INT32_MAX)
    else:
        t = np.clip(x, INT32_MIN, INT32_MAX)
    t = t * multiplier
    t += np.int64(1 << 30)
    t >>= 31
    if right.any():
        half = (np.int64(1) << right) >> 1
        t += half
        t -= (t < half) & (right > 0)                   # t < half after the add <=> t was negative
        t >>= right
    return t.astype(np.int32)


def requantize(acc, multiplier, shift, zero_point: int = 0, qmin: int = -128, qmax: int = 127) -> np.ndarray:
    """An int32 accumulator to the output's integer type: scale, add the zero point, saturate."""
    y = multiply_by_quantized_multiplier(acc, multiplier, shift).astype(np.int64) + zero_point
    return np.clip(y, qmin, qmax)


def round_half_away(x) -> np.ndarray:
    """Round half away from zero, element-wise (TFLite's `Quantize` rounding)."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    r = np.floor(a)
    r += (a - r) >= 0.5                   # exact, as C's round (floor(a + 0.5) is not, below 0.5)
    return np.copysign(r, x)


def round_half_even(x) -> np.ndarray:
    """Round half to even, element-wise (IEEE's default; numpy's `rint`)."""
    return np.rint(np.asarray(x, np.float64))


def quantize(x, scale: float, zero_point: int = 0, dtype=np.int8, rounding: str = "half_away") -> np.ndarray:
    """Float values to integers: round(x / scale) + zero_point, saturated to `dtype`."""
    info = np.iinfo(dtype)
    q = {"half_away": round_half_away, "half_even": round_half_even}[rounding](np.asarray(x, np.float64) / scale)
    return np.clip(q + zero_point, info.min, info.max).astype(dtype)


def dequantize(q, scale: float, zero_point: int = 0, dtype="f32") -> np.ndarray:
    """INT8 values back to float: `(q - zp) * scale` in float32, then rounded to `dtype`
    ("f32", "f16" or "bf16")."""
    y = (np.asarray(q, np.int32) - np.int32(zero_point)).astype(np.float32) * np.float32(scale)
    return to_float(y, dtype)


def to_float(x, dtype: str) -> np.ndarray:
    """Float values rounded to the float type `dtype` of a mode: "f32", "f16" or "bf16"."""
    if dtype == "f32":
        return np.asarray(x, np.float32)
    if dtype == "f16":
        return to_f16(x)
    if dtype == "bf16":
        return to_bf16(x)
    raise ValueError(f"not a float type: {dtype!r}")


def to_bf16(x) -> np.ndarray:
    """Float32 values rounded to bfloat16 (nearest, ties to even)."""
    import ml_dtypes

    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


def to_f16(x) -> np.ndarray:
    """Float32 values rounded to float16 (nearest, ties to even; overflow to inf as IEEE)."""
    return np.asarray(x, np.float32).astype(np.float16)

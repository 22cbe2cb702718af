"""Requantization of INT32 accumulators in a few in-place int64 numpy passes: the same integers
as `tftpu.rounding.multiply_by_quantized_multiplier` + zero point + clamp (TFLite's
MultiplyByQuantizedMultiplier), without its temporaries.

For an int32 `t` (saturated), multiplier `0 <= m < 2**31` and right shift `0 <= r <= 31`,
`P = t * m` fits int64 (|P| < 2**62) and, with `h = 2**(r-1)` (0 for r = 0):

1. the doubling high multiply is `y = (P + 2**30) >> 31` (floor; no saturation: m != INT32_MIN);
2. the rounding shift (ties away from zero) is `(y + h - [y < 0]) >> r` for r > 0, where
   `[y < 0]` is `-(y >> 63)`;
3. where the clamp's lower bound (less the zero point) is >= 0 (a fused ReLU), steps 1-2 are one
   shift: `(P + 2**30 + h * 2**31) >> (31 + r)`. For y >= 0 it is steps 1-2 (floors compose);
   for y < 0 both are <= 0, so both clamp to the same bound.

tests/interp/test_requant.py proves each against Python-integer definitions at the extremes.
"""

from __future__ import annotations

import numpy as np

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _shaped(v: np.ndarray, ndim: int, axis: int):
    """One value: a numpy int64 scalar; per channel: shaped to broadcast along `axis`."""
    if v.size == 1 or (v == v.flat[0]).all():
        return np.int64(v.flat[0])
    shape = [1] * ndim
    shape[axis] = -1
    return np.ascontiguousarray(v.reshape(shape))


class Requant:
    """The constants of one requantization (multiplier / rshift per channel of `axis` or one,
    output zero point and clamp [lo, hi]), shaped for `ndim`-D accumulators."""

    def __init__(self, multiplier, rshift, ndim: int, axis: int, lo: int, hi: int, zp: int, dtype):
        m = np.asarray(multiplier, np.int64).reshape(-1)
        r = np.asarray(rshift, np.int64).reshape(-1)
        self.dtype = np.dtype(dtype)
        self.zp, self.lo, self.hi = int(zp), int(lo), int(hi)
        self.m = _shaped(m, ndim, axis)
        self.combined = lo - zp >= 0
        half = np.where(r > 0, np.left_shift(np.int64(1), np.maximum(r - 1, 0)), 0)
        if self.combined:
            self.add = _shaped((1 << 30) + (half << 31), ndim, axis)
            self.shift = _shaped(r + 31, ndim, axis)
        else:
            self.half = _shaped(half, ndim, axis)
            self.r = _shaped(r, ndim, axis)
            self.any_r = bool((r > 0).any())
            # channels with r = 0 take no sign correction
            self.neg_mask = None if (r > 0).all() or not self.any_r else _shaped(np.where(r > 0, -1, 0), ndim, axis)

    @staticmethod
    def applies(multiplier, rshift) -> bool:
        """Whether the fast path covers these parameters (multipliers in [0, 2**31), right
        shifts in 0..31); others take `tftpu.rounding`."""
        m = np.asarray(multiplier, np.int64)
        r = np.asarray(rshift, np.int64)
        return bool(m.size and r.size and m.min() >= 0 and m.max() <= INT32_MAX and r.min() >= 0 and r.max() <= 31)

    def __call__(self, t: np.ndarray, saturated: bool = False) -> np.ndarray:
        """`t` (int64, overwritten): accumulators; `saturated`: already within int32."""
        if not saturated:
            np.clip(t, INT32_MIN, INT32_MAX, out=t)
        t *= self.m
        if self.combined:
            t += self.add
            t >>= self.shift
        else:
            t += np.int64(1 << 30)
            t >>= 31
            if self.any_r:
                neg = t >> 63                       # -1 where y < 0
                if self.neg_mask is not None:
                    neg &= self.neg_mask
                t += neg
                t += self.half
                t >>= self.r
        return clamp_into(t, self.lo, self.hi, self.zp, self.dtype)


def clamp_into(t: np.ndarray, lo: int, hi: int, zp: int, dtype) -> np.ndarray:
    """`clip(t + zp, lo, hi)` as `dtype` (`t` is overwritten): clipped before the zero point is
    added, in the output type where it fits there (exact: the sum lies in [lo, hi])."""
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    if info.min <= zp <= info.max and info.min <= lo <= hi <= info.max:
        y = np.clip(t, lo - zp, hi - zp, out=t).astype(dtype)
        if zp:
            y += dtype.type(zp)                     # wraps in the type, so exact
        return y
    t += zp
    return np.clip(t, lo, hi, out=t).astype(dtype)


_PLANS: dict[tuple, tuple] = {}


def plan_for(attrs: dict, key: tuple, make) -> Requant:
    """The Requant of one op's `attrs` (kept while the attrs dict lives in a plan), by `key`."""
    k = (id(attrs), key)
    hit = _PLANS.get(k)
    if hit is not None and hit[0] is attrs and hit[1] is attrs.get("multiplier") and hit[2] is attrs.get("rshift"):
        return hit[3]
    if len(_PLANS) > 4096:
        _PLANS.clear()
    value = make()
    _PLANS[k] = (attrs, attrs.get("multiplier"), attrs.get("rshift"), value)
    return value

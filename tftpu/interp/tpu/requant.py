"""Requantization of INT32 accumulators in a few in-place numpy passes (int64, or float64 where
provably exact): the same integers as `tftpu.rounding.multiply_by_quantized_multiplier` + zero
point + clamp (TFLite's MultiplyByQuantizedMultiplier), without its temporaries.

For an int32 `t` (saturated), multiplier `0 <= m < 2**31` and right shift `0 <= r <= 31`,
`P = t * m` fits int64 (|P| < 2**62) and, with `h = 2**(r-1)` (0 for r = 0):

1. the doubling high multiply is `y = (P + 2**30) >> 31` (floor; no saturation: m != INT32_MIN);
2. the rounding shift (ties away from zero) is `(y + h - [y < 0]) >> r` for r > 0, where
   `[y < 0]` is `-(y >> 63)`;
3. where the clamp's lower bound (less the zero point) is >= 0 (a fused ReLU), steps 1-2 are one
   shift: `(P + 2**30 + h * 2**31) >> (31 + r)`. For y >= 0 it is steps 1-2 (floors compose);
   for y < 0 both are <= 0, so both clamp to the same bound.
4. that is `floor(t * a + c)` with `a = m / 2**(31+r)`, `c = (2**30 + h * 2**31) / 2**(31+r)`,
   and float64 computes it exactly for every `t` whose result is not clamped when those `t`
   keep `t * m` below 2**53 and r <= 13; for the other `t`, the float64 product and sum are
   monotone in `t`, so they land beyond the clamp's bounds as the exact values do (a < 1, so
   the last unclamped `t` on either side is exact). Clamping to [low, high] (low >= 0) first
   makes the float -> int truncation the floor.
5. without the ReLU, steps 1-2 are `floor(u + c)` for `u = t * a >= -2**-(r+1)` and
   `ceil(u - c + e)` below (ties away from zero; `e = 2**-(31+r)`, the grid of u), which both
   give 0 in between, so the result is `trunc(u + e/2 + copysign(c - e/2, u))`; exact in
   float64 under the conditions of step 4 with r <= 12 (the sums sit on a grid of e/2) and
   monotone in t (the copysign jumps up at 0).

tests/interp/test_requant.py checks each against Python-integer definitions at the extremes.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from tftpu.utils import threads

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _shaped(v: np.ndarray, ndim: int, axis: int):
    """One value: a numpy scalar of its type; per channel: shaped to broadcast along `axis`."""
    if v.size == 1 or (v == v.flat[0]).all():
        return v.flat[0]
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
        self.axis = axis if m.size > 1 or r.size > 1 else None
        self.m = _shaped(m, ndim, axis)
        # a negative rshift is a left shift of the saturated accumulator, saturated again (a
        # requantization scale above 1: a 16-bit link's fine grid), before the high multiply
        self.left = _shaped(np.maximum(-r, 0), ndim, axis) if (r < 0).any() else None
        r = np.maximum(r, 0)
        self.combined = lo - zp >= 0
        half = np.where(r > 0, np.left_shift(np.int64(1), np.maximum(r - 1, 0)), 0)
        self.fa = None
        exact = self.left is None          # (the float forms are proved for right shifts only)
        if self.combined:
            self.add = _shaped((1 << 30) + (half << 31), ndim, axis)
            self.shift = _shaped(r + 31, ndim, axis)
            if exact and _float_exact(m, r, lo - zp, hi - zp) and hi - zp <= _range(self.dtype)[1]:
                self.fa = _shaped(m.astype(np.float64) * np.exp2(-(r + 31.0)), ndim, axis)
                self.fc = _shaped(((1 << 30) + (half << 31)).astype(np.float64) * np.exp2(-(r + 31.0)), ndim, axis)
        else:
            if exact and _float_exact(m, r, lo - zp, hi - zp, signed=True) and \
                    _range(self.dtype)[0] <= lo - zp <= hi - zp <= _range(self.dtype)[1]:
                eps = np.exp2(-(r + 32.0))                   # half the grid of t * a
                self.fa = _shaped(m.astype(np.float64) * np.exp2(-(r + 31.0)), ndim, axis)
                self.fh = _shaped(eps, ndim, axis)
                self.fk = _shaped(((1 << 30) + (half << 31)).astype(np.float64) * np.exp2(-(r + 31.0)) - eps, ndim, axis)
            self.half = _shaped(half, ndim, axis)
            self.r = _shaped(r, ndim, axis)
            self.any_r = bool((r > 0).any())
            # channels with r = 0 take no sign correction
            self.neg_mask = None if (r > 0).all() or not self.any_r else _shaped(np.where(r > 0, -1, 0), ndim, axis)

    @staticmethod
    def applies(multiplier, rshift) -> bool:
        """Whether the fast path covers these parameters (multipliers in [0, 2**31), right
        shifts in -31..31, a negative one shifting left); others take `tftpu.rounding`."""
        m = np.asarray(multiplier, np.int64)
        r = np.asarray(rshift, np.int64)
        return bool(m.size and r.size and m.min() >= 0 and m.max() <= INT32_MAX and r.min() >= -31 and r.max() <= 31)

    def __call__(self, acc: np.ndarray, saturated: bool = False) -> np.ndarray:
        """Accumulators `acc` (any integer type, or floats holding integers; an int64 `acc` is
        overwritten) to the output type; `saturated`: already within int32. Large tensors are
        cut into slabs run on threads (numpy releases the GIL)."""
        y = np.empty(acc.shape, self.dtype)
        saturated = saturated and acc.ndim > 0          # (the fast form writes into views: a 0-d slab has none)
        in_slabs(acc.shape, self.axis, lambda sl: self._slab(acc[sl], y[sl], saturated))
        return y

    def _slab(self, a: np.ndarray, out: np.ndarray, saturated: bool) -> None:
        if self.fa is not None and saturated:      # steps 4-5: float64, clamped before truncating
            v = np.multiply(a, self.fa, dtype=np.float64)
            if self.combined:
                v += self.fc
            else:
                k = np.copysign(self.fk, v)
                v += self.fh
                v += k
            np.clip(v, self.lo - self.zp, self.hi - self.zp, out=v)
            np.copyto(out, v, casting="unsafe")    # truncation (the floor where v >= 0)
            if self.zp:
                out += out.dtype.type(self.zp)
            return
        t = a if a.dtype == np.int64 else a.astype(np.int64)
        if not saturated:
            np.clip(t, INT32_MIN, INT32_MAX, out=t)
        if self.left is not None:
            t <<= self.left
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
        clamp_into(t, self.lo, self.hi, self.zp, out)


def clamp_into(t: np.ndarray, lo: int, hi: int, zp: int, out) -> np.ndarray:
    """`clip(t + zp, lo, hi)` into `out` (an array, or a dtype for a new one; `t` is
    overwritten): clipped before the zero point is added, which is added in the output type
    where it fits there (exact: the sum lies in [lo, hi])."""
    if not isinstance(out, np.ndarray):
        out = np.empty(t.shape, out)
    tmin, tmax = _range(out.dtype)
    if tmin <= zp <= tmax and tmin <= lo <= hi <= tmax:
        np.clip(t, lo - zp, hi - zp, out=t)
        np.copyto(out, t, casting="unsafe")
        if zp:
            out += out.dtype.type(zp)               # wraps in the type, so exact
        return out
    t += zp
    np.copyto(out, np.clip(t, lo, hi, out=t), casting="unsafe")
    return out


@functools.lru_cache(maxsize=None)
def _range(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def sum_bound(w: np.ndarray, bias=None, span: int = 255) -> int:
    """The largest |sum| + |bias| of any output channel (axis 0 of `w`) of a conv or matmul by
    INT8 data: with |x - zp| <= `span` (255; 32768 for a 16-bit link) it is span * sum|w| + |bias|,
    at its largest. Below 2**31 int32 arithmetic is exact (nothing saturates); below 2**24, float32's is."""
    return span * int(np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).sum(axis=1).max(initial=0)) + \
        bias_bound(bias)


def bias_bound(bias) -> int:
    """max |bias| (0 for none): `sum_bound`'s bias term, for callers that keep the weights' term."""
    return 0 if bias is None else int(np.abs(np.asarray(bias, np.int64)).max(initial=0))


# ---------------------------------------------------------------- slabs on threads

SLAB_MIN = 1 << 19          # elements below which a tensor runs in one piece (threads cost more)
_POOL = None


def pool():
    """The worker threads that run slabs (made on first use)."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor
        _POOL = ThreadPoolExecutor(max_workers=threads.pool_size(), thread_name_prefix="tftpu-int8")
    return _POOL


def in_slabs(shape: tuple, axis, fn) -> None:
    """Call `fn(slices)` on slabs covering an array of `shape`, cut along its longest axis
    other than `axis` (where per-channel constants broadcast), on up to 4 threads."""
    n = threads.pool_size()
    size = math.prod(shape)
    cut = max((d for d in range(len(shape)) if d != axis), key=lambda d: shape[d], default=None)
    if n == 1 or size < SLAB_MIN or cut is None or shape[cut] < 2:
        fn(Ellipsis)
        return
    n = min(n, shape[cut])
    edges = [shape[cut] * i // n for i in range(n + 1)]
    slabs = [tuple([slice(None)] * cut + [slice(edges[i], edges[i + 1])]) for i in range(n)]
    futures = [pool().submit(fn, sl) for sl in slabs[1:]]
    fn(slabs[0])
    for f in futures:
        f.result()


def _float_exact(m: np.ndarray, r: np.ndarray, low: int, high: int, signed: bool = False) -> bool:
    """Whether step 4 (`signed`: step 5) holds for every channel: `t * m` below 2**53 for every
    `t` whose result is not clamped, and r <= 13 (12) so that the sums, multiples of
    2**-(31+r) (2**-(32+r)) below 2**9, fit 53 bits."""
    if high >= 1 << 8 or low <= -(1 << 8) or (low < 0 and not signed) or r.max() > (12 if signed else 13):
        return False
    bound = max(abs(low), abs(high)) + 2
    for mm, rr in zip(np.broadcast_to(m, np.broadcast(m, r).shape).tolist(),
                      np.broadcast_to(r, np.broadcast(m, r).shape).tolist()):
        if mm == 0:
            continue
        # |z| <= bound - 1 needs |y| <= bound * 2**r, so |t * m| <= (bound * 2**r + 1) * 2**31
        t = (((bound << rr) + 1) << 31) // mm + 2
        if t * mm >= 1 << 53:
            return False
    return True


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

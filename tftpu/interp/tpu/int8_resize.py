"""INT8 `tpu.Resize`: nearest moves int8 bytes (the TOP kernel's picks); linear interpolates in
exact integers on the input's grid, by this rule (TFLite's quantized ResizeBilinear, made exact):

- per spatial axis (input length L, output length N), each output index o has the exact source
  coordinate c of the coordinate mode (a rational: `half_pixel` (2o+1)L/(2N) - 1/2, ...),
  clamped to [0, L-1] and rounded to `FRACTION_BITS` = 10 fraction bits, half up:
  C = floor(c * 2**10 + 1/2);
- i0 = C >> 10, i1 = min(i0 + 1, L - 1), weights w1 = C mod 2**10 and w0 = 2**10 - w1;
- the sum over the 2**n corners of (x - zp) times the product of their weights is exact (int64,
  at most 2**16 * 2**30 on a 16-bit link), then divided by 2**(10 n), rounded half away from zero, plus zp.

The weights of every axis sum to 2**10, so the result is a convex combination of input levels:
it keeps the input's grid and never saturates.
"""

from __future__ import annotations

import numpy as np

from tftpu.interp.kernels import KERNELS
from tftpu.interp.kernels._registry import spatial_axes
from tftpu.interp.tpu.registry import int8

__all__ = ["FRACTION_BITS", "source_fixed", "resize"]

FRACTION_BITS = 10
_ONE = 1 << FRACTION_BITS


def _source_fraction(o: np.ndarray, in_len: int, out_len: int, coord_mode: str):
    """(numerator, denominator) of the exact source coordinate of output indices `o`."""
    if coord_mode in ("half_pixel", "pytorch_half_pixel"):
        if coord_mode == "pytorch_half_pixel" and out_len == 1:
            return np.zeros_like(o), 1
        return (2 * o + 1) * in_len - out_len, 2 * out_len
    if coord_mode == "align_corners":
        return (o * (in_len - 1), out_len - 1) if out_len > 1 else (np.zeros_like(o), 1)
    if coord_mode == "asymmetric":
        return o * in_len, out_len
    if coord_mode == "tf_half_pixel_for_nn":
        return (2 * o + 1) * in_len, 2 * out_len
    raise ValueError(f"INT8 Resize: unknown coord_mode {coord_mode!r}")


def source_fixed(out_len: int, in_len: int, coord_mode: str) -> np.ndarray:
    """Each output index's source coordinate in fixed point (`FRACTION_BITS`), clamped, int64."""
    num, den = _source_fraction(np.arange(out_len, dtype=np.int64), in_len, out_len, coord_mode)
    c = (2 * num * _ONE + den) // (2 * den)                # floor(c * 2**F + 1/2)
    return np.clip(c, 0, (in_len - 1) * _ONE)


def _linear_axis(t: np.ndarray, axis: int, out_len: int, coord_mode: str):
    """`t` interpolated along `axis` with weights scaled by 2**F, or None where the axis maps
    one to one (weights 2**F and 0: nothing to do)."""
    in_len = t.shape[axis]
    c = source_fixed(out_len, in_len, coord_mode)
    if out_len == in_len and np.array_equal(c, np.arange(in_len, dtype=np.int64) * _ONE):
        return None
    i0 = c >> FRACTION_BITS
    i1 = np.minimum(i0 + 1, in_len - 1)
    w1 = (c & (_ONE - 1)).astype(t.dtype)
    shape = [1] * t.ndim
    shape[axis] = out_len
    w1 = w1.reshape(shape)
    lo, hi = np.take(t, i0, axis=axis), np.take(t, i1, axis=axis)
    return lo * (_ONE - w1) + hi * w1


def _same_grid(info) -> None:
    i, o = info.ins[0], info.outs[0]
    if i.scales != o.scales or i.zero_points != o.zero_points or i.dtype != o.dtype:
        raise ValueError("INT8 Resize keeps its input's grid: its output type must equal its input's")


@int8("tpu.Resize")
def resize(operands, attrs, info):
    _same_grid(info)
    x = operands[0]
    if attrs["mode"] == "nearest":
        return [np.asarray(KERNELS["top.Resize"]([x], attrs)[0])]
    if attrs["mode"] != "linear":
        raise ValueError(f"INT8 Resize: mode {attrs['mode']!r} has no integer rule")
    axes = spatial_axes(x.ndim, attrs)
    bits = 8 * x.dtype.itemsize + 1                 # |x - zp| < 2**bits: 9 for int8 / uint8, 17 for a 16-bit link
    if len(axes) * FRACTION_BITS + bits > 63:
        raise ValueError(f"INT8 linear Resize of {len(axes)} axes: its sums would overflow int64")
    # two axes of 10 bits on 8-bit data stay under 2**29 (int32); wider sums take int64
    dtype = np.int32 if len(axes) * FRACTION_BITS + bits <= 31 else np.int64
    t = x.astype(dtype) - dtype(info.ins[0].zp)
    shift = 0
    for ax, n in zip(axes, attrs["target_shape"]):
        r = _linear_axis(t, ax, int(n), attrs["coord_mode"])
        if r is not None:
            t, shift = r, shift + FRACTION_BITS
    if shift:
        t = (t + dtype(1 << (shift - 1)) - (t < 0)) >> shift      # half away from zero
    out = info.outs[0]
    return [np.clip(t + out.zp, out.qmin, out.qmax).astype(x.dtype)]

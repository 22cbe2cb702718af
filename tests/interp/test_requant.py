"""The fast requantization (`tftpu.interp.tpu.requant`) equals TFLite's
MultiplyByQuantizedMultiplier + zero point + clamp, computed with Python integers
(`tests/interp/int8_reference.py`), at the extremes: INT32_MIN/MAX and beyond (saturated),
right shifts 0..31 and left shifts 1..31, multipliers 0..2**31-1, per channel or one, with and
without a fused ReLU."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.interp import int8_reference as R
from tftpu.interp.tpu import requant
from tftpu.interp.tpu.requant import Requant

I32 = [R.INT32_MIN, R.INT32_MIN + 1, -(1 << 30), -(1 << 30) - 1, -3, -2, -1, 0, 1, 2, 3, 1 << 30,
       R.INT32_MAX - 1, R.INT32_MAX]
MULTS = [0, 1, 3, (1 << 30) - 1, 1 << 30, (1 << 30) + 1, 3 << 29, R.INT32_MAX - 1, R.INT32_MAX]


def expected(acc, ms, rs, lo, hi, zp, dtype):
    ms, rs = list(ms), list(rs)
    out = np.empty(acc.shape, np.int64)
    for idx in np.ndindex(acc.shape):
        c = idx[1] if len(ms) > 1 else 0
        y = R.mbqm(R.sat32(int(acc[idx])), ms[c], -rs[c]) + zp
        out[idx] = max(lo, min(hi, y))
    return out.astype(dtype)


def check(acc, ms, rs, lo=-128, hi=127, zp=0, dtype=np.int8, saturated=False):
    plan = Requant(ms, rs, acc.ndim, 1, lo, hi, zp, dtype)
    want = expected(acc, ms, rs, lo, hi, zp, dtype)
    for slab_min in (requant.SLAB_MIN, 1):          # in one piece, and cut into slabs on threads
        with slabs_from(slab_min):
            got = plan(acc.astype(np.int64), saturated=saturated)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, want)
    # within int32 (the reference saturates first, so the same result)
    inside = np.clip(acc, R.INT32_MIN, R.INT32_MAX)
    np.testing.assert_array_equal(plan(inside.astype(np.int64), saturated=True), want)
    np.testing.assert_array_equal(plan(inside.astype(np.int32), saturated=True), want)
    if not saturated and acc.min() >= -(1 << 24) and acc.max() <= 1 << 24:
        np.testing.assert_array_equal(plan(acc.astype(np.float32), saturated=True), want)   # float sums


@contextlib.contextmanager
def slabs_from(n: int):
    old, requant.SLAB_MIN = requant.SLAB_MIN, n
    try:
        yield
    finally:
        requant.SLAB_MIN = old


def _accs(rng, n, extra=()):
    """Accumulators: the int32 extremes and ties, beyond int32 (saturated), random ones."""
    vals = np.array(I32 + list(extra) + [R.INT32_MIN - 5, R.INT32_MAX + 7, -(1 << 40), 1 << 40], np.int64)
    rand = rng.integers(R.INT32_MIN, R.INT32_MAX, n, dtype=np.int64, endpoint=True)
    small = rng.integers(-(1 << 16), 1 << 16, n, dtype=np.int64)
    return np.concatenate([vals, rand, small])


@pytest.mark.parametrize("r", list(range(32)))
def test_every_right_shift_at_the_extremes(r):
    rng = np.random.default_rng(r)
    # values landing on ties of both roundings, both signs
    ties = [s * ((2 * k + 1) << max(r - 1, 0) << 31) // (1 << 30) for k in range(3) for s in (1, -1)]
    acc = _accs(rng, 64, ties)
    for m in MULTS:
        for lo, hi, zp in ((-128, 127, 0), (0, 127, 0), (-128, 127, -7), (-7, 127, -7), (3, 100, 3), (0, 255, 128)):
            dtype = np.uint8 if hi == 255 else np.int8
            check(acc.reshape(1, 1, -1), [m], [r], lo, hi, zp, dtype)


@pytest.mark.parametrize("left", list(range(1, 32)))
def test_every_left_shift_at_the_extremes(left):
    # a requantization scale above 1 (a 16-bit link's fine grid): the saturated accumulator
    # shifted left and saturated again, then the high multiply
    rng = np.random.default_rng(100 + left)
    edges = [s * (1 << (31 - left)) + d for s in (1, -1) for d in (-1, 0, 1)]      # where the shift saturates
    acc = _accs(rng, 64, edges)
    for m in MULTS:
        for lo, hi, zp in ((-128, 127, 0), (0, 127, 0), (-7, 127, -7), (-32768, 32767, 5), (0, 255, 128)):
            dtype = np.uint8 if hi == 255 else np.int16 if hi == 32767 else np.int8
            check(acc.reshape(1, 1, -1), [m], [-left], lo, hi, zp, dtype)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.data())
def test_per_channel_parameters(data):
    d = data.draw
    c = d(st.integers(1, 5))
    ms = [d(st.sampled_from(MULTS) | st.integers(0, R.INT32_MAX)) for _ in range(c)]
    rs = [d(st.integers(-31, 31)) for _ in range(c)]          # (negative: a left shift)
    zp = d(st.integers(-128, 127))
    relu = d(st.booleans())
    lo, hi = (max(-128, zp) if relu else -128), d(st.integers(max(-128, zp), 127))
    rng = np.random.default_rng(d(st.integers(0, 2 ** 16)))
    acc = rng.choice(_accs(rng, 32), size=(2, c, 3, 5))
    check(acc, ms, rs, lo, hi, zp)
    inside = np.clip(acc, R.INT32_MIN, R.INT32_MAX)
    check(inside, ms, rs, lo, hi, zp, saturated=True)


def test_output_types_and_zero_points_outside_them():
    rng = np.random.default_rng(3)
    acc = _accs(rng, 32).reshape(1, 1, -1)
    check(acc, [1 << 30], [0], -32768, 32767, 5, np.int16)
    check(acc, [R.INT32_MAX], [31], R.INT32_MIN, R.INT32_MAX, 0, np.int32)
    check(acc, [3 << 29], [4], 0, 255, 128, np.uint8)
    check(acc, [3 << 29], [4], 0, 127, -20, np.int8)       # zero point below the clamp


def test_fast_path_declines_what_it_does_not_cover():
    assert Requant.applies([1 << 30], [0]) and Requant.applies([0, R.INT32_MAX], [31, 0])
    assert Requant.applies([1 << 30], [-1]) and Requant.applies([1 << 30, 3], [-31, 31])   # left shifts too
    assert not Requant.applies([1 << 30], [32]) and not Requant.applies([1 << 30], [-32])
    assert not Requant.applies([-1], [3]) and not Requant.applies([1 << 31], [3])
    assert not Requant.applies([], [])


@pytest.mark.parametrize("r", [0, 1, 2, 7, 15, 30, 31])
def test_add_sub_int32_path_at_the_extremes(r):
    """INT8 Add/Sub computed in int32 (int16 multipliers, |x - zp| <= 255) equals TPU-MLIR's
    rule in Python integers: extreme multipliers and zero points, pairs of extreme and random
    inputs, with and without a fused ReLU."""
    from tftpu.interp.tpu import int8_kernels as K
    from tftpu.interp.tpu.info import OpInfo, TensorInfo

    v = np.concatenate([[-128, -127, -2, -1, 0, 1, 2, 126, 127], np.random.default_rng(r).integers(-128, 128, 23)])
    a, b = np.meshgrid(v, v)
    a, b = a.astype(np.int8), b.astype(np.int8)
    for m0, m1 in ((32767, -32768), (-32768, -32768), (32767, 32767), (1, -1), (12345, 0)):
        for z0, z1, zo in ((0, 0, 0), (-128, 127, 127), (127, -128, -128)):
            for relu in (False, True):
                for op in ("tpu.Add", "tpu.Sub"):
                    attrs = {"do_relu": relu, "relu_limit": -1.0, "multiplier": [m0, m1], "rshift": [r]}
                    ins = (TensorInfo("i8", (0.1,), (z0,)), TensorInfo("i8", (0.1,), (z1,)))
                    out = TensorInfo("i8", (0.5,), (zo,))
                    want, _ = R.reference_of(op, attrs, [R.Info("i8", (0.1,), (z0,)), R.Info("i8", (0.1,), (z1,))],
                                             R.Info("i8", (0.5,), (zo,)), [a, b], check_params=False)
                    for slab_min in (requant.SLAB_MIN, 1):
                        with slabs_from(slab_min):
                            got = (K.add if op == "tpu.Add" else K.sub)([a, b], attrs, OpInfo(ins, (out,)))[0]
                        np.testing.assert_array_equal(got, want)
                    # broadcast operands (one piece)
                    got = (K.add if op == "tpu.Add" else K.sub)([a, b[:1]], attrs, OpInfo(ins, (out,)))[0]
                    want, _ = R.reference_of(op, attrs, [R.Info("i8", (0.1,), (z0,)), R.Info("i8", (0.1,), (z1,))],
                                             R.Info("i8", (0.5,), (zo,)), [a, b[:1]], check_params=False)
                    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("c,k,group,stride,dil", [(32, 3, 32, 2, 1), (16, 3, 4, 1, 2), (24, 5, 24, 1, 1),
                                                  (8, 3, 8, 1, 1)])
def test_float32_conv_path_equals_float64_path_at_extremes(c, k, group, stride, dil):
    """onnxruntime's float32 Conv gives the exact integer sums (plus bias) wherever
    255 * sum|w| + |b| < 2**24, with saturated inputs and extreme zero points; above the
    bound it declines."""
    from tftpu.interp.tpu.int8_kernels import conv_accumulate, conv_f32

    rng = np.random.default_rng(c * k + group)
    o = 2 * group
    x = rng.choice(np.array([-128, 127, 0, -1, 1], np.int8), size=(1, c, 11, 13)).astype(np.int8)
    w = rng.choice(np.array([-127, 127, 0, 5], np.int8), size=(o, c // group, k, k)).astype(np.int8)
    w[0] = -127                                          # one channel at its largest sum
    b = rng.integers(-(1 << 22), 1 << 22, o).astype(np.int32)
    attrs = {"strides": [stride] * 2, "pads": [1, 2, 0, 1], "dilations": [dil] * 2, "group": group,
             "layout": "NCHW", "kernel_layout": "OIHW"}
    for zp in (-128, 0, 127):
        got = conv_f32(x, zp, w, b, attrs)
        want = conv_accumulate(x.astype(np.float64) - zp, w, attrs) + b.reshape(1, -1, 1, 1)
        assert got is not None and got.dtype == np.float32
        np.testing.assert_array_equal(got.astype(np.float64), want)
    big = np.full_like(b, (1 << 24) - 100)
    assert conv_f32(x, 0, w, big, attrs) is None


@pytest.mark.parametrize("k,rt", [(1, False), (300, True), (2048, False), (33025, False)])
def test_matmul_integer_path_equals_python_integers(k, rt):
    """onnxruntime's MatMulInteger (uint8 offset by 128) gives the exact integer products with
    saturated operands and extreme zero points; a reduction that could overflow int32 declines."""
    from tftpu.interp.tpu.int8_kernels import matmul_integer

    rng = np.random.default_rng(k)
    x = rng.choice(np.array([-128, 127, 0, -1], np.int8), size=(2, k)).astype(np.int8)
    w = rng.choice(np.array([-128, 127, 0, 3], np.int8), size=(k, 5)).astype(np.int8)
    for zx, zw in ((0, 0), (-128, 127), (127, -128)):
        got = matmul_integer(x, zx, np.ascontiguousarray(w.T) if rt else w, zw, rt)
        want = (x.astype(np.int64) - zx) @ (w.astype(np.int64) - zw)
        assert got is not None and got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
    assert matmul_integer(np.zeros((1, 33026), np.int8), 0, np.zeros((33026, 2), np.int8), 0, False) is None

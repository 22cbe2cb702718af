"""The integer rounding rules, bit-exact against an independent Python-integer reference of
gemmlowp / TFLite's formulas, and within one unit of the exact rational result."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tftpu.errors import UsageError
from tftpu import rounding as R

I32 = st.integers(R.INT32_MIN, R.INT32_MAX)


def ref_srdhm(a: int, b: int) -> int:
    if a == b == R.INT32_MIN:
        return R.INT32_MAX
    ab = a * b
    t = ab + ((1 << 30) if ab >= 0 else 1 - (1 << 30))
    return t // (1 << 31) if t >= 0 else -((-t) // (1 << 31))      # C++: truncate toward zero


def ref_rdbpot(x: int, e: int) -> int:
    mask = (1 << e) - 1
    rem, threshold = x & mask, (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if rem > threshold else 0)


def ref_mbqm(x: int, m: int, shift: int) -> int:
    a = min(max(x * (1 << max(shift, 0)), R.INT32_MIN), R.INT32_MAX)
    return ref_rdbpot(ref_srdhm(a, m), max(-shift, 0))


@settings(max_examples=400, deadline=None)
@given(st.lists(I32, min_size=1, max_size=16), st.floats(1e-6, 4.0))
def test_multiply_by_quantized_multiplier_is_bit_exact(xs, real):
    m, shift = R.quantize_multiplier(real)
    got = R.multiply_by_quantized_multiplier(np.array(xs, np.int32), m, shift)
    assert got.dtype == np.int32
    assert got.tolist() == [ref_mbqm(x, m, shift) for x in xs]


@settings(max_examples=400, deadline=None)
@given(st.integers(-(1 << 24), 1 << 24), st.floats(1e-4, 1.0))
def test_requantized_value_is_within_one_of_the_exact_one(x, real):
    m, shift = R.quantize_multiplier(real)
    exact = Fraction(x) * Fraction(m) * Fraction(2) ** (shift - 31)
    assert abs(int(R.multiply_by_quantized_multiplier(np.int32(x), m, shift)) - exact) <= 1


@settings(max_examples=300, deadline=None)
@given(st.floats(1e-9, 1e9))
def test_quantize_multiplier_is_tflites(real):
    m, shift = R.quantize_multiplier(real)
    if m == 0:
        assert real < 2.0 ** -31
        return
    assert (1 << 30) <= m < (1 << 31)
    assert abs(Fraction(m) * Fraction(2) ** (shift - 31) - Fraction(real)) <= Fraction(2) ** (shift - 32)


EDGES = [0.0, 0.5, 1.0, 0.75, 1 - 2 ** -40, 2.0 ** -31, 2.0 ** -31.5, 2.0 ** -32, 2.0 ** -33, 5e-324,
         2.0 ** 30 - 1, np.nextafter(2.0 ** 30, 0), 2.0 ** 30, 3.0, float("nan"), float("inf"), -1e-300]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 2 ** 31, allow_nan=False), st.sampled_from(EDGES),
                          st.floats(-45, 31).map(lambda e: 2.0 ** e)), min_size=1, max_size=24))
def test_quantize_multipliers_are_each_scales_own(reals):
    """The lowering's per-channel form gives each scale's integers, or the scalar form's error."""
    try:
        want = [R.quantize_multiplier(float(r)) for r in reals]
    except UsageError as e:
        with pytest.raises(UsageError) as got:
            R.quantize_multipliers(reals)
        bad = next(r for r in reals if _message(r) is not None)       # the first scale that fails
        assert str(got.value) == str(e) == _message(bad)
        return
    ms, shifts = R.quantize_multipliers(reals)
    assert list(zip(ms.tolist(), shifts.tolist())) == want


def _message(real):
    try:
        R.quantize_multiplier(float(real))
    except UsageError as e:
        return str(e)
    return None


def test_ties_as_gemmlowp_rounds_them():
    m, shift = R.quantize_multiplier(0.5)         # the high multiply alone: ties go up
    assert R.multiply_by_quantized_multiplier(np.array([7, -7, 5, -5, 1, -1], np.int32), m, shift).tolist() == \
        [4, -3, 3, -2, 1, 0]
    m, shift = R.quantize_multiplier(0.25)        # then the rounding shift: ties away from zero
    assert (m, shift) == (1 << 30, -1)
    assert R.multiply_by_quantized_multiplier(np.array([6, -6, -2], np.int32), m, shift).tolist() == [2, -2, -1]
    assert R.round_half_away([0.5, 1.5, -0.5, -2.5]).tolist() == [1, 2, -1, -3]
    assert R.round_half_even([0.5, 1.5, -0.5, -2.5]).tolist() == [0, 2, -0, -2]


def test_requantize_saturates_and_adds_the_zero_point():
    m, shift = R.quantize_multiplier(1.0)
    assert R.requantize(np.array([1000, -1000, 5], np.int32), m, shift, zero_point=3).tolist() == [127, -128, 8]


def test_quantize_and_half_precision_rounding():
    assert R.quantize([0.25, -0.25, 10.0], 0.5, dtype=np.int8).tolist() == [1, -1, 20]
    assert R.quantize([1000.0], 0.5, dtype=np.int8).tolist() == [127]
    x = np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8], np.float32)       # halfway between bf16 neighbours
    assert R.to_bf16(x).astype(np.float32).tolist() == [1.0, 1.0 + 2 ** -6]
    assert R.to_bf16(x).dtype == np.dtype(ml_dtypes.bfloat16)
    assert R.to_f16(np.float32(1.0 + 2 ** -11)).astype(np.float32) == 1.0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 2.0 ** 31])
def test_bad_scales_are_refused(bad):
    with pytest.raises(UsageError):
        R.quantize_multiplier(bad)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(I32, min_size=1, max_size=32), st.integers(0, 31))
def test_rounding_divide_by_pot_fast_form_is_gemmlowps(xs, e):
    got = R.rounding_divide_by_pot(np.array(xs, np.int64), e)
    assert [int(v) for v in got] == [ref_rdbpot(x, e) for x in xs]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(I32, min_size=1, max_size=16), st.lists(st.integers(0, R.INT32_MAX), min_size=1, max_size=16),
       st.lists(st.integers(-31, 30), min_size=1, max_size=16))
def test_fused_requantization_matches_the_definitions_per_channel(xs, ms, shifts):
    """The few-pass form of MultiplyByQuantizedMultiplier, with per-element multipliers and
    shifts, equals the definitions (high multiply, then the rounding shift) everywhere."""
    n = min(len(xs), len(ms), len(shifts))
    xs, ms, shifts = xs[:n], ms[:n], shifts[:n]
    got = R.multiply_by_quantized_multiplier(np.array(xs), np.array(ms), np.array(shifts))
    assert [int(v) for v in got] == [ref_mbqm(x, m, s) for x, m, s in zip(xs, ms, shifts)]
    assert int(R.multiply_by_quantized_multiplier(np.array([R.INT32_MIN]), R.INT32_MIN, 0)[0]) == \
        ref_mbqm(R.INT32_MIN, R.INT32_MIN, 0)

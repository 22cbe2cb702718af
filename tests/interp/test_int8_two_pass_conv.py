"""An INT8 conv over 16-bit data (a conv reading a 16-bit link: depthwise, or dense) runs as two
INT8 passes over the high and low byte: its sums equal the exact integer conv of the 16-bit values,
past int32 where the contraction is long."""

import numpy as np
from hypothesis import given, settings, strategies as st

from tftpu.interp.tpu import int8_kernels as K


@settings(max_examples=40, deadline=None)
@given(channels=st.integers(1, 8), multiplier=st.sampled_from([1, 2]), kernel=st.sampled_from([1, 3, 5, 7]),
       stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]), pad=st.integers(0, 3),
       zero_point=st.sampled_from([0, -300, 77, 32767]), nhwc=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_two_passes_equal_the_16_bit_conv(channels, multiplier, kernel, stride, dilation, pad, zero_point, nhwc, seed):
    rng = np.random.default_rng(seed)
    side = kernel * dilation + int(rng.integers(0, 9))
    x = rng.integers(-32768, 32768, (2, channels, side, side + 1)).astype(np.int16)
    x[0, :, 0, 0] = -32768                                  # the extremes of both bytes
    x[0, :, 0, -1] = 32767
    w = rng.integers(-127, 128, (channels * multiplier, 1, kernel, kernel)).astype(np.int8)
    attrs = {"strides": [stride, stride], "pads": [pad] * 4, "dilations": [dilation, dilation], "group": channels,
             "kernel_layout": "OIHW", "layout": "NCHW"}
    _check(x, zero_point, w, attrs, nhwc)


@settings(max_examples=30, deadline=None)
@given(cin=st.sampled_from([1, 3, 16, 300]), cout=st.integers(1, 6), kernel=st.sampled_from([1, 3, 5]),
       stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]), pad=st.integers(0, 2),
       groups=st.sampled_from([1, 3]), zero_point=st.sampled_from([0, -300, 32767]), nhwc=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_two_passes_of_a_dense_conv(cin, cout, kernel, stride, dilation, pad, groups, zero_point, nhwc, seed):
    rng = np.random.default_rng(seed)
    cin, cout = cin * groups, cout * groups
    side = kernel * dilation + int(rng.integers(0, 5))
    x = rng.integers(-32768, 32768, (1, cin, side, side + 2)).astype(np.int16)
    x[0, :, 0, 0] = 32767
    w = rng.integers(-127, 128, (cout, cin // groups, kernel, kernel)).astype(np.int8)
    w[0] = 127                  # every term at its largest: the sum runs past int32 for a long contraction
    attrs = {"strides": [stride, stride], "pads": [pad] * 4, "dilations": [dilation, dilation], "group": groups,
             "kernel_layout": "OIHW", "layout": "NCHW"}
    _check(x, zero_point, w, attrs, nhwc)


def _check(x, zero_point: int, w, attrs: dict, nhwc: bool) -> None:
    """The two passes' sums (NCHW data, or its NHWC transpose) equal the exact float64 conv."""
    want = np.rint(K.conv_accumulate(x.astype(np.float64) - zero_point, w, attrs)).astype(np.int64)
    if nhwc:
        got = K._two_passes(x.transpose(0, 2, 3, 1), zero_point, w, attrs, True).transpose(0, 3, 1, 2)
    else:
        got = K._two_passes(x, zero_point, w, attrs, False)
    assert got.dtype == np.int64 and np.array_equal(got, want)
